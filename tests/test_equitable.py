"""Equitable-FL (arXiv 2410.19207) and its baselines (Cluster2, pow-d, GIFAIR-FL, FairFed) against
hand-computed values, plus determinism and checkpoint-resume through the round loop.

Hand computations reuse test_algorithms' linear model (w in R^2, MSE on two samples, full-batch SGD)
where a method changes the local step (GIFAIR-FL's scaled loss); the server rules (eq. 6 weights,
FairFed's step, arccos distances, highest-loss selection) are checked on small arrays.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_algorithms import LR, W0, W, close, grad, mul, rnd, run_client, strategy, sub
from torch import nn

from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.algorithms.cluster2 import arccos_distances, clustered_sample
from fedpipe.algorithms.equitable_fl import activation_vector, equitable_weights, spectral_clusters
from fedpipe.algorithms.fairfed import fairfed_weights
from fedpipe.algorithms.gifair import group_coefficients
from fedpipe.algorithms.pow_d import highest_loss
from fedpipe.config import ConfigError
from fedpipe.config.fl import FLConfig, LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl import ClientUpdate, Payload, RoundInfo, ServerState, run_federated
from fedpipe.models.classifiers import Classifier
from fedpipe.tasks import ClassificationTask

DT = torch.float64


def tiny_classifier() -> Classifier:
    """features(x) = relu(A x) in R^3 (penultimate), head R^3 -> R^2; deterministic init."""
    body = nn.Sequential(nn.Flatten(), nn.Linear(2, 3), nn.ReLU())
    m = Classifier((1, 1, 2), 2, body).to(DT)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=DT))
    return m


def scalar_update(cid: int, value: float, activation=None, n: int = 10, **metrics) -> ClientUpdate:
    extra = {"activation": {"a": torch.tensor(activation, dtype=torch.float32)}} if activation else {}
    return ClientUpdate(cid, n, {"w": torch.tensor([value], dtype=DT)}, extra=extra, metrics=metrics)


# -- Equitable-FL --------------------------------------------------------------------------------
def test_activation_vector_is_the_mean_log_softmax_of_relu_features():
    m = tiny_classifier()
    x = torch.tensor([[[[1.0, -2.0]]], [[[0.5, 3.0]]]], dtype=DT)
    data = ClientData(x, torch.tensor([0, 1]))
    a = activation_vector(m, data, torch.Generator().manual_seed(0))
    lin = m.body[1].requires_grad_(False)
    rows = []
    for xi in x.reshape(2, 2):
        h = [max(0.0, float(lin.weight[j] @ xi + lin.bias[j])) for j in range(3)]
        lse = math.log(sum(math.exp(v) for v in h))
        rows.append([v - lse for v in h])
    expected = torch.tensor([(rows[0][j] + rows[1][j]) / 2 for j in range(3)])
    torch.testing.assert_close(a, expected.float(), rtol=0, atol=1e-6)
    assert m.training  # mode restored


def test_equitable_weights_eq6():
    # 3 + 1 participants: 1/6 to each of the three, 1/2 to the single one
    np.testing.assert_allclose(equitable_weights(np.array([0, 0, 0, 1]), 2), [1 / 6] * 3 + [1 / 2])
    np.testing.assert_allclose(equitable_weights(np.array([1, 0, 1, 0]), 2), [0.25] * 4)
    # an empty cluster (C = 3, two found): renormalised, each found cluster 1/2
    np.testing.assert_allclose(equitable_weights(np.array([0, 0, 2]), 3), [0.25, 0.25, 0.5])


def test_spectral_clustering_of_activations_finds_the_groups():
    a = np.array([[-1.0, -5.0, -5.0], [-1.1, -5.0, -4.9], [-5.0, -1.0, -5.0],
                  [-5.0, -1.2, -5.1], [-4.9, -1.0, -5.0]])
    labels = spectral_clusters(a, 2, np.random.default_rng(0))
    assert labels[0] == labels[1] and labels[2] == labels[3] == labels[4]
    assert labels[0] != labels[2]
    assert len(set(spectral_clusters(a[:1], 2, np.random.default_rng(0)))) == 1  # r < C


def test_equitable_aggregate_weights_by_cluster_not_by_samples():
    s = strategy("equitable_fl", {"num_clusters": 2})
    s.client_groups = (0, 0, 0, 1)
    group0, group1 = [-1.0, -6.0], [-6.0, -1.0]
    ups = [scalar_update(0, 1.0, group0, n=100), scalar_update(1, 2.0, group0, n=1),
           scalar_update(2, 3.0, group0, n=1), scalar_update(3, 10.0, group1, n=1)]
    r = RoundInfo(index=0, total=1, seed=0, updates=tuple(ups))
    state = s.aggregate(ServerState({"w": torch.tensor([0.0], dtype=DT)}), r)
    expected = (1.0 + 2.0 + 3.0) / 6 + 10.0 / 2
    torch.testing.assert_close(state.weights["w"], torch.tensor([expected], dtype=DT))
    metrics = s.round_metrics(state, r)
    assert metrics["cluster_nmi"] == pytest.approx(1.0) and metrics["clusters_found"] == 2
    assert metrics["groups_present"] == 2


def test_equitable_client_uploads_activation_of_the_trained_model():
    s = ALGORITHMS["equitable_fl"](ClassificationTask(), tiny_classifier,
                                   LocalTrainConfig(steps=1, batch_size=4, lr=0.5),
                                   algorithm_config("equitable_fl", {"mu": 0.0}))
    data = ClientData(torch.randn(4, 1, 1, 2, generator=torch.Generator().manual_seed(4),
                                  dtype=DT), torch.tensor([0, 1, 0, 1]))
    w0 = tiny_classifier().state_dict()
    update, _, _ = s.client_update(Payload(0, w0), {}, data, torch.Generator().manual_seed(0))
    trained = tiny_classifier()
    trained.load_state_dict(update.weights)
    assert not torch.equal(update.weights["body.1.weight"], w0["body.1.weight"])
    expected = activation_vector(trained, data, torch.Generator())
    torch.testing.assert_close(update.extra["activation"]["a"], expected)


# -- pow-d ---------------------------------------------------------------------------------------
def test_pow_d_probes_d_candidates_and_keeps_the_highest_losses():
    s = strategy("pow_d", {"candidates": 4}, num_clients=6)
    losses = {0: 0.5, 1: 2.0, 2: 0.1, 3: 1.5, 4: 3.0, 5: 0.7}
    asked = []

    def probe(cands):
        asked.append(list(cands))
        return {c: {"loss": losses[c]} for c in cands}

    picked = s.select_clients(ServerState({}), 0, list(range(6)), 2, np.random.default_rng(1), probe)
    cands = asked[0]
    assert len(cands) == 4 and len(set(cands)) == 4
    top = sorted(sorted(cands, key=lambda c: -losses[c])[:2])
    assert picked == top
    assert highest_loss({3: 1.0, 1: 1.0, 2: 0.5}, 2) == [1, 3]  # tie: lower id first


# -- FairFed -------------------------------------------------------------------------------------
def test_fairfed_step_and_clip_at_zero():
    # normalised omega (.25, .25, .5); mean gap .2; omega - beta (gap - mean)
    np.testing.assert_allclose(fairfed_weights([1, 1, 2], [0.1, 0.3, 0.2], 1.0), [0.35, 0.15, 0.5])
    # beta = 3: (.55, -.05 -> 0, .5), renormalised
    np.testing.assert_allclose(fairfed_weights([1, 1, 2], [0.1, 0.3, 0.2], 3.0),
                               [0.55 / 1.05, 0.0, 0.5 / 1.05])


def test_fairfed_aggregate_uses_accuracy_gaps_and_keeps_omega():
    s = strategy("fairfed", {"beta": 1.0})
    ups = [scalar_update(0, 1.0, n=10, global_model_accuracy=0.9),
           scalar_update(1, 3.0, n=30, global_model_accuracy=0.5)]
    state = s.aggregate(ServerState({"w": torch.tensor([0.0], dtype=DT)}), rnd(ups))
    # Acc_global = (10 .9 + 30 .5) / 40 = .6; gaps .3, .1 (mean .2); omega (.25, .75) -> (.15, .85)
    torch.testing.assert_close(state.weights["w"], torch.tensor([0.15 + 0.85 * 3], dtype=DT))
    assert state.meta["fairfed_omega"] == pytest.approx({"0": 40 * 0.15, "1": 40 * 0.85})


# -- GIFAIR-FL -----------------------------------------------------------------------------------
def test_gifair_coefficients():
    c = group_coefficients([0, 0, 1, 1, 1], {0: 2.0, 1: 1.0}, 0.1)
    np.testing.assert_allclose(c, [1.25, 1.25, 1 - 0.5 / 3, 1 - 0.5 / 3, 1 - 0.5 / 3])
    np.testing.assert_allclose(group_coefficients([0, 1], {0: 2.0}, 0.1), [1.0, 1.0])
    assert group_coefficients([0, 1], {0: 2.0, 1: 1.0}, 1.0)[1] == 0.0  # clipped at 0


def test_gifair_one_step_scales_the_local_gradient():
    s = strategy("gifair", {"lam": 0.1}, num_clients=5)
    s.client_groups = (0, 0, 1, 1, 1)
    state = ServerState(W(W0), meta={"gifair_loss": {"0": 2.0, "3": 1.0}})
    payload = s.payload(state, 0, client_id=1)
    assert float(payload.extra["gifair"]["c"]) == pytest.approx(1.25)
    update, _, metrics = run_client(s, payload)
    close(update.weights["weight"], sub(W0, mul(LR * 1.25, grad(W0))))
    new = s.aggregate(state, rnd([update]))
    assert new.meta["gifair_loss"]["7"] == pytest.approx(metrics["global_model_loss"])


def test_gifair_without_groups_is_an_error():
    s = strategy("gifair")
    with pytest.raises(ValueError, match="label_blocks"):
        s.payload(ServerState(W(W0)), 0, 0)


# -- Cluster2 ------------------------------------------------------------------------------------
def test_arccos_distances():
    d = arccos_distances(np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]))
    h = math.pi / 2
    np.testing.assert_allclose(d, [[0, math.pi / 4, h], [math.pi / 4, 0, h], [h, h, 0]], atol=1e-7)


def test_clustered_sampling_draws_one_client_per_cluster():
    g = np.array([[1.0, 0.0], [1.0, 0.05], [0.0, 1.0], [0.05, 1.0]])
    for seed in range(5):
        picked = clustered_sample(arccos_distances(g), np.ones(4), 2, np.random.default_rng(seed))
        assert len([c for c in picked if c < 2]) == 1 and len([c for c in picked if c >= 2]) == 1


def test_cluster2_stores_representative_gradients():
    s = strategy("cluster2")
    state = s.aggregate(ServerState(W(W0)), rnd([ClientUpdate(2, 5, W([1.0, 1.0]))]))
    torch.testing.assert_close(state.extra["repgrad"]["2"],
                               torch.tensor(sub([1.0, 1.0], W0), dtype=torch.float32))
    assert state.meta["cluster2_sizes"] == {"2": 5.0}


@pytest.mark.parametrize(("name", "bad"), [
    ("equitable_fl", {"num_clusters": 0}), ("equitable_fl", {"activation_model": "server"}),
    ("pow_d", {"candidates": 0}), ("gifair", {"lam": -1.0}), ("fairfed", {"beta": -0.5}),
])
def test_invalid_hyperparameters_name_the_key(name, bad):
    with pytest.raises(ConfigError) as err:
        algorithm_config(name, bad)
    assert err.value.key == f"algorithms.{name}.{next(iter(bad))}"


# -- through the round loop ----------------------------------------------------------------------
def clients() -> list[ClientData]:
    g = torch.Generator().manual_seed(2)
    out = []
    for k in range(4):
        y = torch.full((8,), k % 2)
        x = torch.randn(8, 1, 1, 2, generator=g, dtype=DT) + 3 * (k % 2)
        out.append(ClientData(x, y))
    return out


FL = FLConfig(rounds=3, participation=0.5, checkpoint_every=5,
              local=LocalTrainConfig(steps=2, batch_size=4, lr=0.1))


def federate(name, **kw):
    s = ALGORITHMS[name](ClassificationTask(), tiny_classifier, FL.local,
                         algorithm_config(name, None), num_clients=4)
    s.client_groups = (0, 1, 0, 1)
    return run_federated(s, tiny_classifier(), clients(), FL, seed=5, progress=False, **kw)


@pytest.mark.parametrize("name", ["equitable_fl", "cluster2", "pow_d", "gifair", "fairfed",
                                  "centralized"])
def test_deterministic_and_resumable(name, tmp_path):
    full = federate(name)
    assert full.rounds_done == 3 and all(math.isfinite(h["train_loss"]) for h in full.history)
    first = federate(name, checkpoint_dir=tmp_path, fingerprint="f", stop_after=1)
    assert first.rounds_done == 1
    resumed = federate(name, checkpoint_dir=tmp_path, fingerprint="f")
    assert resumed.resumed_from == 1
    for k in full.state.weights:
        assert torch.equal(full.state.weights[k], resumed.state.weights[k]), k
    assert full.history == resumed.history
    if name == "equitable_fl":
        assert all("cluster_nmi" in h for h in full.history)


# -- studies, evaluation and claims ----------------------------------------------------------------
@pytest.mark.parametrize(("preset", "clusters", "model"), [
    ("equitable_mnist", 2, "mlp"), ("equitable_cifar10", 2, "lenet"),
    ("equitable_cifar100", 3, "cnn_cifar100"), ("equitable_smoke", 2, "mlp"),
    ("equitable_mnist5k", 2, "mlp")])
def test_study_presets_compose_and_validate(tmp_path, preset, clusters, model):
    from pathlib import Path

    import yaml

    from fedpipe.pipeline.common import train_config
    from fedpipe.pipeline.compose import compose_params
    from fedpipe.pipeline.partition import partition_stage_config

    repo = Path(__file__).resolve().parents[1]
    params = yaml.safe_load(compose_params(repo, [f"study={preset}"],
                                           output=str(tmp_path / "p.yaml")).read_text())
    assert params["study"]["diffusion_algorithms"] == [] and len(params["study"]["seeds"]) >= 3
    assert params["partition"]["scheme"] == "label_blocks" and params["fl"]["participation"] == 0.4
    assert params["partition"]["local_test"] == "classes"  # σ_Acc on every test image of the classes
    partition_stage_config(params)
    cfgs = {a: train_config(params, a) for a in params["study"]["algorithms"]}
    assert set(cfgs) == {"centralized", "fedprox", "equitable_fl", "cluster2", "pow_d", "gifair",
                         "fairfed"}
    assert cfgs["equitable_fl"].algo_cfg.num_clusters == clusters == len(params["partition"]["groups"])
    assert cfgs["fedprox"].model.name == model
    if preset == "equitable_mnist5k":  # real MNIST images, Table 1's groups, K = 100 of 250
        assert params["dataset"]["name"] == "mnist5k" and params["partition"]["groups"] == [4, 6]
        assert params["fl"]["rounds"] == 100 and params["fl"]["local"]["epochs"] == 5
    elif preset != "equitable_smoke":
        assert params["fl"]["rounds"] == 250 and params["fl"]["local"]["epochs"] == 5


def test_cnn_cifar100_shapes():
    from fedpipe.models import build_model

    m = build_model("cnn_cifar100", (3, 32, 32), 100)
    assert m.feature_dim == 512 and m(torch.zeros(2, 3, 32, 32)).shape == (2, 100)
    assert sum(isinstance(x, nn.Conv2d) for x in m.modules()) == 5
    assert sum(isinstance(x, nn.MaxPool2d) for x in m.modules()) == 3


def test_participant_cd_and_history_means():
    from fedpipe.metrics.equitable import history_means
    from fedpipe.pipeline.federate import participant_disagreement

    history = [{"round": 1.0, "cluster_nmi": 1.0, "groups_present": 2.0},
               {"round": 2.0, "cluster_nmi": 0.0, "groups_present": 1.0}]
    rows = [{"round": 1.0, "client": c, "generic_loss": v, "participant": p}
            for c, (v, p) in enumerate([(1.0, 1.0), (2.0, 0.0), (4.0, 1.0), (0.5, 1.0)])]
    participant_disagreement(history, rows)
    # participants' losses 1, 4, .5: ordered-pair sum 2 (3 + 0.5 + 3.5) = 14, C(3, 2) = 3
    assert history[0]["test_cd"] == pytest.approx(14 / 3)
    assert history[0]["test_cd_pairs"] == pytest.approx(7 / 3)
    assert "test_cd" not in history[1]
    m = history_means(history)
    assert m["nmi_mean"] == 0.5 and m["nmi_mixed_mean"] == 1.0 and m["cd_mean"] == pytest.approx(14 / 3)


def test_equitable_claims_and_the_constant_reference():
    from fedpipe.claims import equitable as eq
    from fedpipe.claims import judge
    from fedpipe.config import build
    from fedpipe.config.fl import StudyConfig

    study = build(StudyConfig, {"algorithms": ["fedprox", "equitable_fl", "fairfed"],
                                "seeds": [0, 1, 2]}, "study")
    by = {(c.method, c.baseline, c.metric): c for c in eq.claims(study)}
    assert by[("equitable_fl", "fedprox", "sigma_acc_global")].direction == "lower"
    # the lowest σ_Acc and CD of all: one claim per baseline in the study, one σ_Acc reading
    assert {(m, b) for m, b, metric in by if metric in ("sigma_acc_global", "cd_mean")
            and m == "equitable_fl"} == {("equitable_fl", "fedprox"), ("equitable_fl", "fairfed")}
    assert not {metric for *_, metric in by} & {"sigma_acc_std", "sigma_acc_global_cma"}
    full = build(StudyConfig, {"algorithms": ["centralized", "fedprox", "equitable_fl", "cluster2",
                                              "pow_d", "gifair", "fairfed"]}, "study")
    keys = {c.key for c in eq.claims(full) if not c.fact}
    assert {f"equitablefl/sigma_acc_global/equitable_fl-lt-{b}" for b in eq.SIGMA_BASELINES} <= keys
    assert {f"equitablefl/cd_mean/equitable_fl-lt-{b}" for b in eq.SIGMA_BASELINES} <= keys
    # σ_Acc, accuracy and CD against each of 5 baselines (the paper's family), 3 orderings (issue 42)
    assert {f"equitablefl/test_accuracy/equitable_fl-gt-{b}" for b in eq.SIGMA_BASELINES} <= keys
    assert len(keys) == 3 * 5 + 3 and not any("centralized" in k for k in keys)
    assert {c.key for c in eq.claims(full) if c.family == "ordering"} == {
        f"equitablefl/sigma_acc_global/{b}-gt-fedprox" for b in ("fairfed", "cluster2", "pow_d")}
    femnist = build(StudyConfig, {"name": "equitable_femnist", "algorithms": ["fedprox", "equitable_fl"]},
                    "study")  # the paper's exception: no accuracy claim on FEMNIST
    assert not [c for c in eq.claims(femnist) if c.metric == "test_accuracy"]
    assert by[("fairfed", "fedprox", "sigma_acc_global")].direction == "higher"
    nmi = by[("equitable_fl", "perfect_clustering", "nmi_mixed_mean")]
    near = judge(nmi, {"equitable_fl": {0: 0.97, 1: 0.95, 2: 0.99}})
    assert near.held and near.mean_diff == pytest.approx(-0.03)
    assert not judge(nmi, {"equitable_fl": {0: 0.7, 1: 0.8, 2: 0.75}}).held
    assert eq.claims(build(StudyConfig, {"algorithms": ["fedavg"]}, "study")) == []
