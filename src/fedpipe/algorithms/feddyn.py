"""FedDyn (Acar et al., ICLR 2021, "Federated Learning Based on Dynamic Regularization"),
Algorithm 1.

Each client k keeps g_k = grad L_k(theta_k^{t-1}), the gradient state of its last local model
(0 before its first round); the server keeps h (0 at the start). m = N is the number of clients.

Client k in P_t, starting from theta^{t-1}::

    theta_k^t = argmin_theta  L_k(theta) - <g_k, theta> + alpha/2 ||theta - theta^{t-1}||^2   # (a)
    g_k <- g_k - alpha (theta_k^t - theta^{t-1})                                           # (b)

Server::

    h^t     = h^{t-1} - alpha (1/m) sum_{k in P_t} (theta_k^t - theta^{t-1})                 # (c)
    theta^t = avg_{k in P_t} theta_k^t - (1/alpha) h^t                                      # (d)

(a) is the dynamic-regularised local objective (the linear term and the quadratic penalty are added
to the task loss in :meth:`FedDyn.client_update`, so the reported local loss is that objective);
the argmin is approximated by the engine's local SGD. (b) is the first-order condition of (a).

Implementation choices (documented, not in the paper):

- ``avg`` in (d) follows ``fl.aggregation`` (sample-count weights by default; the paper writes the
  uniform 1/|P_t|, which is ``fl.aggregation=uniform``). (c) keeps the paper's 1/m.
- g_k, h and the regulariser cover the trainable parameters; float buffers (BatchNorm statistics)
  are averaged as in FedAvg, without the h correction.
- The official code also rescales alpha per client by the client's relative data size; this module
  uses the paper's single alpha.

Reference check (tests/test_equivalence_flbench_ref.py, docs/papers/baselines.md): client and
server equal the FedDyn of the FedDC authors' harness (gaoliang13/FedDC) to 1.7e-16 in float64 on
equal-size clients with ``fl.aggregation=uniform``; that code's per-client alpha scaling and
gradient clipping at norm 10 are the known differences. PFLlib's FedDyn penalises the norm, not
the squared norm, of theta - theta^{t-1}, and was not followed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedpipe.algorithms.registry import register
from fedpipe.config.core import check
from fedpipe.data import ClientData
from fedpipe.fl.local import local_train
from fedpipe.fl.state import (
    ClientUpdate,
    Payload,
    ServerState,
    clone,
    read,
    sum_of,
    trainable,
)
from fedpipe.fl.strategy import ClientState, RoundInfo, Strategy, check_num_clients
from fedpipe.tasks import Batch


@dataclass(frozen=True)
class FedDynConfig:
    alpha: float = 0.01
    """alpha, the dynamic-regularisation coefficient in the local objective (a), the gradient-state
    update (b) and the server updates (c)-(d). 0.01 as in the FedPTR author's baseline harness and
    the middle of {0.001, 0.01, 0.1} (docs/papers/baselines.md)."""

    def validate(self, p: str) -> None:
        check(self.alpha > 0, f"{p}.alpha", self.alpha, "a number > 0")


@register("feddyn")
class FedDyn(Strategy):
    tracks = ("classification", "diffusion")  # task-agnostic: the task's loss only
    config_class = FedDynConfig

    def init_server(self, model: nn.Module) -> ServerState:
        h = {n: torch.zeros_like(p.detach()) for n, p in trainable(model).items()}
        return ServerState(weights=clone(model.state_dict()), extra={"h": h})

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        alpha = self.cfg.alpha
        model = self.scratch_model(payload.weights)
        params = trainable(model)
        theta_prev = {n: payload.weights[n] for n in params}  # theta^{t-1}
        g_k = read(client_state.get("grad"), params)  # grad L_k(theta_k^{t-1})

        def local_objective(m: nn.Module, batch: Batch) -> torch.Tensor:
            # (a): L_k(theta) - <g_k, theta> + alpha/2 ||theta - theta^{t-1}||^2
            linear = sum((g_k[n] * p).sum() for n, p in params.items())
            quadratic = sum(((p - theta_prev[n]) ** 2).sum() for n, p in params.items())
            return self.task.loss(m, batch, gen) - linear + alpha / 2 * quadratic

        metrics = local_train(model, data, self.task, self.local, payload.round, gen,
                              loss_fn=local_objective)
        theta_k = clone(model.state_dict())
        g_k_new = {n: g_k[n] - alpha * (theta_k[n] - theta_prev[n]) for n in params}  # (b)
        update = ClientUpdate(client_id, len(data), theta_k, metrics=metrics)
        return update, {"grad": g_k_new}, metrics

    def aggregate(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        updates = rnd.updates
        check_num_clients(self, updates)
        alpha, theta_prev = self.cfg.alpha, state.weights
        h = state.extra["h"]
        drift = {n: sum_of([u.weights[n] - theta_prev[n] for u in updates]) for n in h}
        h_new = {n: h[n] - alpha / self.num_clients * drift[n] for n in h}  # (c)
        theta = self.average(updates)
        theta |= {n: theta[n] - h_new[n] / alpha for n in h}  # (d)
        return ServerState(weights=theta, extra={"h": h_new}, meta=state.meta)
