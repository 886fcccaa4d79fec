"""Property tests of the partitioners (hypothesis over sizes, client counts and seeds)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fedpipe.config import ConfigError, partition_config
from fedpipe.data.partition import (
    Partition,
    apportion,
    label_block_groups,
    make_partition,
    pathological_classes,
)
from fedpipe.rng import numpy_rng

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def labels_for(seed: int, n: int, c: int) -> np.ndarray:
    """n labels over c classes, every class present."""
    r = numpy_rng(seed, "test-labels")
    y = np.concatenate([np.arange(c), r.integers(0, c, size=n - c)])
    return r.permutation(y)


def run(scheme_params: dict, n: int, c: int, seed: int, n_test: int = 60) -> tuple:
    cfg = partition_config(scheme_params)
    y = labels_for(seed + 1000, n, c)
    y_test = labels_for(seed + 2000, n_test, c)
    return make_partition(y, y_test, c, cfg, seed), y, y_test, cfg


def assert_disjoint_cover(part: Partition, expected: np.ndarray) -> None:
    allidx = np.concatenate(part.train)
    assert len(allidx) == len(np.unique(allidx)), "client index sets overlap"
    assert np.array_equal(np.sort(allidx), np.sort(expected))


def assert_same(p: Partition, q: Partition) -> None:
    assert all(np.array_equal(a, b) for a, b in zip(p.train, q.train, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(p.test, q.test, strict=True))


def differs(p: Partition, q: Partition) -> bool:
    return any(not np.array_equal(a, b) for a, b in zip(p.train, q.train, strict=True))


common = dict(n=st.integers(60, 400), c=st.integers(2, 10), seed=st.integers(0, 2**31 - 1))


@SETTINGS
@given(n_clients=st.integers(1, 20), sigma=st.sampled_from([0.0, 0.5, 1.5]), **common)
def test_iid_disjoint_cover_deterministic(n_clients, sigma, n, c, seed):
    params = {"scheme": "iid", "num_clients": n_clients, "quantity_skew_sigma": sigma,
              "min_size": 0}
    part, y, _, _ = run(params, n, c, seed)
    assert_disjoint_cover(part, np.arange(n))
    assert_same(part, run(params, n, c, seed)[0])
    if sigma == 0:
        assert part.sizes().max() - part.sizes().min() <= 1
    if n_clients > 1:
        assert differs(part, run(params, n, c, seed + 1)[0])


@SETTINGS
@given(n_clients=st.integers(1, 12), alpha=st.sampled_from([0.05, 0.3, 1.0, 100.0]),
       min_size=st.integers(0, 5), **common)
def test_dirichlet_properties(n_clients, alpha, min_size, n, c, seed):
    params = {"scheme": "dirichlet", "num_clients": n_clients, "alpha": alpha,
              "min_size": min_size, "max_retries": 1000}
    try:
        part, y, _, _ = run(params, n, c, seed)
    except ConfigError as e:  # allowed only as the documented min_size failure
        assert e.key == "partition.min_size"
        assume(False)
    assert_disjoint_cover(part, np.arange(n))
    assert part.sizes().min() >= min_size
    assert_same(part, run(params, n, c, seed)[0])


def test_dirichlet_seed_changes_partition():
    params = {"scheme": "dirichlet", "num_clients": 5, "alpha": 0.5}
    a, b = run(params, 300, 10, 1)[0], run(params, 300, 10, 2)[0]
    assert differs(a, b)


def test_dirichlet_retry_cap_gives_clear_error():
    params = {"scheme": "dirichlet", "num_clients": 20, "alpha": 0.01, "min_size": 14,
              "max_retries": 3}
    with pytest.raises(ConfigError, match=r"partition\.min_size=14.*3 draws of Dir\(0\.01\)"):
        run(params, 300, 10, 0)


def test_dirichlet_small_alpha_is_more_skewed():
    from fedpipe.data.stats import partition_statistics

    emd = {}
    for alpha in (0.05, 100.0):
        part, y, _, _ = run({"scheme": "dirichlet", "num_clients": 10, "alpha": alpha},
                            2000, 10, 0)
        emd[alpha] = partition_statistics(part, y, 10)["summary"]["emd_mean"]
    assert emd[0.05] > 1.0 > 0.3 > emd[100.0]


@SETTINGS
@given(n_clients=st.integers(1, 15), s=st.integers(1, 3), seed=st.integers(0, 10**6),
       c=st.integers(2, 10), per_class=st.integers(4, 30))
def test_shards_each_client_gets_its_shards(n_clients, s, seed, c, per_class):
    n = c * per_class
    assume(n_clients * s <= n)
    params = {"scheme": "shards", "num_clients": n_clients, "shards_per_client": s}
    part, y, _, _ = run(params, n, c, seed)
    assert_disjoint_cover(part, np.arange(n))
    sizes = part.sizes()
    assert sizes.max() - sizes.min() <= s  # equal shards up to one sample each
    assert_same(part, run(params, n, c, seed)[0])


def test_shards_classes_per_client_when_shards_align_with_classes():
    # 10 classes x 30 samples, 10 clients x 2 shards of 15: a shard never straddles two classes.
    y = np.repeat(np.arange(10), 30)
    cfg = partition_config({"scheme": "shards", "num_clients": 10, "shards_per_client": 2})
    for seed in range(5):
        part = make_partition(y, y, 10, cfg, seed)
        for idx in part.train:
            assert len(idx) == 30
            assert len(np.unique(y[idx])) <= 2
            # each shard is half a class: a client's count of each of its classes is 15 or 30
            assert set(np.bincount(y[idx])[np.bincount(y[idx]) > 0]) <= {15, 30}


@SETTINGS
@given(n_clients=st.integers(1, 12), k=st.integers(1, 4), **common)
def test_pathological_k_classes(n_clients, k, n, c, seed):
    assume(k <= c)
    params = {"scheme": "pathological", "num_clients": n_clients, "classes_per_client": k}
    part, y, _, cfg = run(params, n, c, seed)
    owned = pathological_classes(cfg, c, numpy_rng(seed, "partition"))
    covered = set().union(*map(set, owned))
    assert_disjoint_cover(part, np.flatnonzero(np.isin(y, sorted(covered))))
    for idx, classes in zip(part.train, owned, strict=True):
        assert len(classes) == k
        assert set(np.unique(y[idx])) <= set(classes)
    if n_clients * k >= c:
        assert covered == set(range(c))


@SETTINGS
@given(groups=st.lists(st.integers(1, 4), min_size=1, max_size=4), seed=st.integers(0, 10**6),
       per_class=st.integers(8, 20))
def test_label_blocks_groups_own_disjoint_class_blocks(groups, seed, per_class):
    blocks = [g % 3 + 1 for g in range(len(groups))]
    c = sum(blocks) + 1  # one class left unowned
    y = np.repeat(np.arange(c), per_class)
    params = {"scheme": "label_blocks", "num_clients": sum(groups), "groups": groups,
              "blocks": blocks, "min_size": 0}
    cfg = partition_config(params)
    part = make_partition(y, y, c, cfg, seed)
    group_of, classes = label_block_groups(cfg)
    assert part.meta["groups"] == group_of
    assert_disjoint_cover(part, np.flatnonzero(y < sum(blocks)))
    for i, idx in enumerate(part.train):
        assert set(np.unique(y[idx])) <= set(classes[group_of[i]])
        # local test follows the client's labels
        assert set(np.unique(y[part.test[i]])) <= set(classes[group_of[i]])


def test_label_blocks_table1_mnist_layout():
    # Equitable-FL Table 1 MNIST: clients 0-3 own classes 0-3, clients 4-9 own classes 4-9,
    # 800 samples per class per client (scaled down to 8 here).
    y = np.repeat(np.arange(10), 60)
    cfg = partition_config({"scheme": "label_blocks", "num_clients": 10, "groups": [4, 6],
                            "blocks": [4, 6], "per_class_per_client": 8})
    part = make_partition(y, y, 10, cfg, 0)
    for i, idx in enumerate(part.train):
        counts = np.bincount(y[idx], minlength=10)
        expected = np.zeros(10, int)
        expected[0:4] = 8 if i < 4 else 0
        expected[4:10] = 8 if i >= 4 else 0
        assert np.array_equal(counts, expected)
    allidx = np.concatenate(part.train)
    assert len(allidx) == len(np.unique(allidx))
    with pytest.raises(ConfigError, match="per_class_per_client=16"):
        bad = partition_config({"scheme": "label_blocks", "num_clients": 10, "groups": [4, 6],
                                "blocks": [4, 6], "per_class_per_client": 16})
        make_partition(y, y, 10, bad, 0)


def test_quantity_skew_gives_unequal_sizes_with_same_labels():
    y = np.repeat(np.arange(10), 100)
    flat = make_partition(y, y, 10, partition_config({"scheme": "iid", "num_clients": 10}), 0)
    skew = make_partition(y, y, 10, partition_config(
        {"scheme": "iid", "num_clients": 10, "quantity_skew_sigma": 1.0}), 0)
    from fedpipe.data.stats import gini

    assert gini(flat.sizes()) < 0.01 < 0.2 < gini(skew.sizes())
    w = np.array(skew.meta["client_weights"])
    assert np.array_equal(skew.sizes(), apportion(1000, w))


def test_local_test_follows_client_distribution():
    y = np.repeat(np.arange(4), 100)
    y_test = np.repeat(np.arange(4), 50)
    cfg = partition_config({"scheme": "pathological", "num_clients": 4, "classes_per_client": 1,
                            "local_test_size": 20})
    part = make_partition(y, y_test, 4, cfg, 0)
    for tr, te in zip(part.train, part.test, strict=True):
        assert len(te) == 20 and len(np.unique(te)) == 20
        assert set(y_test[te]) == set(y[tr])
    # proportional default: 200 test samples, each client a quarter of the train set -> 50
    cfg2 = partition_config({"scheme": "iid", "num_clients": 4})
    part2 = make_partition(y, y_test, 4, cfg2, 0)
    assert [len(t) for t in part2.test] == [50, 50, 50, 50]


def test_local_test_classes_is_every_test_image_of_the_clients_classes():
    # label blocks: clients 0-1 own classes 0-1, clients 2-4 own classes 2-4 (Equitable-FL's groups)
    y = np.repeat(np.arange(5), 60)
    y_test = np.repeat(np.arange(5), 30)
    cfg = partition_config({"scheme": "label_blocks", "num_clients": 5, "groups": [2, 3],
                            "blocks": [2, 3], "local_test": "classes"})
    part = make_partition(y, y_test, 5, cfg, 0)
    small = np.flatnonzero(y_test < 2)
    large = np.flatnonzero(y_test >= 2)
    for i, te in enumerate(part.test):
        assert np.array_equal(te, small if i < 2 else large)  # the group's classes, every image
    assert part.meta["params"]["local_test"] == "classes"
    drawn = make_partition(y, y_test, 5, partition_config(
        {"scheme": "label_blocks", "num_clients": 5, "groups": [2, 3], "blocks": [2, 3]}), 0)
    assert [len(t) for t in drawn.test] == [30] * 5  # the proportional share: 150 / 5 each
    with pytest.raises(ConfigError, match="local_test_size"):
        partition_config({"scheme": "iid", "local_test": "classes", "local_test_size": 10})
    with pytest.raises(ConfigError, match="partition.local_test"):
        partition_config({"scheme": "iid", "local_test": "all"})


def test_apportion_hand_computed():
    assert apportion(10, [1, 1, 1]).tolist() == [4, 3, 3]
    # 3.5, 1.75, 1.75 -> floors 3, 1, 1; the two largest remainders (.75) get the 2 left
    assert apportion(7, [0.5, 0.25, 0.25]).tolist() == [3, 2, 2]
    assert apportion(5, [0, 0, 1]).tolist() == [0, 0, 5]
    assert apportion(0, [1, 2]).tolist() == [0, 0]


@SETTINGS
@given(total=st.integers(0, 10**6), w=st.lists(st.floats(0, 1e3), min_size=1, max_size=30))
def test_apportion_sums_and_is_close(total, w):
    out = apportion(total, w)
    assert out.sum() == total and (out >= 0).all()
    ww = np.asarray(w) if sum(w) > 0 else np.ones(len(w))
    assert np.all(np.abs(out - total * ww / ww.sum()) < 1 + 1e-9)


def test_save_load_round_trip(tmp_path):
    y = np.repeat(np.arange(5), 20)
    cfg = partition_config({"scheme": "dirichlet", "num_clients": 4, "alpha": 0.5,
                            "feature_skew": "rotation"})
    part = make_partition(y, y, 5, cfg, 7, "toy")
    part.save(tmp_path / "p.safetensors")
    back = Partition.load(tmp_path / "p.safetensors")
    assert_same(part, back)
    assert back.meta == part.meta
    assert back.meta["feature_skew"]["per_client"] == [0.0, 90.0, 180.0, 270.0]
    assert back.feature_skew(1) == ("rotation", 90.0)
