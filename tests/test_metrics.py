"""fedpipe.metrics accuracy, personalized (FedNH PM(V)/PM(L)) and fairness (Equitable-FL) metrics,
checked against numbers computed by hand.

The "models" are lookup tables: an input is a sample id (x[:, 0]) and the model returns the one-hot
logits of the class the table assigns to that id, so which sample is classified correctly is known by
construction.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedpipe.data import ClientData
from fedpipe.metrics import (
    class_weights,
    client_accuracy_summary,
    client_disagreement,
    clustering_nmi,
    fairness_summary,
    per_class_accuracy,
    per_client_accuracy,
    per_client_loss,
    pm_accuracy,
    pm_accuracy_of,
    sigma_acc,
    train_class_counts,
    weighted_client_accuracy,
)
from fedpipe.tasks import ClassificationTask

TASK = ClassificationTask()
C = 3


class Lookup(nn.Module):
    """Predicts ``table[id]`` for the sample whose id is x[:, 0] (one-hot logits over C classes)."""

    def __init__(self, table: list[int]) -> None:
        super().__init__()
        self.register_buffer("table", torch.tensor(table))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.one_hot(self.table[x[:, 0].long()], C).float()


def ids(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).reshape(-1, 1)


def labels(*values: int) -> torch.Tensor:
    return torch.tensor(values)


# --- per-client accuracy on local test splits: generic and personalized -------------------------

# ids 0..8; client 0 holds ids 0-3, client 1 ids 4-5, client 2 ids 6-8
TRUE = [0, 1, 2, 0, 1, 1, 2, 2, 0]
CLIENTS = [ClientData(ids(0, 1, 2, 3), labels(0, 1, 2, 0)),
           ClientData(ids(4, 5), labels(1, 1)),
           ClientData(ids(6, 7, 8), labels(2, 2, 0))]
# the global model gets ids 0, 1, 3 | 4 | 6, 8 right
GLOBAL = Lookup([0, 1, 0, 0, 1, 0, 2, 0, 0])


def test_generic_per_client_accuracy_with_one_model():
    acc = per_client_accuracy(GLOBAL, CLIENTS, TASK, seed=0)
    np.testing.assert_allclose(acc, [3 / 4, 1 / 2, 2 / 3])


def test_personalized_per_client_accuracy_with_a_list_and_a_none_entry():
    perfect, always0 = Lookup(TRUE), Lookup([0] * 9)
    acc = per_client_accuracy([perfect, None, always0], CLIENTS, TASK, seed=0)
    assert acc[0] == 1.0
    assert np.isnan(acc[1])
    assert acc[2] == pytest.approx(1 / 3)  # only id 8 (class 0) is right


def test_list_of_the_global_model_equals_generic_and_length_is_checked():
    np.testing.assert_array_equal(per_client_accuracy([GLOBAL] * 3, CLIENTS, TASK, 0),
                                  per_client_accuracy(GLOBAL, CLIENTS, TASK, 0))
    np.testing.assert_array_equal(per_client_accuracy(nn.ModuleList([GLOBAL] * 3), CLIENTS, TASK, 0),
                                  per_client_accuracy(GLOBAL, CLIENTS, TASK, 0))
    with pytest.raises(ValueError, match="2 personalized models for 3 clients"):
        per_client_accuracy([GLOBAL, GLOBAL], CLIENTS, TASK, 0)


def test_client_without_local_test_data_is_nan():
    clients = [*CLIENTS, ClientData(torch.zeros(0, 1), torch.zeros(0, dtype=torch.long))]
    acc = per_client_accuracy([GLOBAL, GLOBAL, GLOBAL, GLOBAL], clients, TASK, 0)
    assert np.isnan(acc[3]) and acc[0] == 0.75


def test_personal_and_generic_models_see_the_same_noisy_inputs():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, C))
    gen = torch.Generator().manual_seed(1)
    clients = [ClientData(torch.rand(50, 1, 4, 4, generator=gen), torch.randint(0, C, (50,), generator=gen),
                          ("noise", 0.3)) for _ in range(3)]
    generic = per_client_accuracy(model, clients, TASK, seed=7)
    np.testing.assert_array_equal(per_client_accuracy([model] * 3, clients, TASK, seed=7), generic)
    assert np.all((generic >= 0) & (generic <= 1))


def test_per_client_loss_by_hand():
    # one-hot logits: a right sample costs log(e + 2) - 1, a wrong one log(e + 2)
    loss = per_client_loss([GLOBAL, None, GLOBAL], CLIENTS, TASK, seed=0)
    base = math.log(math.e + 2)
    assert loss[0] == pytest.approx(base - 3 / 4)
    assert np.isnan(loss[1])
    assert loss[2] == pytest.approx(base - 2 / 3)


# --- summary -------------------------------------------------------------------------------------

def test_client_accuracy_summary_by_hand_and_keys_kept():
    s = client_accuracy_summary(np.array([0.5, np.nan, 0.9, 0.7, 0.3]))
    assert set(s) == {"client_acc_mean", "client_acc_std", "client_acc_worst10", "client_acc_best10",
                      "client_acc_min", "client_acc_max"}
    assert s["client_acc_mean"] == pytest.approx(0.6)
    assert s["client_acc_std"] == pytest.approx(math.sqrt((0.01 + 0.09 + 0.01 + 0.09) / 4))
    assert s["client_acc_worst10"] == pytest.approx(0.3)  # ceil(0.4) = 1 client
    assert s["client_acc_best10"] == pytest.approx(0.9)
    assert (s["client_acc_min"], s["client_acc_max"]) == (0.3, 0.9)


def test_tail_fraction_is_not_inflated_by_float_error():
    # 0.07 * 100 is 7.000000000000001 in floating point: the tails hold 7 clients, not 8
    s = client_accuracy_summary(np.arange(100) / 100, fraction=0.07)
    assert s["client_acc_worst10"] == pytest.approx(3 / 100)  # mean of 0..6
    assert s["client_acc_best10"] == pytest.approx(96 / 100)  # mean of 93..99
    # the default 10% of 30 clients: 3 each side
    s = client_accuracy_summary(np.arange(30) / 30)
    assert s["client_acc_worst10"] == pytest.approx(1 / 30)


# --- FedNH PM(V) / PM(L) -------------------------------------------------------------------------

# balanced global test set: ids 0..5, two samples per class
TEST_X, TEST_Y = ids(0, 1, 2, 3, 4, 5), labels(0, 0, 1, 1, 2, 2)
MODEL_A = Lookup([0, 0, 1, 0, 0, 1])  # per-class accuracy [1, 1/2, 0]
MODEL_B = Lookup([1, 1, 1, 1, 2, 2])  # per-class accuracy [0, 1, 1]
TRAIN_COUNTS = np.array([[6, 2, 0],   # client 0 owns classes 0, 1
                         [1, 1, 2],   # client 1 owns all three
                         [0, 0, 5]])  # client 2 owns class 2


def test_per_class_accuracy_by_hand():
    np.testing.assert_allclose(per_class_accuracy(MODEL_A, TEST_X, TEST_Y, C, TASK), [1, 0.5, 0])
    np.testing.assert_allclose(per_class_accuracy(MODEL_B, TEST_X, TEST_Y, C, TASK), [0, 1, 1])


def test_per_class_accuracy_absent_class_is_nan_and_labels_checked():
    acc = per_class_accuracy(MODEL_A, TEST_X[:4], TEST_Y[:4], C, TASK)
    np.testing.assert_allclose(acc[:2], [1, 0.5])
    assert np.isnan(acc[2])
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        per_class_accuracy(MODEL_A, TEST_X, TEST_Y, 2, TASK)


def test_aux_quality_scores_each_requested_class_as_the_metrics_do():
    """aux_quality's per-class accuracy of the generated set (with counts): the same numbers by hand."""
    from fedpipe.pipeline.aux_quality import per_class_accuracy as aux_per_class

    classifier = Lookup([0, 0, 1, 0, 0, 1])
    classifier.unused = nn.Parameter(torch.zeros(1))  # a classifier has parameters (its device)
    acc, counts = aux_per_class(classifier, TEST_X[:5], TEST_Y[:5], C)
    np.testing.assert_allclose(acc, [1, 0.5, 0])
    assert counts.tolist() == [2, 2, 1]
    acc, counts = aux_per_class(classifier, TEST_X[:4], TEST_Y[:4], C)
    assert np.isnan(acc[2]) and counts.tolist() == [2, 2, 0]


def test_class_weights_v_and_l_by_hand():
    np.testing.assert_allclose(class_weights(np.array([6, 2, 0]), "V"), [0.5, 0.5, 0])
    np.testing.assert_allclose(class_weights(np.array([6, 2, 0]), "L"), [0.75, 0.25, 0])
    w = class_weights(TRAIN_COUNTS, "V")
    np.testing.assert_allclose(w, [[0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3], [0, 0, 1]])
    np.testing.assert_allclose(class_weights(TRAIN_COUNTS, "L").sum(axis=1), 1.0)


def test_class_weights_empty_client_and_bad_input():
    assert np.all(np.isnan(class_weights(np.array([[0, 0, 0], [1, 0, 0]]), "L")[0]))
    with pytest.raises(ValueError, match="mode"):
        class_weights(np.array([1, 2, 3]), "G")
    with pytest.raises(ValueError, match="non-negative"):
        class_weights(np.array([1, -2, 3]), "L")


def test_weighted_client_accuracy_by_hand_and_absent_class_renormalised():
    absent = np.array([1, 0.5, np.nan])  # class 2 has no test sample
    assert weighted_client_accuracy(np.array([1, 0.5, 0]), np.array([0.75, 0.25, 0])) == pytest.approx(0.875)
    # class 2's weight 0.5 drops out: (0.2 * 1 + 0.3 * 0.5) / 0.5 = 0.7
    assert weighted_client_accuracy(absent, np.array([0.2, 0.3, 0.5])) == pytest.approx(0.7)
    # a NaN class with zero weight does not matter
    assert weighted_client_accuracy(absent, np.array([0.5, 0.5, 0])) == pytest.approx(0.75)
    assert np.isnan(weighted_client_accuracy(absent, np.array([0, 0, 1.0])))
    with pytest.raises(ValueError, match="same length"):
        weighted_client_accuracy(np.array([1, 0.5]), np.array([0.5, 0.25, 0.25]))


@pytest.mark.parametrize("sample_weighted", [True, False])  # equal on a balanced test set
def test_pm_v_and_pm_l_differ_by_hand(sample_weighted):
    models = [MODEL_A, MODEL_B, None]
    pm_v = pm_accuracy(models, TEST_X, TEST_Y, TRAIN_COUNTS, "V", TASK, sample_weighted=sample_weighted)
    pm_l = pm_accuracy(models, TEST_X, TEST_Y, TRAIN_COUNTS, "L", TASK, sample_weighted=sample_weighted)
    # client 0, model A [1, 1/2, 0]: V (1 + 1/2) / 2 = 0.75; L 0.75 * 1 + 0.25 * 1/2 = 0.875
    # client 1, model B [0, 1, 1]:   V (0 + 1 + 1) / 3 = 2/3;  L 0.25 * 0 + 0.25 * 1 + 0.5 * 1 = 0.75
    np.testing.assert_allclose(pm_v[:2], [0.75, 2 / 3])
    np.testing.assert_allclose(pm_l[:2], [0.875, 0.75])
    assert np.isnan(pm_v[2]) and np.isnan(pm_l[2])


class CountingTask:
    """TASK, counting the samples it classifies (``correct``)."""

    def __init__(self):
        self.samples = 0

    def correct(self, model, x, y):
        self.samples += len(y)
        return TASK.correct(model, x, y)


def test_pm_v_and_pm_l_from_one_pass_over_the_test_set():
    """The evaluate stage scores each personal model once (task.correct) and reads both PM modes
    off those predictions (pm_accuracy_of): the hand values above, equal to pm_accuracy's."""
    models = [MODEL_A, MODEL_B, None]
    task = CountingTask()
    correct = [None if m is None else task.correct(m, TEST_X, TEST_Y) for m in models]
    assert task.samples == 2 * len(TEST_Y)  # each model once
    both = {mode: pm_accuracy_of(correct, TEST_Y, TRAIN_COUNTS, mode) for mode in ("V", "L")}
    np.testing.assert_allclose(both["V"][:2], [0.75, 2 / 3])
    np.testing.assert_allclose(both["L"][:2], [0.875, 0.75])
    for mode in ("V", "L"):
        np.testing.assert_array_equal(both[mode],
                                      pm_accuracy(models, TEST_X, TEST_Y, TRAIN_COUNTS, mode, TASK))
        assert np.isnan(both[mode][2])
    with pytest.raises(ValueError, match="mode"):
        pm_accuracy_of(correct, TEST_Y, TRAIN_COUNTS, "G")


def test_pm_with_one_model_for_all_clients():
    # the global model seen through each client's class weights: model A for everyone
    pm_v = pm_accuracy(MODEL_A, TEST_X, TEST_Y, TRAIN_COUNTS, "V", TASK)
    np.testing.assert_allclose(pm_v, [0.75, 0.5, 0.0])


def test_pm_absent_test_class_is_dropped_and_renormalised():
    x, y = TEST_X[:4], TEST_Y[:4]  # no test sample of class 2
    counts = np.array([[3, 1, 4], [0, 0, 5]])
    # model B: [0, 1, nan]. V: (0 + 1) / 2; L: weights 3/8, 1/8 (4/8 dropped) -> (1/8) / (4/8) = 0.25
    pm_v = pm_accuracy([MODEL_B, MODEL_B], x, y, counts, "V", TASK)
    pm_l = pm_accuracy([MODEL_B, MODEL_B], x, y, counts, "L", TASK)
    assert pm_v[0] == pytest.approx(0.5) and pm_l[0] == pytest.approx(0.25)
    assert np.isnan(pm_v[1]) and np.isnan(pm_l[1])  # the client's only class is not in the test set


def test_pm_on_an_unbalanced_test_set_follows_the_papers_per_sample_formula():
    x, y = ids(0, 1, 2, 3), labels(0, 0, 0, 1)
    model = Lookup([0, 1, 1, 1])  # right on ids 0 and 3: per-class [1/3, 1, nan]
    counts = np.array([[1, 1, 0]])
    # paper: sum_j alpha(y_j) 1(right) / sum_j alpha(y_j) = 2 / 4; class mean: (1/3 + 1) / 2
    assert pm_accuracy([model], x, y, counts, "V", TASK)[0] == pytest.approx(0.5)
    assert pm_accuracy([model], x, y, counts, "V", TASK, sample_weighted=False)[0] == pytest.approx(2 / 3)


def test_train_class_counts():
    np.testing.assert_array_equal(train_class_counts([labels(0, 0, 1), np.array([2, 2])], C),
                                  [[2, 1, 0], [0, 0, 2]])


# --- Equitable-FL: sigma_acc, client disagreement, clustering NMI --------------------------------

def test_sigma_acc_both_readings_by_hand():
    acc = np.array([0.6, np.nan, 0.8, 1.0])  # NaN client skipped
    # "global": deviations from 0.9 are -0.3, -0.1, 0.1
    assert sigma_acc(acc, 0.9) == pytest.approx(math.sqrt(0.11 / 3))
    assert sigma_acc(acc, 0.9, ddof=1) == pytest.approx(math.sqrt(0.11 / 2))
    # "std": deviations from the mean 0.8 are -0.2, 0, 0.2
    assert sigma_acc(acc, reading="std") == pytest.approx(math.sqrt(0.08 / 3))
    assert sigma_acc(acc, reading="std", ddof=1) == pytest.approx(0.2)
    assert sigma_acc(acc, 0.8) == pytest.approx(sigma_acc(acc, reading="std"))  # global = mean


def test_sigma_acc_needs_global_accuracy_for_the_default_reading():
    with pytest.raises(ValueError, match="global_acc"):
        sigma_acc(np.array([0.5, 0.7]))
    with pytest.raises(ValueError, match="reading"):
        sigma_acc(np.array([0.5, 0.7]), 0.6, reading="rms")
    assert np.isnan(sigma_acc(np.array([0.5]), reading="std", ddof=1))


def test_client_disagreement_eq9_by_hand():
    losses = np.array([1.0, 2.0, 4.0])
    # unordered |gaps| 1, 3, 2 (sum 6); ordered double sum 12; C(3, 2) = 3
    assert client_disagreement(losses) == pytest.approx(12 / 3)
    assert client_disagreement(losses, normalization="pairs") == pytest.approx(6 / 3)
    assert client_disagreement(np.array([0.7, 0.7, 0.7, 0.7])) == 0.0
    assert np.isnan(client_disagreement(np.array([1.0])))
    with pytest.raises(ValueError, match="finite"):
        client_disagreement(np.array([1.0, np.nan]))


def nmi_by_formula(u: np.ndarray, v: np.ndarray) -> float:
    """I(U; V) / ((H(U) + H(V)) / 2), natural logs, from the contingency table."""
    n = len(u)
    joint = np.array([[np.sum((u == a) & (v == b)) for b in np.unique(v)] for a in np.unique(u)]) / n
    pu, pv = joint.sum(1), joint.sum(0)
    nz = joint > 0
    mi = np.sum(joint[nz] * np.log(joint[nz] / np.outer(pu, pv)[nz]))
    hu, hv = -np.sum(pu * np.log(pu)), -np.sum(pv * np.log(pv))
    return float(mi / ((hu + hv) / 2))


def test_clustering_nmi_perfect_relabelled_is_one():
    assert clustering_nmi(np.array([2, 2, 0, 0, 1, 1]), np.array([0, 0, 1, 1, 2, 2])) == pytest.approx(1.0)


def test_clustering_nmi_imperfect_by_hand():
    true, pred = np.array([0, 0, 1, 1]), np.array([0, 0, 0, 1])
    # p(true, pred): (0,0) 1/2, (1,0) 1/4, (1,1) 1/4; p(true) = 1/2, 1/2; p(pred) = 3/4, 1/4
    mi = 0.5 * math.log(4 / 3) + 0.25 * math.log(2 / 3) + 0.25 * math.log(2)
    h_true = math.log(2)
    h_pred = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    expected = mi / ((h_true + h_pred) / 2)
    assert nmi_by_formula(true, pred) == pytest.approx(expected)
    assert clustering_nmi(pred, true) == pytest.approx(expected)
    assert 0 < expected < 1
    with pytest.raises(ValueError, match="same length"):
        clustering_nmi(pred[:3], true)


def test_fairness_summary_adds_keys_to_the_accuracy_summary():
    acc = np.array([0.6, 0.8, 1.0])
    s = fairness_summary(acc, global_acc=0.9, losses=np.array([1.0, np.nan, 2.0, 4.0]))
    base = client_accuracy_summary(acc)
    assert {k: s[k] for k in base} == base
    assert s["sigma_acc_global"] == pytest.approx(math.sqrt(0.11 / 3))
    assert s["sigma_acc_std"] == pytest.approx(math.sqrt(0.08 / 3))
    assert (s["cd"], s["cd_pairs"]) == (pytest.approx(4.0), pytest.approx(2.0))
    assert set(fairness_summary(acc)) == {*base, "sigma_acc_std"}
