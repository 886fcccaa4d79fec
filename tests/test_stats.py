import numpy as np
import pytest

from fedpipe.data.partition import Partition
from fedpipe.data.stats import (
    class_counts,
    effective_classes,
    emd_to_global,
    gini,
    partition_statistics,
)


def small() -> tuple[Partition, np.ndarray]:
    # labels: 0 0 0 1 ; client 0 gets {0,1} (two 0s), client 1 gets {2,3} (a 0 and a 1)
    y = np.array([0, 0, 0, 1])
    part = Partition([np.array([0, 1]), np.array([2, 3])], [np.array([0]), np.array([1, 2])],
                     {"feature_skew": {"kind": "none", "per_client": []}})
    return part, y


def test_statistics_hand_computed():
    part, y = small()
    counts = class_counts(part, y, 2)
    assert counts.tolist() == [[2, 0], [1, 1]]
    # global q = (3/4, 1/4); client 0 p = (1, 0): |1-.75| + |0-.25| = 0.5
    # client 1 p = (.5, .5): .25 + .25 = 0.5
    assert emd_to_global(counts, np.array([3, 1])).tolist() == pytest.approx([0.5, 0.5])
    assert effective_classes(counts).tolist() == pytest.approx([1.0, 2.0])
    s = partition_statistics(part, y, 2)["summary"]
    assert s["size_gini"] == 0.0 and s["samples_assigned"] == 4
    assert s["classes_per_client_mean"] == 1.5 and s["local_test_size_mean"] == 1.5


def test_gini_hand_computed():
    # sizes 1, 3: sum_ij |xi - xj| = 4; 2 n^2 mean = 2 * 4 * 2 = 16 -> 0.25
    assert gini(np.array([1, 3])) == pytest.approx(0.25)
    assert gini(np.array([5, 5, 5])) == 0.0
    # one client holds everything among 4: sum = 2*3*8 = 48, 2*16*2 = 64 -> 0.75 = (n-1)/n
    assert gini(np.array([0, 0, 0, 8])) == pytest.approx(0.75)


def test_effective_classes_uniform_equals_class_count():
    counts = np.array([[5, 5, 5, 5], [10, 0, 0, 0]])
    assert effective_classes(counts).tolist() == pytest.approx([4.0, 1.0])
