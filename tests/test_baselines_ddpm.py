"""SCAFFOLD's and MoFedSAM's optimizer-independent rules (the DDPM track trains with Adam).

SCAFFOLD's option II, c_i+ = c_i - c + (x - y_i) / (K eta_l), and MoFedSAM's
Delta_i = (x^r - x_{i,K}) / (K eta_l) read a gradient off the local displacement, which is right
only for plain SGD steps. Under Adam the displacement is Adam's normalised step (about lr per
coordinate per step whatever the gradient's size), so the "gradient" they produce is about 1 per
coordinate; the ``mean_gradient`` rules average the gradients the optimizer was fed instead. These
tests check, on the linear model of tests/test_algorithms.py (w in R^2, no bias,
L(w) = mean_j (x_j . w - y_j)^2 on two samples, full batch, float64) with hand-computed values:

- under SGD the mean-gradient rules give option II's / the displacement's value (same paper
  algorithm, bit for bit up to float rounding);
- under Adam the mean-gradient rules stay in gradient units (they scale with the loss) while the
  displacement rules give Adam's normalised step (sign(g) after one step, whatever the scale);
- ``auto`` keeps the paper's rule for SGD (the classification track) and switches for Adam;
- through the strategies, SCAFFOLD and MoFedSAM trained by Adam keep gradients as c_i and Delta_i.
"""

from __future__ import annotations

import pytest
import torch
from fakes import MSETask
from torch import nn

from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.algorithms.mofedsam import (
    delta_rule,
    displacement_delta,
    mean_gradient_delta,
    momentum_mix_hook,
    sam_grads_fn,
)
from fedpipe.algorithms.scaffold import (
    control_variate_rule,
    mean_gradient_control_variate,
    option2_control_variate,
)
from fedpipe.config import ConfigError
from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl import Payload
from fedpipe.fl.local import accumulate_gradients, corrected_grad_hook, local_train
from fedpipe.fl.state import clone, trainable

DT = torch.float64
X = [[1.0, 2.0], [3.0, -1.0]]
Y = [1.0, 2.0]
W0 = [0.5, -0.25]
LR = 0.1
C, C_I = [0.3, -0.2], [-0.1, 0.4]


def grad(w, scale=1.0):
    r = [x[0] * w[0] + x[1] * w[1] - y for x, y in zip(X, Y, strict=True)]
    return [scale * 2 / len(X) * sum(rj * x[d] for rj, x in zip(r, X, strict=True)) for d in range(2)]


def T(v) -> torch.Tensor:
    return torch.tensor([v], dtype=DT)


def close(t: torch.Tensor, expected, atol=1e-12) -> None:
    torch.testing.assert_close(t, T(expected), rtol=0, atol=atol)


class ScaledMSE(MSETask):
    """The MSE loss times ``scale``: the same minimiser, gradients ``scale`` times larger."""

    def __init__(self, scale: float):
        self.scale = scale

    def loss(self, model, batch, generator):
        return self.scale * super().loss(model, batch, generator)


def model_at(w) -> nn.Module:
    m = nn.Linear(2, 1, bias=False).to(DT)
    with torch.no_grad():
        m.weight.copy_(T(w))
    return m


def data() -> ClientData:
    return ClientData(torch.tensor(X, dtype=DT), torch.tensor(Y, dtype=DT).reshape(-1, 1))


def local(optimizer: str, steps: int) -> LocalTrainConfig:
    return LocalTrainConfig(steps=steps, batch_size=len(X), lr=LR, optimizer=optimizer)


def scaffold_client(optimizer: str, steps: int, scale: float = 1.0, c=C, c_i=C_I):
    """One SCAFFOLD client from W0 with the gradient correction c - c_i; returns
    (x, y, grad_sum, K)."""
    model = model_at(W0)
    params = trainable(model)
    x = clone(model.state_dict())
    correction = {"weight": T(c) - T(c_i)}
    grad_sum = {"weight": torch.zeros(1, 2, dtype=DT)}
    metrics = local_train(model, data(), ScaledMSE(scale), local(optimizer, steps), 0,
                          torch.Generator().manual_seed(0),
                          grad_hook=corrected_grad_hook(params, correction, grad_sum))
    return x, clone(model.state_dict()), grad_sum, metrics["steps"]


# -- SCAFFOLD ------------------------------------------------------------------------------------
def test_control_variate_rule_keeps_option2_for_sgd():
    assert control_variate_rule("auto", "sgd") == "option2"
    assert control_variate_rule("auto", "adam") == "mean_gradient"
    assert control_variate_rule("option2", "adam") == "option2"
    assert control_variate_rule("mean_gradient", "sgd") == "mean_gradient"


def test_mean_gradient_equals_option2_under_sgd():
    x, y, grad_sum, k = scaffold_client("sgd", steps=2)
    corr = [a - b for a, b in zip(C, C_I, strict=True)]
    y1 = [w - LR * (g + d) for w, g, d in zip(W0, grad(W0), corr, strict=True)]
    y2 = [w - LR * (g + d) for w, g, d in zip(y1, grad(y1), corr, strict=True)]
    close(y["weight"], y2)  # the corrected steps (Alg. 1 line 10)
    mean_g = [(a + b) / 2 for a, b in zip(grad(W0), grad(y1), strict=True)]  # raw, uncorrected
    c_i = {"weight": T(C_I)}
    by_mean = mean_gradient_control_variate(grad_sum, k, c_i)
    by_option2 = option2_control_variate(c_i, {"weight": T(C)}, x, y, k, LR)
    close(by_mean["weight"], mean_g)
    close(by_option2["weight"], mean_g)


def test_under_adam_mean_gradient_is_a_gradient_and_option2_is_adams_step():
    # one Adam step from a fresh state moves each coordinate by lr * g / (|g| + eps) = lr sign(g)
    g0 = grad(W0)
    for scale in (1.0, 1000.0):
        x, y, grad_sum, k = scaffold_client("adam", steps=1, scale=scale, c=[0, 0], c_i=[0, 0])
        zero = {"weight": torch.zeros(1, 2, dtype=DT)}
        close(mean_gradient_control_variate(grad_sum, k, zero)["weight"], [scale * g for g in g0],
              atol=1e-9 * scale)
        # option II reads sign(g) off Adam's step: the same for both scales, not a gradient
        close(option2_control_variate(zero, zero, x, y, k, LR)["weight"],
              [1.0 if g > 0 else -1.0 for g in g0], atol=1e-6)


def test_under_adam_the_mean_gradient_variate_scales_with_the_loss():
    # Adam's trajectory does not depend on the loss's scale (up to eps), so the mean raw gradient
    # scales exactly with it; the correction, in gradient units, then scales along (scale-correct)
    runs = {s: scaffold_client("adam", steps=4, scale=s, c=[0.01 * s, 0.02 * s], c_i=[0, -0.03 * s])
            for s in (1.0, 50.0)}
    (_, y1, g1, k1), (_, y50, g50, k50) = runs[1.0], runs[50.0]
    torch.testing.assert_close(y1["weight"], y50["weight"], rtol=0, atol=1e-7)  # Adam eps
    zero = {"weight": torch.zeros(1, 2, dtype=DT)}
    torch.testing.assert_close(mean_gradient_control_variate(g50, k50, zero)["weight"],
                               50 * mean_gradient_control_variate(g1, k1, zero)["weight"],
                               rtol=1e-6, atol=0)


def test_a_client_without_steps_keeps_its_control_variate():
    c_i = {"weight": T(C_I)}
    out = mean_gradient_control_variate({"weight": torch.zeros(1, 2, dtype=DT)}, 0, c_i)
    close(out["weight"], C_I)
    assert out["weight"] is not c_i["weight"]


def test_accumulate_gradients_skips_parameters_without_a_gradient():
    a, b = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2))
    a.grad = torch.tensor([1.0, -2.0])
    total = {"a": torch.ones(2), "b": torch.ones(2)}
    accumulate_gradients(total, {"a": a, "b": b})
    torch.testing.assert_close(total["a"], torch.tensor([2.0, -1.0]))
    torch.testing.assert_close(total["b"], torch.ones(2))


def test_corrected_grad_hook_records_the_gradient_before_correcting_it():
    p = nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([1.0, 2.0])
    grad_sum = {"p": torch.zeros(2)}
    corrected_grad_hook({"p": p}, {"p": torch.tensor([10.0, 20.0])}, grad_sum)(nn.Module())
    torch.testing.assert_close(grad_sum["p"], torch.tensor([1.0, 2.0]))
    torch.testing.assert_close(p.grad, torch.tensor([11.0, 22.0]))


# -- MoFedSAM ------------------------------------------------------------------------------------
def mofedsam_client(optimizer: str, steps: int, alpha: float, delta, rho: float = 0.0,
                    scale: float = 1.0):
    """One MoFedSAM client from W0 with global momentum ``delta``; returns (x, x_K, v_sum, K)."""
    model = model_at(W0)
    params = trainable(model)
    x = clone(model.state_dict())
    v_sum = {"weight": torch.zeros(1, 2, dtype=DT)}
    gen = torch.Generator().manual_seed(0)
    task = ScaledMSE(scale)
    metrics = local_train(model, data(), task, local(optimizer, steps), 0, gen,
                          grads_fn=sam_grads_fn(params, rho, gen),
                          grad_hook=momentum_mix_hook(params, alpha, {"weight": T(delta)}, v_sum))
    return x, clone(model.state_dict()), v_sum, metrics["steps"]


def test_delta_rule_keeps_the_displacement_for_sgd():
    assert delta_rule("auto", "sgd") == "displacement"
    assert delta_rule("auto", "adam") == "mean_gradient"
    assert delta_rule("displacement", "adam") == "displacement"


def test_mean_gradient_delta_equals_the_displacement_under_sgd():
    alpha, delta = 0.25, [0.2, -0.6]
    x, x_k, v_sum, k = mofedsam_client("sgd", steps=2, alpha=alpha, delta=delta)  # rho 0: g_sam = g
    v1 = [alpha * g + (1 - alpha) * d for g, d in zip(grad(W0), delta, strict=True)]
    w1 = [w - LR * v for w, v in zip(W0, v1, strict=True)]
    v2 = [alpha * g + (1 - alpha) * d for g, d in zip(grad(w1), delta, strict=True)]
    w2 = [w - LR * v for w, v in zip(w1, v2, strict=True)]
    close(x_k["weight"], w2)
    mean_v = [(a + b) / 2 for a, b in zip(v1, v2, strict=True)]
    close(mean_gradient_delta(v_sum, k)["weight"], mean_v)
    close(displacement_delta(x, x_k, k, LR, ["weight"])["weight"], mean_v)


def test_with_sam_the_two_deltas_still_agree_under_sgd():
    x, x_k, v_sum, k = mofedsam_client("sgd", steps=3, alpha=0.1, delta=[0.3, 0.1], rho=0.05)
    torch.testing.assert_close(mean_gradient_delta(v_sum, k)["weight"],
                               displacement_delta(x, x_k, k, LR, ["weight"])["weight"],
                               rtol=0, atol=1e-12)


def test_under_adam_the_displacement_delta_is_adams_sign_step():
    # Delta^0 = 0 and one Adam step: v = alpha g, the step is lr sign(v) whatever alpha and the
    # loss's scale; the mean-gradient Delta is alpha g, in gradient units
    alpha = 0.1
    for scale in (1.0, 1000.0):
        x, x_k, v_sum, k = mofedsam_client("adam", steps=1, alpha=alpha, delta=[0.0, 0.0],
                                           scale=scale)
        g0 = grad(W0, scale)
        close(mean_gradient_delta(v_sum, k)["weight"], [alpha * g for g in g0], atol=1e-9 * scale)
        close(displacement_delta(x, x_k, k, LR, ["weight"])["weight"],
              [1.0 if g > 0 else -1.0 for g in g0], atol=1e-6)


def test_under_adam_a_sign_delta_reproduces_itself():
    # the divergence of the displacement rule: once |Delta| = 1 per coordinate (Adam's step),
    # (1 - alpha) Delta swamps alpha g and the next Delta is the same sign vector again (up to
    # Adam's m / sqrt(v) <= 1), whatever the data; the mean-gradient rule shrinks it by (1 - alpha)
    alpha, delta = 0.1, [1.0, -1.0]
    x, x_k, v_sum, k = mofedsam_client("adam", steps=3, alpha=alpha, delta=delta)
    again = displacement_delta(x, x_k, k, LR, ["weight"])["weight"]
    assert torch.equal(torch.sign(again), T(delta))
    assert float(again.abs().min()) > 0.95
    mean_v = mean_gradient_delta(v_sum, k)["weight"]
    assert float(mean_v.abs().max()) < 1.0 - alpha + alpha * 2.0  # |g| < 2 along this path


def test_a_client_without_steps_has_zero_delta():
    v = {"weight": torch.zeros(1, 2, dtype=DT)}
    close(mean_gradient_delta(v, 0)["weight"], [0.0, 0.0])
    close(displacement_delta({"weight": T(W0)}, {"weight": T(W0)}, 0, LR, ["weight"])["weight"],
          [0.0, 0.0])


# -- configs ---------------------------------------------------------------------------------------
def test_defaults_are_auto():
    assert algorithm_config("scaffold", None).control_variate == "auto"
    assert algorithm_config("mofedsam", None).delta == "auto"
    assert algorithm_config("scaffold", {"control_variate": "mean_gradient"}).control_variate == (
        "mean_gradient")


@pytest.mark.parametrize(("name", "bad"), [("scaffold", {"control_variate": "option1"}),
                                           ("mofedsam", {"delta": "step"})])
def test_unknown_rules_name_the_key(name, bad):
    with pytest.raises(ConfigError) as err:
        algorithm_config(name, bad)
    assert err.value.key == f"algorithms.{name}.{next(iter(bad))}"


# -- through the strategies (Adam, as on the DDPM track) -------------------------------------------
def adam_strategy(name, cfg=None, steps=1):
    return ALGORITHMS[name](MSETask(), lambda: nn.Linear(2, 1, bias=False).to(DT),
                            local("adam", steps), algorithm_config(name, cfg), aggregation="uniform",
                            num_clients=4)


def test_scaffold_with_adam_keeps_a_gradient_as_control_variate():
    payload = Payload(0, {"weight": T(W0)}, {"c": {"weight": T(C)}})
    update, state, _ = adam_strategy("scaffold").client_update(
        payload, {"c_i": {"weight": T(C_I)}}, data(), torch.Generator().manual_seed(0), 7)
    close(state["c_i"]["weight"], grad(W0))  # K = 1: the raw gradient at x
    close(update.extra["dc"]["weight"], [g - ci for g, ci in zip(grad(W0), C_I, strict=True)])
    # option II, forced under Adam: c_i - c + sign(g + c - c_i), Adam's first step over lr
    _, state2, _ = adam_strategy("scaffold", {"control_variate": "option2"}).client_update(
        payload, {"c_i": {"weight": T(C_I)}}, data(), torch.Generator().manual_seed(0), 7)
    fed = [g + c - ci for g, c, ci in zip(grad(W0), C, C_I, strict=True)]
    close(state2["c_i"]["weight"], [ci - c + (1.0 if v > 0 else -1.0)
                                    for ci, c, v in zip(C_I, C, fed, strict=True)], atol=1e-6)


def test_mofedsam_with_adam_keeps_a_gradient_as_momentum():
    alpha = 0.1
    payload = Payload(0, {"weight": T(W0)}, {"delta": {"weight": T([0.0, 0.0])}})
    update, _, _ = adam_strategy("mofedsam", {"rho": 0.0, "alpha": alpha}).client_update(
        payload, {}, data(), torch.Generator().manual_seed(0), 7)
    close(update.extra["delta"]["weight"], [alpha * g for g in grad(W0)])  # not sign(g)
