"""SCAFFOLD (Karimireddy et al., ICML 2020, "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning"), Algorithm 1 with option II control variates (with SGD; see below for Adam).

Notation: x global model, y_i client i's local model, c the server control variate, c_i client i's
control variate, K local steps, eta_l local lr, eta_g global lr, S the sampled clients, N all clients.

Client i (Alg. 1 lines 7-13)::

    y_i <- x
    K times:  y_i <- y_i - eta_l (g_i(y_i) + c - c_i)              # line 10, corrected local step
    c_i+ <- c_i - c + (x - y_i) / (K eta_l)                        # line 12, option II
    send (dy_i, dc_i) = (y_i - x, c_i+ - c_i);  c_i <- c_i+        # lines 13-14

Server (lines 16-17)::

    x <- x + eta_g * avg_{i in S} dy_i
    c <- c + (|S| / N) * (1/|S|) sum_{i in S} dc_i   =  c + (1/N) sum_{i in S} dc_i

Implementation choices (documented, not in the paper):

- ``avg dy_i`` follows ``fl.aggregation`` (sample-count weights by default; the paper writes the
  uniform 1/|S|, which is ``fl.aggregation=uniform``). The control-variate update keeps the paper's
  (1/N) sum, because c must stay the average of all N c_i.
- K is the number of local steps actually taken and eta_l the local lr of the round
  (``fl.local.lr * lr_decay^round``). With momentum or Adam the correction is added to the gradient
  before the optimizer step (inferred; docs/papers/baselines.md).
- c and c_i are gradients. Option II reads c_i+ off the displacement, which is right for plain SGD
  only: there y_i = x - eta_l sum_k (g_k + c - c_i), so option II is (1/K) sum_k g_k, the mean raw
  gradient of the local steps. Under Adam the displacement is K steps of Adam's normalised update
  (about eta_l per coordinate), so option II's c_i is about 1 per coordinate whatever the gradients'
  size, c - c_i swamps the gradient it should correct, Adam follows sign(c - c_i), and training
  diverges. ``control_variate: mean_gradient`` computes c_i+ = (1/K) sum_k g_i(y_{i,k}) from the raw
  stochastic gradients seen during local training (:func:`mean_gradient_control_variate`): option
  II's value under SGD, a gradient under any optimizer, at no extra pass (option I's gradient at x
  would cost one). ``auto`` (the default) takes option II for SGD, bit for bit the earlier
  behaviour, and mean_gradient for Adam. Measured on the default DDPM track (digits 8x8, 10 shard
  clients, 30% participation, 40 rounds, Adam lr 1e-3, 15 local steps): with option II, mean
  |c - c_i| was 0.2-0.5 per coordinate against raw gradients of 5e-4 to 1e-3, every round moved
  every weight by K eta_l (update norm 5.16 = K eta_l sqrt(d), FedAvg's 1.2-1.9), client losses
  rose from 0.38 (round 1) to 0.44-0.49 (FedAvg's fell from 0.31 to 0.15), and the run ended at test
  eps-MSE 0.448 and FID 220 (FedAvg 0.162, 94; FID of 500 samples); with mean_gradient,
  |c - c_i| ~ 1.4e-4, the size of the gradient, and the run ended at 0.167 and FID 54. Over seeds
  0-2, mean_gradient: eps-MSE 0.167, FID 64 +- 13; FedAvg: 0.161, 85 +- 24. Applying the correction
  to the update instead (Adam on the raw gradients, then y_i - K eta_l (c - c_i), c_i in Adam-step
  units) also converged (seeds 0-2: 0.168, FID 77 +- 14) but is a different algorithm.
- Control variates exist for trainable parameters only; float buffers (BatchNorm statistics) follow
  the server step x <- x + eta_g avg dy_i like the weights.
- c_i starts at 0 and is created the first time client i is sampled (a missing entry reads as 0).

:func:`option2_control_variate` is reused by FedDC (whose option II has the same limitation under
Adam), the server step by MoFedSAM; the gradient correction itself is
:func:`fedpipe.fl.local.corrected_grad_hook`, which every executor's local step applies from
:meth:`Scaffold.local_plan`. The small state-dict helpers below are shared by the other algorithm
modules.

Reference check (tests/test_equivalence_flbench_ref.py, docs/papers/baselines.md): client steps,
option-II c_i and the server's x and c equal PFLlib's SCAFFOLD to 2.2e-16 in float64 with
``fl.aggregation=uniform`` (PFLlib's 1/|S|).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedpipe.algorithms.registry import register
from fedpipe.config.core import check, one_of
from fedpipe.data import ClientData
from fedpipe.fl.state import (
    ClientUpdate,
    Payload,
    ServerState,
    Weights,
    clone,
    is_float,
    read,
    sum_over_clients,
    trainable,
)
from fedpipe.fl.strategy import ClientState, LocalPlan, RoundInfo, Strategy, check_num_clients

CONTROL_VARIATES = ("auto", "option2", "mean_gradient")


@dataclass(frozen=True)
class ScaffoldConfig:
    global_lr: float = 1.0
    """eta_g, the server step size in x <- x + eta_g avg_i (y_i - x) (Alg. 1 line 17); 1.0: neither FedPTR
    nor FedDDPM gives it (docs/papers/baselines.md)."""

    control_variate: str = "auto"
    """How c_i+ is computed (Alg. 1 line 12). ``option2``: c_i - c + (x - y_i) / (K eta_l), the
    paper's option II, which assumes plain SGD steps; ``mean_gradient``: (1/K) sum_k g_i(y_{i,k}),
    the mean of the raw stochastic gradients of the K local steps (option I's gradient, taken along
    the local trajectory instead of at x; the same value as option II under plain SGD, and in gradient
    units under any optimizer); ``auto``: option2 with ``optimizer: sgd`` (the paper's setting),
    mean_gradient otherwise (Adam). Under Adam, option II measures Adam's normalised step (order 1 per
    coordinate) instead of a gradient (order 1e-4 on the DDPM track): c - c_i then swamps the
    gradient it corrects and training diverges (see :func:`control_variate_rule`)."""

    def validate(self, p: str) -> None:
        check(self.global_lr > 0, f"{p}.global_lr", self.global_lr, "a number > 0")
        one_of(f"{p}.control_variate", self.control_variate, CONTROL_VARIATES)


# -- SCAFFOLD steps (FedDC reuses the control variates, MoFedSAM the server step) ------------
def rule_for_optimizer(choice: str, optimizer: str, sgd_rule: str) -> str:
    """The rule ``choice`` stands for with local optimizer ``optimizer``: ``auto`` is the paper's
    ``sgd_rule`` for SGD (bit for bit the earlier behaviour) and ``mean_gradient`` for any other
    optimizer (SCAFFOLD's control variate, MoFedSAM's Delta)."""
    if choice != "auto":
        return choice
    return sgd_rule if optimizer == "sgd" else "mean_gradient"


def control_variate_rule(choice: str, optimizer: str) -> str:
    """The control-variate rule: ``auto`` is ``option2`` for SGD, ``mean_gradient`` otherwise."""
    return rule_for_optimizer(choice, optimizer, "option2")


def mean_gradient_control_variate(grad_sum: Weights, steps: float, c_i: Weights) -> Weights:
    """c_i+ = (1/K) sum_k g_i(y_{i,k}): the mean raw (uncorrected) stochastic gradient of the K local
    steps. With plain SGD, y_i = x - eta_l sum_k (g_k + c - c_i), so option II's
    c_i - c + (x - y_i) / (K eta_l) is this same value; with Adam it stays a gradient (option II
    would be Adam's mean normalised step). A client that took no step keeps c_i."""
    if steps == 0:
        return {n: v.clone() for n, v in c_i.items()}
    return {n: grad_sum[n] / steps for n in c_i}


def option2_control_variate(c_i: Weights, c: Weights, x: Weights, y: Weights, steps: float,
                            lr: float) -> Weights:
    """c_i+ = c_i - c + (x - y) / (K eta_l) (SCAFFOLD Alg. 1 line 12, option II)."""
    if steps == 0:  # a client without data took no step; its control variate does not change
        return {n: v.clone() for n, v in c_i.items()}
    return {n: c_i[n] - c[n] + (x[n] - y[n]) / (steps * lr) for n in c_i}


def server_step(x: Weights, y_avg: Weights, global_lr: float) -> Weights:
    """x + eta_g (avg y_i - x) on float tensors; integer buffers take the averaged value."""
    return {k: x[k] + global_lr * (v - x[k]) if is_float(v) else v for k, v in y_avg.items()}


# -- the strategy -----------------------------------------------------------------------------
@register("scaffold")
class Scaffold(Strategy):
    tracks = ("classification", "diffusion")  # task-agnostic: the task's loss only
    config_class = ScaffoldConfig
    batchable = True  # fl.executor: batched adds c - c_i to the vectorised gradients

    def init_server(self, model: nn.Module) -> ServerState:
        c = {n: torch.zeros_like(p.detach()) for n, p in trainable(model).items()}
        return ServerState(weights=clone(model.state_dict()), extra={"c": c})

    def payload(self, state: ServerState, round_: int, client_id: int = 0) -> Payload:
        return Payload(round=round_, weights=state.weights, extra=state.extra,  # x and c
                       client_id=client_id)

    def local_plan(self, payload: Payload, client_state: ClientState, data: ClientData,
                   client_id: int = 0) -> LocalPlan:
        """Lines 8-10: y_i <- x, then local steps with the gradient corrected by c - c_i (fixed
        during the round), keeping the raw-gradient sum when the control variate is the mean
        gradient; every executor trains it."""
        params = trainable(self.scratch_model_instance())
        c = read(payload.extra.get("c"), params)
        c_i = read(client_state.get("c_i"), params)
        rule = control_variate_rule(self.cfg.control_variate, self.local.optimizer)
        return LocalPlan(start=payload.weights, correction={n: c[n] - c_i[n] for n in params},
                         grad_sum=rule == "mean_gradient",
                         context={"c": c, "c_i": c_i, "rule": rule})

    def finish_update(self, plan, payload, client_state, data, client_id, weights, metrics,
                      grad_sum):
        """Lines 12-14 from the trained weights y_i: c_i+, and the upload (y_i, dc_i)."""
        c, c_i, rule = plan.context["c"], plan.context["c_i"], plan.context["rule"]
        if rule == "mean_gradient":  # line 12, (1/K) sum_k g_i(y_{i,k}) along the trajectory
            c_i_new = mean_gradient_control_variate(grad_sum, metrics["steps"], c_i)
        else:  # line 12, option II
            c_i_new = option2_control_variate(c_i, c, payload.weights, weights, metrics["steps"],
                                              self.local.lr_at(payload.round))
        dc = {n: c_i_new[n] - c_i[n] for n in c_i}
        update = ClientUpdate(client_id, len(data), weights, extra={"dc": dc}, metrics=metrics)
        return update, {"c_i": c_i_new}, metrics

    def aggregate(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        updates = rnd.updates
        check_num_clients(self, updates)
        y_avg = self.average(updates)
        x = server_step(state.weights, y_avg, self.cfg.global_lr)  # lines 16-17: x + eta_g dx
        dc_sum = sum_over_clients(updates, "dc")
        c = state.extra["c"]
        c_new = {n: c[n] + dc_sum[n] / self.num_clients for n in c}  # line 17: c + |S|/N dc
        return ServerState(weights=x, extra={"c": c_new}, meta=state.meta)
