"""FedPTR / FedPTR-S (Chen et al. 2023, arXiv 2312.14380): MTT's loss and gradient against hand
computation and finite differences, the layer-adaptive penalty's gradient, MTT recovering a known
one-step trajectory, the round protocol of both variants (history, projection, one-shot schedule,
client-side initialisation); a deterministic, resumable run of each variant is the method contract's
(tests/test_contract.py).

The hand computations use a linear model w in R^2 (no bias) and the loss
L(w; X, y) = mean_j (x_j . w - y_j)^2, whose gradient is (2/n) sum_j (x_j . w - y_j) x_j.
"""

from __future__ import annotations

import math

import pytest
import torch
from fakes import assert_identical
from torch import nn

from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.algorithms.fedptr import FedPTR, FedPTRS, layer_groups, ptr_penalty
from fedpipe.config import ConfigError
from fedpipe.config.fl import FLConfig, LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl import Payload, RoundInfo, run_federated
from fedpipe.fl.mtt import (
    DSA_FAMILIES,
    MTTSettings,
    SyntheticSet,
    make_dsa,
    mtt_grad,
    mtt_loss,
    mtt_update,
    on_normalised_inputs,
    project,
    unroll,
)
from fedpipe.models import build_model
from fedpipe.models.classifiers import Normalize
from fedpipe.tasks import ClassificationTask

DT = torch.float64
XS = [[1.0, 2.0], [3.0, -1.0]]
YS = [1.0, 2.0]
W0 = [0.5, -0.25]
WEND = [0.3, 0.1]
BETA = 0.05


def linear() -> nn.Module:
    return nn.Linear(2, 1, bias=False).to(DT)


def hand_step(w, xs, beta):
    r = [x[0] * w[0] + x[1] * w[1] - y for x, y in zip(xs, YS, strict=True)]
    g = [2 / len(xs) * sum(rj * x[d] for rj, x in zip(r, xs, strict=True)) for d in range(2)]
    return [w[d] - beta * g[d] for d in range(2)]


def hand_mtt_loss(xs, beta, steps):
    w = W0
    for _ in range(steps):
        w = hand_step(w, xs, beta)
    num = sum((a - b) ** 2 for a, b in zip(w, WEND, strict=True))
    den = sum((a - b) ** 2 for a, b in zip(WEND, W0, strict=True))
    return num / den


def tensors():
    x = torch.tensor(XS, dtype=DT)
    y = torch.tensor(YS, dtype=DT).reshape(-1, 1)
    w0 = {"weight": torch.tensor([W0], dtype=DT)}
    wend = {"weight": torch.tensor([WEND], dtype=DT)}
    return x, y, w0, wend


@pytest.mark.parametrize("steps", [1, 2])
def test_mtt_loss_and_gradient_hand_computed(steps):
    x, y, w0, wend = tensors()
    beta = torch.tensor([BETA], dtype=DT)
    model = linear()
    loss = mtt_loss(model, x, beta, y, w0, wend, steps)
    assert float(loss) == pytest.approx(hand_mtt_loss(XS, BETA, steps), abs=1e-12)
    (gx, gb), value = mtt_grad(model, x, beta, y, w0, wend, steps)
    assert float(value) == pytest.approx(float(loss), abs=1e-15)
    h = 1e-6  # central differences of the hand-computed loss
    for i in range(2):
        for d in range(2):
            up = [row[:] for row in XS]
            dn = [row[:] for row in XS]
            up[i][d] += h
            dn[i][d] -= h
            fd = (hand_mtt_loss(up, BETA, steps) - hand_mtt_loss(dn, BETA, steps)) / (2 * h)
            assert float(gx[i, d]) == pytest.approx(fd, rel=1e-6, abs=1e-9)
    fd_b = (hand_mtt_loss(XS, BETA + h, steps) - hand_mtt_loss(XS, BETA - h, steps)) / (2 * h)
    assert float(gb[0]) == pytest.approx(fd_b, rel=1e-6, abs=1e-9)
    assert abs(fd_b) > 1e-3  # the beta gradient is not trivially zero


def test_unroll_two_steps_is_two_hand_steps():
    x, y, w0, _ = tensors()
    w = unroll(linear(), w0, x, y, torch.tensor([BETA], dtype=DT), 2)
    expected = hand_step(hand_step(W0, XS, BETA), XS, BETA)
    assert w["weight"].flatten().tolist() == pytest.approx(expected, abs=1e-14)


def test_layer_adaptive_penalty_gradient():
    # two layers: "a" (weight + bias) and "b" (weight)
    target = {"a.weight": torch.tensor([1.0, 2.0], dtype=DT), "a.bias": torch.tensor([0.0], dtype=DT),
              "b.weight": torch.tensor([[0.5, -0.5]], dtype=DT)}
    w = {"a.weight": torch.tensor([4.0, 2.0], dtype=DT), "a.bias": torch.tensor([4.0], dtype=DT),
         "b.weight": torch.tensor([[0.5, 0.5]], dtype=DT)}
    groups = layer_groups(list(w))
    assert groups == [["a.weight", "a.bias"], ["b.weight"]]
    lam = 0.1
    da = [3.0, 0.0, 4.0]  # ||d_a|| = 5
    db = [0.0, 1.0]  # ||d_b|| = 1
    for stop, scale in ((True, 1.0), (False, 0.5)):
        p = {k: v.clone().requires_grad_(True) for k, v in w.items()}
        val = ptr_penalty(p, target, lam, groups, adaptive=True, stop_gradient=stop)
        # value: sum_j lambda/||d_j|| / 2 * ||d_j||^2 = lambda/2 (5 + 1)
        assert float(val.detach()) == pytest.approx(lam / 2 * 6, rel=1e-9)
        val.backward()
        # stop-gradient: lambda d_j / ||d_j||; through lambda_j: half of it
        assert p["a.weight"].grad.tolist() == pytest.approx([scale * lam * 3 / 5, 0.0], abs=1e-9)
        assert p["a.bias"].grad.tolist() == pytest.approx([scale * lam * 4 / 5], abs=1e-9)
        assert p["b.weight"].grad.flatten().tolist() == pytest.approx([0.0, scale * lam], abs=1e-9)
    p = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    fixed = ptr_penalty(p, target, lam, groups, adaptive=False)
    assert float(fixed.detach()) == pytest.approx(lam / 2 * (25 + 1))
    fixed.backward()  # fixed lambda: lambda d
    assert p["a.bias"].grad.tolist() == pytest.approx([lam * 4])
    assert sum(v * v for v in da) == 25 and sum(v * v for v in db) == 1


def test_mtt_recovers_a_known_one_step_trajectory():
    """w_end is one student step on a hidden set X*; MTT from another X~ learns a set whose one
    step from w_start lands on w_end."""
    x_star = torch.tensor([[0.5, 1.0], [2.0, 0.5]], dtype=DT)
    y = torch.tensor(YS, dtype=DT).reshape(-1, 1)
    model = linear()
    w0 = {"weight": torch.tensor([W0], dtype=DT)}
    wend = unroll(model, w0, x_star, y, torch.tensor([BETA], dtype=DT), 1)
    syn = SyntheticSet.create(torch.tensor(XS, dtype=DT), y, BETA)
    before = float(mtt_loss(model, syn.x, syn.beta, y, w0, wend, 1))
    syn, metrics = mtt_update(model, syn, w0, wend, MTTSettings(iterations=200, syn_steps=1,
                                                                lr_img=0.5, lr_beta=0.0))
    after = float(mtt_loss(model, syn.x, syn.beta, y, w0, wend, 1))
    assert before > 0.1 and after < 1e-6
    assert metrics["mtt_loss_last"] < metrics["mtt_loss_first"]
    assert float(syn.beta[0]) == BETA  # lr_beta = 0 leaves beta alone
    w1 = project(model, w0, syn.x, y, BETA, 1)
    assert torch.allclose(w1["weight"], wend["weight"], atol=1e-4)


def test_dsa_families_deterministic_and_differentiable():
    x = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    for fam in DSA_FAMILIES:
        aug = make_dsa(fam)
        a = aug(x, torch.Generator().manual_seed(1))
        b = aug(x, torch.Generator().manual_seed(1))
        assert a.shape == x.shape and torch.equal(a, b)
        (gx,) = torch.autograd.grad(a.sum(), x)
        assert torch.isfinite(gx).all() and gx.abs().sum() > 0
    with pytest.raises(ValueError):
        make_dsa("color_blur")


# -- the strategies ---------------------------------------------------------------------------
SHAPE = (1, 4, 4)


def conv_model() -> nn.Module:
    torch.manual_seed(0)
    return build_model("convnet", SHAPE, 3, width=4, depth=1)


def clients() -> list[ClientData]:
    g = torch.Generator().manual_seed(2)
    out = []
    for k in range(3):  # client k holds classes k and (k + 1) % 3 only
        y = torch.tensor([k] * 6 + [(k + 1) % 3] * 4)
        out.append(ClientData(torch.rand(len(y), *SHAPE, generator=g), y))
    return out


def norm_model() -> nn.Module:
    """conv_model's network and weights, normalising its inputs inside: (x - 0.3) / 0.4."""
    torch.manual_seed(0)
    return build_model("convnet", SHAPE, 3, width=4, depth=1, mean=(0.3,), std=(0.4,))


SMALL = {"ipc": 2, "mtt_iterations": 2, "syn_steps": 2, "lr_img": 10.0}
LOCAL = LocalTrainConfig(steps=2, batch_size=4, lr=0.1)


def strategy(name, **cfg):
    return ALGORITHMS[name](ClassificationTask(), conv_model, LOCAL,
                            algorithm_config(name, {**SMALL, **cfg}), num_clients=3)


def test_config_rejects_bad_values():
    with pytest.raises(ConfigError):
        algorithm_config("fedptr_s", {"dsa_strategy": "color_blur"})
    with pytest.raises(ConfigError):
        algorithm_config("fedptr", {"window": 0})
    with pytest.raises(ConfigError):
        algorithm_config("fedptr", {"init": "zeros"})
    assert algorithm_config("fedptr_s_once", None).mtt_once
    assert not algorithm_config("fedptr_s", None).mtt_once


def test_server_side_history_projection_and_one_shot():
    for name, expected_updates in (("fedptr_s", 3), ("fedptr_s_once", 1)):
        s = strategy(name)
        state = s.init_server(conv_model())
        w0 = {k: v.clone() for k, v in state.weights.items()}
        assert "proj" not in s.payload(state, 0).extra
        for r in range(4):
            # a stand-in aggregate: move the weights
            state.weights = {k: v + 0.01 * (r + 1) for k, v in state.weights.items()}
            state = s.server_update(state, RoundInfo(index=r, total=4, seed=0))
            hist = s.history(state)
            assert len(hist) == min(r + 2, 2)  # [w^t, w^{t-1}] (m = 1)
            if r == 0:  # t = 1 = m: no trajectory yet, lambda~ = 0
                assert "proj" not in state.extra
                assert torch.equal(hist[1]["body.0.weight"], w0["body.0.weight"])
            else:
                proj = s.payload(state, r + 1).extra["proj"]
                syn = state.extra["syn"]
                assert syn["x"].shape == (6, *SHAPE) and syn["y"].tolist() == [0, 0, 1, 1, 2, 2]
                # the projection is K = 5 GD steps on D~ from w^t
                expected = project(s.scratch_model_instance(), s.params_from(state.weights),
                                   syn["x"], syn["y"], s.cfg.proj_lr, s.cfg.proj_steps)
                assert all(torch.allclose(proj[k], expected[k]) for k in expected)
                assert not torch.equal(proj["head.weight"], state.weights["head.weight"])
        assert state.meta["mtt_updates"] == expected_updates


def test_mtt_every_f_rounds():
    s = strategy("fedptr_s", mtt_every=2)
    assert [s.mtt_due(t, last) for t, last in ((2, None), (3, 2), (4, 2), (5, 4))] == \
        [True, False, True, False]


def test_client_side_initialisation_and_state():
    s = strategy("fedptr")
    data = clients()[0]  # classes 0 and 1
    state = s.init_server(conv_model())
    p0 = s.payload(state, 0)
    assert "start" not in p0.extra
    update, cstate, _ = s.client_update(p0, {}, data, torch.Generator().manual_seed(0), 0)
    syn = cstate["syn"]
    rows = {tuple(r.flatten().tolist()) for r in data.x}
    for i in range(6):
        real = tuple(syn["x"][i].flatten().tolist()) in rows
        assert real == (int(syn["y"][i]) in (0, 1))  # own images where it has the class, noise else
    assert float(syn["beta"][0]) == pytest.approx(0.01)
    # t = 2 > m: the client gets w^{t-m}, runs MTT (its set changes) and keeps it
    state.weights = update.weights
    state = s.server_update(state, RoundInfo(index=0, total=4, seed=0))
    state.weights = {k: v + 0.05 for k, v in state.weights.items()}
    state = s.server_update(state, RoundInfo(index=1, total=4, seed=0))
    p2 = s.payload(state, 2)
    assert "start" in p2.extra
    _, cstate2, m = s.client_update(p2, cstate, data, torch.Generator().manual_seed(1), 0)
    assert not torch.equal(cstate2["syn"]["x"], syn["x"]) and int(cstate2["mtt"]["last"][0]) == 2
    assert math.isfinite(m["loss"]) and "mtt_loss_last" in m



def two_layer() -> nn.Module:
    """x -> A x + a -> B h + b (no non-linearity), float64: two layers for the per-layer pull."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 3)).to(DT)


def hand_ce_grads(w, x, y):
    """Gradients of the mean cross-entropy of the two-layer linear net, by the chain rule."""
    h = x @ w["0.weight"].T + w["0.bias"]
    p = torch.softmax(h @ w["1.weight"].T + w["1.bias"], dim=1)
    g = (p - torch.nn.functional.one_hot(y, 3).to(DT)) / len(y)  # dL/dlogits
    dh = g @ w["1.weight"]
    return {"1.weight": g.T @ h, "1.bias": g.sum(0), "0.weight": dh.T @ x, "0.bias": dh.sum(0)}


@pytest.mark.parametrize("variant", ["adaptive", "fixed", "no_projection"])
def test_one_local_step_by_hand(variant):
    """Alg. 2-3 line 12, one full-batch step of local SGD (momentum's first step is plain SGD):
    w1 = w0 - lr (grad CE + per layer lambda d_j / ||d_j||) with the stop-gradient layer-adaptive
    lambda_j, lambda d with a fixed lambda, and plain SGD when no w~ has been sent (t <= m)."""
    lam, lr = 0.3, 0.1
    local = LocalTrainConfig(steps=1, batch_size=4, lr=lr, momentum=0.5)
    s = ALGORITHMS["fedptr_s"](ClassificationTask(), two_layer, local,
                               algorithm_config("fedptr_s", {"lam": lam,
                                                             "layer_adaptive": variant != "fixed"}),
                               num_clients=1)
    w0 = {k: v.detach().clone() for k, v in two_layer().state_dict().items()}
    g = torch.Generator().manual_seed(5)
    proj = {k: v + torch.randn(v.shape, generator=g, dtype=DT) for k, v in w0.items()}
    x = torch.tensor([[1.0, -1.0], [0.5, 2.0], [-1.5, 0.0], [2.0, 1.0]], dtype=DT)
    y = torch.tensor([0, 2, 1, 2])
    extra = {} if variant == "no_projection" else {"proj": proj}
    update, _, _ = s.client_update(Payload(round=3, weights=w0, extra=extra), {}, ClientData(x, y),
                                   torch.Generator().manual_seed(0), 0)
    grads = hand_ce_grads(w0, x, y)
    for layer in ("0", "1"):
        names = (f"{layer}.weight", f"{layer}.bias")
        norm = math.sqrt(sum(float(((w0[n] - proj[n]) ** 2).sum()) for n in names))
        for n in names:
            pull = {"adaptive": lam * (w0[n] - proj[n]) / norm, "fixed": lam * (w0[n] - proj[n]),
                    "no_projection": torch.zeros_like(w0[n])}[variant]
            expected = w0[n] - lr * (grads[n] + pull)
            assert torch.allclose(update.weights[n], expected, atol=1e-12), (variant, n)
            assert variant == "no_projection" or pull.abs().max() > 1e-3


def test_cost_benchmark_clock_counts_mtt_and_projection(monkeypatch):
    """benchmarks/fedptr_cost.py times MTT and the projection by wrapping them: with F = 2 over 5
    rounds (m = 1) MTT runs at t = 2, 4 and the projection at every t = 2..5; the wrappers go on
    exit."""
    import importlib.util
    from pathlib import Path

    import fedpipe.algorithms.fedptr as module

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "fedptr_cost.py"
    monkeypatch.syspath_prepend(str(path.parent))  # as `python benchmarks/fedptr_cost.py` has it
    spec = importlib.util.spec_from_file_location("fedptr_cost", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    original = module.mtt_update
    fl = FLConfig(rounds=5, participation=1.0, local=LOCAL)
    with bench.Clock() as clock:
        assert module.mtt_update is not original
        run_federated(strategy("fedptr_s", mtt_every=2), conv_model(), clients(), fl, seed=0,
                      progress=False)
    assert clock.calls == {"mtt": 2, "project": 4}
    assert clock.seconds["mtt"] > 0 and module.mtt_update is original


def test_report_section_prints_tables_1_2_4_and_7_beside_ours():
    from fedpipe.claims import fedptr as fc
    from fedpipe.config.fl import StudyConfig

    metrics = {"fedavg": {"test_accuracy_last5": 0.5, "test_accuracy_last5_std": 0.01, "seeds": 3},
               "fedptr_s_once": {"test_accuracy_last5": 0.6, "test_accuracy_last5_std": 0.02,
                                 "seeds": 3}}
    assert fc.report_section(StudyConfig(name="fedptr_cifar10", algorithms=["fedavg"]), metrics) == []
    c100 = "\n".join(fc.report_section(StudyConfig(name="fedptr_cifar100",
                                                   algorithms=["fedavg", "fedptr"]), metrics))
    # ours, then Table 1's six columns (100/50/30%, Dir(0.01) | Dir(0.04)), then Table 2's two
    assert ("| fedavg | 50.00 ± 1.00 | 37.32 | 39.65 | 37.07 | 38.22 | 29.68 | 32.95 | 32.68 | 38.35 "
            "| — | — |" in c100)
    assert "T7" not in c100 and "not in the paper" not in c100
    fm = "\n".join(fc.report_section(StudyConfig(name="fedptr_fmnist", algorithms=["fedptr_s"]),
                                     {"fedptr_s": {"test_accuracy_last5": 0.8}}))
    assert "| fedptr_s | 80.00 | 85.48 | 85.90 | 81.71 | 83.05 | 76.78 | 79.48 | — | 84.68 |\n" in fm
    smoke = "\n".join(fc.report_section(StudyConfig(name="fedptr_smoke",
                                                    algorithms=["fedavg", "fedptr_s_once"]), metrics))
    assert "not in the paper" in smoke  # digits: CIFAR10's columns, the claims' reference
    assert ("| fedavg | 50.00 ± 1.00 | 55.43 | 65.44 | 49.90 | 56.84 | 41.82 | 48.50 | — | 58.00 | — | — "
            "| — |" in smoke)
    # Table 4 (CIFAR10 / CIFAR100 only): FedPTR with the layer-adaptive and with a fixed lambda
    assert "| fedptr_s_once | 60.00 ± 2.00 | " + "— | " * 10 + "65.34 |" in smoke
    fixed = {"fedptr_fixed": {"test_accuracy_last5": 0.7}}
    assert "| fedptr_fixed | 70.00 | " + "— | " * 8 + "62.10 | 67.68 | — |" in "\n".join(
        fc.report_section(StudyConfig(name="fedptr_smoke", algorithms=["fedptr_fixed"]), fixed))
    assert "| fedptr_fixed | 70.00 | " + "— | " * 8 + "41.26 | 42.41 |" in "\n".join(
        fc.report_section(StudyConfig(name="fedptr_cifar100", algorithms=["fedptr_fixed"]), fixed))


def test_claims_follow_table_1_and_table_7():
    from fedpipe.claims import fedptr as fedptr_claims
    from fedpipe.config.core import build
    from fedpipe.config.fl import StudyConfig

    def study(name):
        return build(StudyConfig, {"name": name, "algorithms": ["fedavg"], "seeds": [0, 1, 2],
                                   "diffusion_algorithms": []}, "study")
    by = {(c.method, c.baseline): c for c in fedptr_claims.claims(study("fedptr_smoke"))}
    assert all(c.metric == "test_accuracy_last5" for c in by.values())
    assert all(c.direction == "higher" for k, c in by.items() if k != ("fedprox_syn", "fedavg"))
    # Table 12: the distilled data added to FedProx score below FedAvg, FedPTR(-S) above it
    assert by[("fedprox_syn", "fedavg")].direction == "lower"
    assert "50.08 vs 55.45" in by[("fedprox_syn", "fedavg")].source
    assert by[("fedptr_s", "fedprox_syn")].paper_values == (68.16, 50.08)
    assert by[("fedptr", "fedptr_noproj")].family == "ordering"
    assert "68.16 vs 55.43" in by[("fedptr_s", "fedavg")].source  # CIFAR10 Dir(0.01), 100%
    assert "65.34" in by[("fedptr_s_once", "fedavg")].source
    c100 = {(c.method, c.baseline): c for c in fedptr_claims.claims(study("fedptr_cifar100"))}
    assert "44.82 vs 42.02" in c100[("fedptr_s", "scaffold")].source
    # Table 4: layer-adaptive above fixed lambda, the study's dataset (CIFAR10 for the smoke)
    assert "69.04 vs fixed 62.10" in by[("fedptr", "fedptr_fixed")].source
    assert "44.98 vs fixed 41.26" in c100[("fedptr", "fedptr_fixed")].source
    fm = {(c.method, c.baseline): c for c in fedptr_claims.claims(study("fedptr_fmnist"))}
    assert "CIFAR10: layer-adaptive 69.04" in fm[("fedptr", "fedptr_fixed")].source  # no FMNIST
    # the control: both FedPTR variants above the same pull aimed at w^t, flagged as no table
    for method in ("fedptr", "fedptr_s"):
        assert "not a run of the paper" in by[(method, "fedptr_noproj")].source
    assert len(by) == 18  # 15, and Table 12's arm below FedAvg and under FedPTR / FedPTR-S


@pytest.mark.parametrize("study", ["fedptr_smoke", "fedptr_cifar10", "fedptr_cifar100",
                                   "fedptr_fmnist"])
def test_every_claim_has_its_arms_in_the_study(study, tmp_path):
    """No FedPTR claim is "not evaluated": each study runs both arms of every claim."""
    from pathlib import Path

    from fedpipe.claims import fedptr as fedptr_claims
    from fedpipe.config.core import build, load_params
    from fedpipe.config.fl import StudyConfig
    from fedpipe.pipeline.compose import compose_params

    root = Path(__file__).resolve().parents[1]
    p = load_params(compose_params(root, [f"study={study}"], output=str(tmp_path / "params.yaml")))
    cfg = build(StudyConfig, p["study"], "study")
    needed = {a for c in fedptr_claims.claims(cfg) for a in (c.method, c.baseline)}
    assert needed == set(fedptr_claims.METHODS) | {"fedptr_s_once", "fedptr_fixed", "fedptr_noproj",
                                                   "fedprox_syn"}
    assert needed <= set(cfg.algorithms)


@pytest.mark.parametrize("study", ["fedptr_smoke", "fedptr_cifar10", "fedptr_cifar100",
                                   "fedptr_fmnist"])
def test_studies_compose_and_validate(study, tmp_path):
    from pathlib import Path

    from fedpipe.config.core import load_params
    from fedpipe.pipeline.common import train_config
    from fedpipe.pipeline.compose import compose_params
    from fedpipe.pipeline.partition import partition_stage_config

    root = Path(__file__).resolve().parents[1]
    p = load_params(compose_params(root, [f"study={study}"], output=str(tmp_path / "params.yaml")))
    assert p["partition"]["scheme"] == "dirichlet" and p["partition"]["alpha"] == 0.01
    assert len(p["study"]["seeds"]) >= 3 and p["study"]["diffusion_algorithms"] == []
    partition_stage_config(p)
    for algo in p["study"]["algorithms"]:
        train_config(p, algo, 0)
    if study != "fedptr_smoke":
        assert p["fl"]["local"]["batch_size"] == 500 and p["fl"]["local"]["lr"] == 0.01
        assert {"fedptr", "fedptr_s", "scaffold", "feddyn", "feddc"} <= set(p["study"]["algorithms"])


@pytest.mark.parametrize("overrides", [["partition.alpha=0.04", "fl.participation=0.3"],
                                       ["partition.num_clients=40", "fl.participation=0.25"]])
def test_other_columns_of_tables_1_2_compose(overrides, tmp_path):
    """The study files' documented overrides for the other columns (Dir(0.04), 50% / 30%, Table 2's
    40 clients at 25%) compose and validate."""
    from pathlib import Path

    from fedpipe.config.core import load_params
    from fedpipe.pipeline.compose import compose_params
    from fedpipe.pipeline.partition import partition_stage_config

    root = Path(__file__).resolve().parents[1]
    p = load_params(compose_params(root, ["study=fedptr_cifar100", *overrides],
                                   output=str(tmp_path / "params.yaml")))
    part = partition_stage_config(p)
    want = dict(o.split("=") for o in overrides)
    assert p["fl"]["participation"] == float(want["fl.participation"])
    assert part.partition.alpha == float(want.get("partition.alpha", 0.01))
    assert part.partition.num_clients == int(want.get("partition.num_clients", 10))


# -- MTT on normalised images -------------------------------------------------------------------
def test_normalised_view_shares_the_parameters_and_skips_only_the_normalisation():
    m = norm_model()
    view = on_normalised_inputs(m)
    x = torch.rand(5, *SHAPE, generator=torch.Generator().manual_seed(0))
    assert torch.equal(view((x - 0.3) / 0.4), m(x))
    assert not torch.allclose(view(x), m(x))
    assert isinstance(m.normalize, Normalize) and not m.normalize.identity  # the model is untouched
    assert all(a is b for (_, a), (_, b) in zip(view.named_parameters(), m.named_parameters(),
                                                strict=True))
    assert [n for n, _ in view.named_parameters()] == [n for n, _ in m.named_parameters()]
    plain = conv_model()
    assert on_normalised_inputs(plain) is plain  # nothing to remove


def test_mtt_and_projection_run_on_normalised_images():
    """FedPTR-S's MTT update and projection, on a model that normalises its inputs inside, are MTT's
    (its network on normalised images: the same network without the layer, on the same D~), bit for
    bit. Optimising raw pixels instead moves them 1 / std^2 = 6.25x further in normalised units."""
    cfg = algorithm_config("fedptr_s", {**SMALL, "dsa": False, "mtt_iterations": 1})
    s = ALGORITHMS["fedptr_s"](ClassificationTask(), norm_model, LOCAL, cfg, num_clients=3)
    plain = conv_model()
    assert_identical(plain.state_dict(), norm_model().state_dict())
    w_start = {k: v.detach() for k, v in plain.named_parameters()}
    g = torch.Generator().manual_seed(3)
    w_end = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in w_start.items()}
    z = torch.randn(6, *SHAPE, generator=g)
    syn = SyntheticSet.create(z, torch.tensor([0, 0, 1, 1, 2, 2]), 0.01)
    got, proj, _ = s.mtt_and_project(syn, w_start, w_end, True, torch.Generator().manual_seed(0))
    ref, _ = mtt_update(plain, syn, w_start, w_end, s.mtt_settings)
    assert torch.equal(got.x, ref.x) and torch.equal(got.beta, ref.beta)
    assert_identical(proj, project(plain, w_end, ref.x, ref.y, cfg.proj_lr, cfg.proj_steps))
    assert float((got.x - z).abs().max()) > 1e-3  # the images moved
    # the same first step taken on raw pixels (the model normalising inside), in normalised units
    raw = SyntheticSet.create(z * 0.4 + 0.3, syn.y, 0.01)
    raw1, _ = mtt_update(norm_model(), raw, w_start, w_end, s.mtt_settings)
    assert torch.allclose((raw1.x - raw.x) / 0.4, (got.x - z) / 0.4 ** 2, rtol=1e-3, atol=1e-6)


def test_client_side_set_starts_from_normalised_own_images():
    s = ALGORITHMS["fedptr"](ClassificationTask(), norm_model, LOCAL, algorithm_config("fedptr", SMALL),
                             num_clients=3)
    data = clients()[0]  # classes 0 and 1
    state = s.init_server(norm_model())
    _, cstate, _ = s.client_update(s.payload(state, 0), {}, data, torch.Generator().manual_seed(0), 0)
    x = cstate["syn"]["x"]
    own = {tuple(r.flatten().tolist()) for r in (data.x - 0.3) / 0.4}
    assert all(tuple(x[i].flatten().tolist()) in own for i in range(4))  # classes 0, 1: own images
    assert not any(tuple(x[i].flatten().tolist()) in own for i in (4, 5))  # class 2: noise
    assert float(x[:4].min()) < -0.5  # normalised units ((0 - 0.3) / 0.4 = -0.75 at the darkest)


# -- the ablation arm (Table 4) and the control --------------------------------------------------
def test_fixed_arm_is_client_side_fedptr_with_a_fixed_lambda():
    assert issubclass(ALGORITHMS["fedptr_fixed"], FedPTR)
    assert not algorithm_config("fedptr_fixed", None).layer_adaptive
    assert algorithm_config("fedptr", None).layer_adaptive
    s = strategy("fedptr")
    state = s.init_server(conv_model())
    for r in range(2):  # a stand-in trajectory
        state.weights = {k: v + 0.05 * (r + 1) for k, v in state.weights.items()}
        state = s.server_update(state, RoundInfo(index=r, total=4, seed=0))
    payload = s.payload(state, 2)  # t = 2 > m: MTT, projection, the pull

    def update(name, **cfg):
        u, _, _ = strategy(name, **cfg).client_update(payload, {}, clients()[0],
                                                      torch.Generator().manual_seed(1), 0)
        return u.weights
    fixed = update("fedptr_fixed")
    assert_identical(fixed, update("fedptr", layer_adaptive=False))
    assert not torch.equal(fixed["head.weight"], update("fedptr")["head.weight"])


def test_noproj_control_pulls_toward_the_current_model():
    """fedptr_noproj: no synthetic set and no MTT; in rounds t > m the pull, layer-adaptive with a
    constant size lambda, aims at w^t itself. Two full-batch local steps by hand: the first has
    w = w^t (no pull), the second lambda (w_[j] - w^t_[j]) / ||w_[j] - w^t_[j]|| per layer."""
    assert issubclass(ALGORITHMS["fedptr_noproj"], FedPTRS)
    lam, lr = 0.3, 0.1
    local = LocalTrainConfig(steps=2, batch_size=4, lr=lr, momentum=0.5)
    s = ALGORITHMS["fedptr_noproj"](ClassificationTask(), two_layer, local,
                                    algorithm_config("fedptr_noproj", {"lam": lam}), num_clients=1)
    state = s.init_server(two_layer())
    for r in range(2):
        state.weights = {k: v + 0.1 * (r + 1) for k, v in state.weights.items()}
        state = s.server_update(state, RoundInfo(index=r, total=3, seed=0))
        assert ("proj" in s.payload(state, r + 1).extra) == (r + 1 > 1)  # rounds t > m = 1 only
    assert "syn" not in state.extra and "mtt_updates" not in state.meta
    payload = s.payload(state, 2)
    w0 = state.weights
    assert_identical(payload.extra["proj"], w0)  # the target is w^t
    x = torch.tensor([[1.0, -1.0], [0.5, 2.0], [-1.5, 0.0], [2.0, 1.0]], dtype=DT)
    y = torch.tensor([0, 2, 1, 2])
    update, _, _ = s.client_update(payload, {}, ClientData(x, y), torch.Generator().manual_seed(0), 0)
    g0 = hand_ce_grads(w0, x, y)
    w1 = {n: w0[n] - lr * g0[n] for n in w0}
    g1 = hand_ce_grads(w1, x, y)
    for layer in ("0", "1"):
        names = (f"{layer}.weight", f"{layer}.bias")
        norm = math.sqrt(sum(float(((w1[n] - w0[n]) ** 2).sum()) for n in names))
        for n in names:
            buf = 0.5 * g0[n] + g1[n] + lam * (w1[n] - w0[n]) / norm
            assert torch.allclose(update.weights[n], w1[n] - lr * buf, atol=1e-9), n
    with pytest.raises(ConfigError):
        algorithm_config("fedptr_noproj", {"target": "previous"})


DATASET_SIZES = {"cifar10": (10, 5000, 1000), "cifar100": (100, 500, 100),
                 "fashion_mnist": (10, 6000, 1000)}
"""Classes, training and test images per class of the official splits the presets read."""


@pytest.mark.parametrize("study", ["fedptr_cifar10", "fedptr_cifar100", "fedptr_fmnist"])
def test_paper_presets_draw_a_partition_for_every_replicate(study, tmp_path):
    """Dir(0.01) over 10 clients with min_size 10 and the preset's max_retries finds a draw for each
    replicate on the dataset's class sizes (the data are not needed: only labels are drawn from)."""
    import hashlib
    from pathlib import Path

    import numpy as np

    from fedpipe.config.core import load_params
    from fedpipe.data.partition import make_partition
    from fedpipe.pipeline.compose import compose_params
    from fedpipe.pipeline.partition import partition_stage_config

    root = Path(__file__).resolve().parents[1]
    p = load_params(compose_params(root, [f"study={study}"], output=str(tmp_path / "params.yaml")))
    draws = set()
    for seed in p["study"]["seeds"]:
        cfg = partition_stage_config(p, seed)
        c, n_train, n_test = DATASET_SIZES[cfg.dataset.name]
        part = make_partition(np.repeat(np.arange(c), n_train), np.repeat(np.arange(c), n_test), c,
                              cfg.partition, cfg.seed, cfg.dataset.name)
        assert min(len(t) for t in part.train) >= cfg.partition.min_size == 10
        draws.add(hashlib.sha256(b"".join(t.tobytes() for t in part.train)).hexdigest())
    assert len(draws) == len(p["study"]["seeds"])


def test_a_model_with_batchnorm_is_refused_before_any_data_loads_except_for_the_control():
    """MTT's torch.func unroll cannot update BatchNorm running statistics (an in-place add on a
    captured tensor at the first MTT round): the config check refuses it with one line naming
    model.name; the no-MTT control (fedptr_noproj) trains such a model."""
    from fedpipe.config import ConfigError
    from fedpipe.config.dataset import dataset_config
    from fedpipe.config.fl import fl_config, model_config
    from fedpipe.pipeline.common import _check_method_model

    ds = dataset_config({"name": "digits"})
    bn = model_config({"name": "resnet8"})
    for name in ("fedptr", "fedptr_s", "fedptr_s_once", "fedptr_fixed"):
        with pytest.raises(ConfigError, match=r"model\.name.*BatchNorm"):
            _check_method_model(name, algorithm_config(name, {}), bn, ds, fl_config({}))
    _check_method_model("fedptr_noproj", algorithm_config("fedptr_noproj", {}), bn, ds,
                        fl_config({}))
    _check_method_model("fedptr", algorithm_config("fedptr", {}), model_config({"name": "mlp"}),
                        ds, fl_config({}))
