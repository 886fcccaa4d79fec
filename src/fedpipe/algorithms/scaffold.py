"""SCAFFOLD (Karimireddy et al., ICML 2020, "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning"), Algorithm 1 with option II control variates.

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
  before the optimizer step (spec 001 §5, inferred), and option II is then an approximation.
- Control variates exist for trainable parameters only; float buffers (BatchNorm statistics) follow
  the server step x <- x + eta_g avg dy_i like the weights.
- c_i starts at 0 and is created the first time client i is sampled (a missing entry reads as 0).

:func:`correct_gradients` and :func:`option2_control_variate` are reused by FedDC; the small
state-dict helpers below are shared by the other algorithm modules.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedpipe.config.core import check
from fedpipe.data import ClientData
from fedpipe.fl.local import local_train
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
from fedpipe.fl.strategy import ClientState, RoundInfo, Strategy, check_num_clients


@dataclass(frozen=True)
class ScaffoldConfig:
    global_lr: float = 1.0
    """eta_g, the server step size in x <- x + eta_g avg_i (y_i - x) (Alg. 1 line 17); 1.0 as in
    spec 000_fedptr §4 and 001_fedddpm §5 ("option II, global lr 1")."""

    def validate(self, p: str) -> None:
        check(self.global_lr > 0, f"{p}.global_lr", self.global_lr, "a number > 0")


# -- SCAFFOLD steps (FedDC reuses the control variates, MoFedSAM the server step) ------------
def correct_gradients(params: dict[str, nn.Parameter], correction: Weights) -> None:
    """grad <- grad + correction (a parameter without a gradient gets the correction alone)."""
    for n, p in params.items():
        if p.grad is None:
            p.grad = correction[n].clone()
        else:
            p.grad.add_(correction[n])


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
class Scaffold(Strategy):
    name = "scaffold"
    config_class = ScaffoldConfig

    def init_server(self, model: nn.Module) -> ServerState:
        c = {n: torch.zeros_like(p.detach()) for n, p in trainable(model).items()}
        return ServerState(weights=clone(model.state_dict()), extra={"c": c})

    def payload(self, state: ServerState, round_: int, client_id: int = 0) -> Payload:
        return Payload(round=round_, weights=state.weights, extra=state.extra,  # x and c
                       client_id=client_id)

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        x = payload.weights
        model = self.scratch_model(x)  # y_i <- x
        params = trainable(model)
        c = read(payload.extra.get("c"), params)
        c_i = read(client_state.get("c_i"), params)
        correction = {n: c[n] - c_i[n] for n in params}  # fixed during the round

        def grad_hook(m: nn.Module) -> None:
            correct_gradients(params, correction)  # line 10: g_i(y_i) + c - c_i

        metrics = local_train(model, data, self.task, self.local, payload.round, gen,
                              grad_hook=grad_hook)
        y = clone(model.state_dict())
        c_i_new = option2_control_variate(c_i, c, x, y, metrics["steps"],  # line 12
                                          self.local.lr_at(payload.round))
        dc = {n: c_i_new[n] - c_i[n] for n in params}
        update = ClientUpdate(client_id, len(data), y, extra={"dc": dc}, metrics=metrics)
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
