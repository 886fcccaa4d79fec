"""FedProx + FairFed reweighting (Ezzeldin et al., "FairFed: Enabling Group Fairness in Federated
Learning", AAAI 2023), the "Fedprox + FairFed (model reweighing)" baseline of Equitable-FL
(§5.2): FedProx local training, and only FairFed's aggregation-weight update.

FairFed's weight update (Alg. 1): with omega_i^{t} the aggregation weights (omega_i^0 = N_i / N),
a fairness gap Delta_i^t of each client and a budget beta,

    omega_i^{t+1} = omega_i^t - beta (Delta_i^t - mean_j Delta_j^t),   then normalised to sum 1.

Equitable-FL notes the weights can go negative and lower-bounds them at 0 (§5.2); so does this
implementation (``max(., 0)`` before normalising).

Adaptations (the papers are silent; inferred):
- Without a sensitive attribute, the gap is FairFed's accuracy fallback: Delta_i = |Acc_global -
  Acc_i|, Acc_i the received global model's accuracy on client i's local training data (computed
  before local training) and Acc_global = sum_i N_i Acc_i / sum_i N_i over the round's participants
  (what secure aggregation would give the server).
- Partial participation: the server keeps omega_i for every client seen (initially N_i, its sample
  count); each round the participants' weights are normalised among them, updated as above, clipped
  at 0, renormalised (uniform if all clip to 0), used to aggregate, and written back scaled to the
  participants' previous total mass.
- ``beta`` = 1.0, **inferred**. Equitable-FL does not give it (§5.2 names the baseline only), and
  FairFed's paper is not in the project's library (re-checked), so its own default could not be
  checked. FairFed treats beta as a tuned fairness budget (beta = 0 is FedAvg); 1.0 makes a client's
  weight move by its whole gap deviation in one step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedpipe.algorithms.fedprox import FedProx, FedProxConfig
from fedpipe.algorithms.registry import register
from fedpipe.config.core import check
from fedpipe.data import ClientData
from fedpipe.fl.state import ClientUpdate, Payload, weighted_average
from fedpipe.fl.strategy import ClientState, RoundInfo, ServerState


@dataclass(frozen=True)
class FairFedConfig(FedProxConfig):
    beta: float = 1.0
    """beta, FairFed's fairness budget in omega <- omega - beta (Delta - mean Delta). Inferred:
    Equitable-FL does not give it and FairFed is not in the library (module docstring)."""

    def validate(self, p: str) -> None:
        super().validate(p)
        check(self.beta >= 0, f"{p}.beta", self.beta, "a number >= 0")


def fairfed_weights(omega: np.ndarray, gaps: np.ndarray, beta: float) -> np.ndarray:
    """One FairFed step on the participants: normalise ``omega``, subtract beta (Delta - mean
    Delta), clip at 0 (Equitable-FL's lower bound), renormalise (uniform if every weight is 0)."""
    w = np.asarray(omega, dtype=np.float64)
    w = w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))
    g = np.asarray(gaps, dtype=np.float64)
    w = np.maximum(w - beta * (g - g.mean()), 0.0)
    return w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))


@torch.no_grad()
def local_accuracy(model: torch.nn.Module, data: ClientData, gen: torch.Generator) -> float:
    was_training = model.training
    model.eval()
    correct = 0
    for x, y in data.batches(1024, gen, shuffle=False):
        correct += int((model(x).argmax(1) == y).sum())
    model.train(was_training)
    return correct / max(len(data), 1)


@register("fairfed")
class FairFed(FedProx):
    tracks = ("classification",)  # not run or tested on the diffusion track (FedProx's is)
    config_class = FairFedConfig

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        acc = local_accuracy(self.scratch_model(payload.weights), data, gen)  # Acc_i(w_t)
        update, client_state, metrics = super().client_update(payload, client_state, data, gen,
                                                              client_id)
        metrics = {**metrics, "global_model_accuracy": acc}
        update.metrics = metrics
        return update, client_state, metrics

    def aggregate(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        ups = rnd.updates
        stored = state.meta.get("fairfed_omega", {})
        omega = np.array([stored.get(str(u.client_id), float(u.num_samples)) for u in ups])
        sizes = np.array([u.num_samples for u in ups], dtype=np.float64)
        acc = np.array([u.metrics["global_model_accuracy"] for u in ups])
        gaps = np.abs(float((sizes * acc).sum() / sizes.sum()) - acc)
        p = fairfed_weights(omega, gaps, self.cfg.beta)
        weights = weighted_average([u.weights for u in ups], p.tolist())
        mass = float(omega.sum()) or float(len(ups))
        new = {**stored, **{str(u.client_id): float(mass * pi) for u, pi in zip(ups, p, strict=True)}}
        return ServerState(weights=weights, extra=state.extra,
                           meta={**state.meta, "fairfed_omega": new})
