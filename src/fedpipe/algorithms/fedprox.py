"""FedProx (Li et al., MLSys 2020, "Federated Optimization in Heterogeneous Networks").

Client k in round t minimises, starting from the global model w^t (Algorithm 2, Eq. 2):

    h_k(w; w^t) = F_k(w) + (mu / 2) ||w - w^t||^2

with the engine's local SGD (the paper's "gamma-inexact" solve is a fixed number of local steps or
epochs). The server averages the local models exactly as FedAvg does (``fl.aggregation``: by sample
count, the paper's p_k = n_k / n, or uniform). ``mu = 0`` is FedAvg.

The proximal term is computed over the trainable parameters only (buffers such as BatchNorm
statistics are not optimised) and is added to the task loss (:meth:`FedProx.local_plan`, the one
statement of Eq. 2 that the serial and the batched executors both train), so the reported local loss
is the local objective h_k.

Reference check (tests/test_equivalence_flbench_ref.py, docs/papers/baselines.md): the client
update equals FL-bench's ``FedProxClient.fit`` and the server average Flower's
``aggregate_arrayrecords`` (num-examples weights, the default ``fl.aggregation``) to 1.1e-16 in
float64; no deviations.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedpipe.algorithms.registry import register
from fedpipe.config.core import check
from fedpipe.data import ClientData
from fedpipe.fl.state import Payload, trainable
from fedpipe.fl.strategy import ClientState, LocalPlan, Strategy


@dataclass(frozen=True)
class FedProxConfig:
    mu: float = 0.01
    """mu, the proximal coefficient in h_k(w; w^t) = F_k(w) + mu/2 ||w - w^t||^2 (Eq. 2).
    0.01: neither FedPTR nor FedDDPM gives its value (docs/papers/baselines.md)."""

    def validate(self, p: str) -> None:
        check(self.mu >= 0, f"{p}.mu", self.mu, "a number >= 0")


@register("fedprox")
class FedProx(Strategy):
    tracks = ("classification", "diffusion")  # task-agnostic: the task's loss only
    config_class = FedProxConfig
    batchable = True  # fl.executor: batched adds the proximal term in its vectorised step

    def local_plan(self, payload: Payload, client_state: ClientState, data: ClientData,
                   client_id: int = 0) -> LocalPlan:
        """Eq. 2, h_k(w; w^t) = F_k(w) + mu/2 ||w - w^t||^2, from w^t; every executor trains it."""
        centre = {n: payload.weights[n] for n in trainable(self.scratch_model_instance())}
        return LocalPlan(start=payload.weights, prox_mu=self.cfg.mu, prox_centre=centre)
