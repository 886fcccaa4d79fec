"""FedProx, SCAFFOLD, FedDyn, FedDC and MoFedSAM against hand-computed steps (their determinism and
checkpoint-resume through the round loop: the method contract, tests/test_contract.py).

The hand computations use a linear model w in R^2 (no bias) and the loss
L(w) = mean_j (x_j . w - y_j)^2 on two fixed samples, whose gradient is
grad L(w) = (2/n) sum_j (x_j . w - y_j) x_j. Each local run is full-batch SGD, so the expected
weights follow from plain arithmetic on Python floats (float64 models, tolerance 1e-12).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from fakes import MSETask
from torch import nn

from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.config import ConfigError
from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl import ClientUpdate, Payload, RoundInfo, ServerState

DT = torch.float64
X = [[1.0, 2.0], [3.0, -1.0]]
Y = [1.0, 2.0]
W0 = [0.5, -0.25]
LR = 0.1


# -- the hand-computed problem ------------------------------------------------------------------
def residuals(w):
    return [x[0] * w[0] + x[1] * w[1] - y for x, y in zip(X, Y, strict=True)]


def loss(w):
    return sum(r * r for r in residuals(w)) / len(X)


def grad(w):
    r = residuals(w)
    return [2 / len(X) * sum(rj * x[d] for rj, x in zip(r, X, strict=True)) for d in range(2)]


def add(*vs):
    return [sum(c) for c in zip(*vs, strict=True)]


def sub(a, b):
    return [ai - bi for ai, bi in zip(a, b, strict=True)]


def mul(s, a):
    return [s * ai for ai in a]


def rnd(updates, index: int = 0) -> RoundInfo:
    """The server hooks' view of a round with these updates."""
    return RoundInfo(index=index, total=10, seed=0, updates=tuple(updates))


def norm(a):
    return math.sqrt(sum(ai * ai for ai in a))


def linear_model() -> nn.Module:
    return nn.Linear(2, 1, bias=False).to(DT)


def client_data() -> ClientData:
    return ClientData(torch.tensor(X, dtype=DT), torch.tensor(Y, dtype=DT).reshape(-1, 1))


def T(v) -> torch.Tensor:
    """A (1, 2) weight tensor (the shape of nn.Linear(2, 1).weight)."""
    return torch.tensor([v], dtype=DT)


def W(v) -> dict[str, torch.Tensor]:
    return {"weight": T(v)}


def close(t: torch.Tensor, expected) -> None:
    torch.testing.assert_close(t, T(expected), rtol=0, atol=1e-12)


def strategy(name, cfg=None, *, steps=1, lr=LR, lr_decay=1.0, aggregation="uniform", num_clients=4,
             task=None, model_fn=linear_model):
    local = LocalTrainConfig(steps=steps, batch_size=len(X), lr=lr, optimizer="sgd", lr_decay=lr_decay)
    return ALGORITHMS[name](task or MSETask(), model_fn, local, algorithm_config(name, cfg),
                            aggregation=aggregation, num_clients=num_clients)


def run_client(s, payload, client_state=None, data=None):
    gen = torch.Generator().manual_seed(0)
    return s.client_update(payload, client_state or {}, data or client_data(), gen, 7)


# -- FedProx -------------------------------------------------------------------------------------
def test_fedprox_proximal_term_on_the_second_step():
    mu = 0.5
    s = strategy("fedprox", {"mu": mu}, steps=2)
    update, _, metrics = run_client(s, Payload(0, W(W0)))
    # step 1 starts at w^t: the proximal gradient mu (w - w^t) is 0
    w1 = sub(W0, mul(LR, grad(W0)))
    # step 2: grad F(w1) + mu (w1 - w^t)
    w2 = sub(w1, mul(LR, add(grad(w1), mul(mu, sub(w1, W0)))))
    close(update.weights["weight"], w2)
    # the reported loss is the local objective h_k = F + mu/2 ||w - w^t||^2, averaged over steps
    expected = (loss(W0) + loss(w1) + mu / 2 * norm(sub(w1, W0)) ** 2) / 2
    assert metrics["loss"] == pytest.approx(expected, abs=1e-12)
    assert update.num_samples == 2 and update.client_id == 7


# -- SCAFFOLD ------------------------------------------------------------------------------------
def test_scaffold_corrected_steps_and_option2_control_variate():
    c, c_i = [0.3, -0.2], [-0.1, 0.4]
    s = strategy("scaffold", steps=2, lr_decay=0.5)
    eta = LR * 0.5  # eta_l of round 1
    update, state, _ = run_client(s, Payload(1, W(W0), {"c": {"weight": T(c)}}), {"c_i": {"weight": T(c_i)}})
    corr = sub(c, c_i)
    y1 = sub(W0, mul(eta, add(grad(W0), corr)))
    y2 = sub(y1, mul(eta, add(grad(y1), corr)))
    close(update.weights["weight"], y2)
    c_i_new = add(sub(c_i, c), mul(1 / (2 * eta), sub(W0, y2)))  # option II
    close(state["c_i"]["weight"], c_i_new)
    close(state["c_i"]["weight"], mul(0.5, add(grad(W0), grad(y1))))  # = mean gradient on the path
    close(update.extra["dc"]["weight"], sub(c_i_new, c_i))


def test_scaffold_server_update():
    x, c = [1.0, -1.0], [0.2, 0.1]
    y_a, y_b = [1.5, -0.5], [0.0, -2.0]
    dc_a, dc_b = [0.4, -0.4], [1.0, 2.0]
    updates = [ClientUpdate(1, 1, W(y_a), {"dc": {"weight": T(dc_a)}}),
               ClientUpdate(3, 3, W(y_b), {"dc": {"weight": T(dc_b)}})]
    state = ServerState(W(x), {"c": {"weight": T(c)}})
    for aggregation, p in (("weighted", [0.25, 0.75]), ("uniform", [0.5, 0.5])):
        s = strategy("scaffold", {"global_lr": 0.5}, aggregation=aggregation, num_clients=4)
        new = s.aggregate(state, rnd(updates))
        dy = add(mul(p[0], sub(y_a, x)), mul(p[1], sub(y_b, x)))
        close(new.weights["weight"], add(x, mul(0.5, dy)))  # x + eta_g avg dy_i
        close(new.extra["c"]["weight"], add(c, mul(1 / 4, add(dc_a, dc_b))))  # c + |S|/N avg dc_i


def test_scaffold_needs_the_number_of_clients():
    s = strategy("scaffold", num_clients=1)
    updates = [ClientUpdate(i, 1, W(W0), {"dc": {"weight": T([0.0, 0.0])}}) for i in range(2)]
    with pytest.raises(ValueError, match="num_clients"):
        s.aggregate(ServerState(W(W0), {"c": {"weight": T([0.0, 0.0])}}), rnd(updates))


# -- FedDyn --------------------------------------------------------------------------------------
def test_feddyn_linear_term_and_gradient_state():
    alpha, g_prev = 0.5, [0.2, -0.6]
    s = strategy("feddyn", {"alpha": alpha}, steps=2)
    update, state, _ = run_client(s, Payload(0, W(W0)), {"grad": {"weight": T(g_prev)}})
    # grad of L(theta) - <g_prev, theta> + alpha/2 ||theta - theta^{t-1}||^2
    th1 = sub(W0, mul(LR, sub(grad(W0), g_prev)))
    th2 = sub(th1, mul(LR, add(sub(grad(th1), g_prev), mul(alpha, sub(th1, W0)))))
    close(update.weights["weight"], th2)
    close(state["grad"]["weight"], sub(g_prev, mul(alpha, sub(th2, W0))))


def test_feddyn_server_update():
    alpha, theta, h = 0.5, [1.0, -1.0], [0.2, 0.1]
    th_a, th_b = [1.5, -0.5], [0.0, -2.0]
    s = strategy("feddyn", {"alpha": alpha}, num_clients=4)
    new = s.aggregate(ServerState(W(theta), {"h": {"weight": T(h)}}),
                      rnd([ClientUpdate(0, 1, W(th_a)), ClientUpdate(2, 3, W(th_b))]))
    h_new = sub(h, mul(alpha / 4, add(sub(th_a, theta), sub(th_b, theta))))
    close(new.extra["h"]["weight"], h_new)
    close(new.weights["weight"], sub(mul(0.5, add(th_a, th_b)), mul(1 / alpha, h_new)))


# -- FedDC ---------------------------------------------------------------------------------------
def test_feddc_drift_penalty_correction_and_upload():
    alpha, h, c, c_i = 0.5, [0.1, 0.2], [0.3, -0.2], [-0.1, 0.4]
    s = strategy("feddc", {"alpha": alpha}, steps=2)
    update, state, _ = run_client(s, Payload(0, W(W0), {"c": {"weight": T(c)}}),
                                  {"h": {"weight": T(h)}, "c_i": {"weight": T(c_i)}})
    corr = sub(c, c_i)
    # grad of L(theta) + alpha/2 ||theta + h - w||^2, plus c - c_i
    th1 = sub(W0, mul(LR, add(grad(W0), mul(alpha, h), corr)))
    th2 = sub(th1, mul(LR, add(grad(th1), mul(alpha, sub(add(th1, h), W0)), corr)))
    h_new = add(h, sub(th2, W0))
    c_i_new = add(sub(c_i, c), mul(1 / (2 * LR), sub(W0, th2)))
    close(state["h"]["weight"], h_new)
    close(state["c_i"]["weight"], c_i_new)
    close(update.weights["weight"], add(th2, h_new))  # upload theta_i + h_i
    close(update.extra["dc"]["weight"], sub(c_i_new, c_i))


def feddc_round(drift_average):
    """Three clients; client 0 has drift h0 and is not sampled; clients 1 and 2 upload."""
    w, c = [1.0, -1.0], [0.2, 0.1]
    h0, h1, h2 = [0.1, 0.0], [0.0, 0.2], [0.2, 0.1]  # drifts before the round
    th1, th2 = [1.5, -0.5], [0.0, -2.0]  # local models after the round
    h1n, h2n = add(h1, sub(th1, w)), add(h2, sub(th2, w))
    dc1, dc2 = [0.4, -0.4], [1.0, 2.0]
    updates = [ClientUpdate(1, 1, W(add(th1, h1n)),
                            {"dc": {"weight": T(dc1)}, "dh": {"weight": T(sub(th1, w))}}),
               ClientUpdate(2, 3, W(add(th2, h2n)),
                            {"dc": {"weight": T(dc2)}, "dh": {"weight": T(sub(th2, w))}})]
    s = strategy("feddc", {"drift_average": drift_average}, aggregation="uniform", num_clients=3)
    extra = {"c": {"weight": T(c)}}
    if drift_average == "all_clients":
        extra["hsum"] = {"weight": T(add(h0, h1, h2))}
    new = s.aggregate(ServerState(W(w), extra), rnd(updates))
    close(new.extra["c"]["weight"], add(c, mul(1 / 3, add(dc1, dc2))))
    return new, dict(th1=th1, th2=th2, h0=h0, h1n=h1n, h2n=h2n)


def test_feddc_server_averages_uploads():
    new, v = feddc_round("participants")
    close(new.weights["weight"], mul(0.5, add(v["th1"], v["h1n"], v["th2"], v["h2n"])))


def test_feddc_server_all_clients_drift_mean():
    new, v = feddc_round("all_clients")
    # the authors' code: mean of the participants' theta_i + mean of all N clients' h_i
    expected = add(mul(0.5, add(v["th1"], v["th2"])), mul(1 / 3, add(v["h0"], v["h1n"], v["h2n"])))
    close(new.weights["weight"], expected)
    close(new.extra["hsum"]["weight"], add(v["h0"], v["h1n"], v["h2n"]))


# -- MoFedSAM ------------------------------------------------------------------------------------
def test_mofedsam_sam_steps_with_momentum_mixing():
    rho, alpha, delta = 0.1, 0.3, [0.2, -0.4]
    s = strategy("mofedsam", {"rho": rho, "alpha": alpha}, steps=2)
    update, _, metrics = run_client(s, Payload(0, W(W0), {"delta": {"weight": T(delta)}}))

    def sam_step(w):
        g = grad(w)
        perturbed = add(w, mul(rho / norm(g), g))  # w + e, e = rho g / ||g||
        v = add(mul(alpha, grad(perturbed)), mul(1 - alpha, delta))
        return sub(w, mul(LR, v))

    x1 = sam_step(W0)
    x2 = sam_step(x1)  # the second step starts from x1 (the perturbation was undone)
    torch.testing.assert_close(update.weights["weight"], T(x2), rtol=0, atol=1e-10)
    torch.testing.assert_close(update.extra["delta"]["weight"], T(mul(1 / (2 * LR), sub(W0, x2))),
                               rtol=0, atol=1e-10)
    # the reported loss is the loss at the unperturbed points
    assert metrics["loss"] == pytest.approx((loss(W0) + loss(x1)) / 2, abs=1e-12)


def test_mofedsam_server_update():
    x, d = [1.0, -1.0], [0.3, 0.3]
    s = strategy("mofedsam", {"global_lr": 0.5}, aggregation="weighted")
    new = s.aggregate(ServerState(W(x), {"delta": {"weight": T(d)}}),
                      rnd([ClientUpdate(0, 1, W([2.0, 0.0]), {"delta": {"weight": T([1.0, 2.0])}}),
                           ClientUpdate(1, 3, W([0.0, 2.0]), {"delta": {"weight": T([-1.0, 0.0])}})]))
    close(new.weights["weight"], add(x, mul(0.5, sub([0.5, 1.5], x))))
    close(new.extra["delta"]["weight"], [-0.5, 0.5])


class NoisyTask:
    """A loss that draws noise from the generator; records the draws."""

    name = "noisy"

    def __init__(self):
        self.draws: list[float] = []

    def loss(self, model, batch, generator):
        x, y = batch
        noise = torch.randn((), generator=generator, dtype=DT)
        self.draws.append(float(noise))
        return F.mse_loss(model(x) + noise, y)


def test_sam_passes_share_the_stochastic_loss():
    task = NoisyTask()
    s = strategy("mofedsam", steps=2, task=task)
    run_client(s, Payload(0, W(W0), {"delta": {"weight": T([0.0, 0.0])}}))
    a, b, c, d = task.draws
    assert a == b and c == d and a != c


def test_sam_restores_buffers_after_the_second_pass():
    def bn_model():
        return nn.Sequential(nn.BatchNorm1d(2), nn.Linear(2, 1, bias=False)).to(DT)

    s = strategy("mofedsam", model_fn=bn_model)
    init = bn_model().state_dict()
    update, _, _ = run_client(s, Payload(0, init, {"delta": {"1.weight": torch.zeros(1, 2, dtype=DT)}}))
    # BatchNorm's input does not depend on the weights: one update with momentum 0.1, not two
    torch.testing.assert_close(update.weights["0.running_mean"], 0.1 * torch.tensor(X, dtype=DT).mean(0))
    assert int(update.weights["0.num_batches_tracked"]) == 1


# -- configs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "bad"), [
    ("fedprox", {"mu": -0.1}), ("scaffold", {"global_lr": 0.0}), ("feddyn", {"alpha": 0.0}),
    ("feddc", {"alpha": -1.0}), ("feddc", {"drift_average": "everyone"}), ("mofedsam", {"rho": -1.0}),
    ("mofedsam", {"alpha": 1.5}), ("mofedsam", {"momentum": 0.1}),
])
def test_invalid_hyperparameters_name_the_key(name, bad):
    with pytest.raises(ConfigError) as err:
        algorithm_config(name, bad)
    assert err.value.key == f"algorithms.{name}.{next(iter(bad))}"
