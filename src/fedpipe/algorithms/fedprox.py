"""FedProx (Li et al., MLSys 2020, "Federated Optimization in Heterogeneous Networks").

Client k in round t minimises, starting from the global model w^t (Algorithm 2, Eq. 2):

    h_k(w; w^t) = F_k(w) + (mu / 2) ||w - w^t||^2

with the engine's local SGD (the paper's "gamma-inexact" solve is a fixed number of local steps or
epochs). The server averages the local models exactly as FedAvg does (``fl.aggregation``: by sample
count, the paper's p_k = n_k / n, or uniform). ``mu = 0`` is FedAvg.

The proximal term is computed over the trainable parameters only (buffers such as BatchNorm
statistics are not optimised) and is added to the task loss in :meth:`FedProx.client_update`, so the
reported local loss is the local objective h_k.

Reference check (tests/test_equivalence_flbench_ref.py, docs/papers/baselines.md): the client
update equals FL-bench's ``FedProxClient.fit`` and the server average Flower's
``aggregate_arrayrecords`` (num-examples weights, the default ``fl.aggregation``) to 1.1e-16 in
float64; no deviations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedpipe.config.core import check
from fedpipe.data import ClientData
from fedpipe.fl.local import local_train
from fedpipe.fl.state import ClientUpdate, Payload, clone, trainable
from fedpipe.fl.strategy import BatchedPlan, ClientState, Strategy
from fedpipe.tasks import Batch


@dataclass(frozen=True)
class FedProxConfig:
    mu: float = 0.01
    """mu, the proximal coefficient in h_k(w; w^t) = F_k(w) + mu/2 ||w - w^t||^2 (Eq. 2).
    0.01: neither FedPTR nor FedDDPM gives its value (docs/papers/baselines.md)."""

    def validate(self, p: str) -> None:
        check(self.mu >= 0, f"{p}.mu", self.mu, "a number >= 0")


class FedProx(Strategy):
    name = "fedprox"
    config_class = FedProxConfig
    batchable = True  # fl.executor: batched adds the proximal term in its vectorised step

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        model = self.scratch_model(payload.weights)
        params = trainable(model)
        w_t = {n: payload.weights[n] for n in params}  # the proximal centre w^t (not trained)
        mu = self.cfg.mu

        def local_objective(m: nn.Module, batch: Batch) -> torch.Tensor:
            # Eq. 2: F_k(w) + mu/2 ||w - w^t||^2
            proximal = sum(((p - w_t[n]) ** 2).sum() for n, p in params.items())
            return self.task.loss(m, batch, gen) + mu / 2 * proximal

        metrics = local_train(model, data, self.task, self.local, payload.round, gen,
                              loss_fn=local_objective)
        update = ClientUpdate(client_id, len(data), clone(model.state_dict()), metrics=metrics)
        return update, client_state, metrics

    def batched_plan(self, payload: Payload, client_state: ClientState, data: ClientData,
                     client_id: int = 0) -> BatchedPlan:
        """Eq. 2 for ``fl.executor: batched``: local training from w^t with mu/2 ||w - w^t||^2."""
        centre = {n: payload.weights[n] for n in trainable(self.scratch_model_instance())}
        return BatchedPlan(start=payload.weights, prox_mu=self.cfg.mu, prox_centre=centre)

    def batched_finish(self, plan, payload, client_state, data, client_id, weights, metrics,
                       grad_sum):
        return ClientUpdate(client_id, len(data), weights, metrics=metrics), client_state, metrics
