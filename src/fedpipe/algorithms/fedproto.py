"""FedProto (Tan et al., AAAI 2022, "FedProto: Federated Prototype Learning across Heterogeneous
Clients"; a FedNH baseline in FedNH's implementation, App. A.2).

No model is shared: every client keeps its whole network (body f and a linear classifier g) and only
class prototypes travel. Round t, client k, with the global prototypes {C_c}:

    loss = CE(g(f(x)), y) + lambda * MSE(f(x), C_y)                          (FedProto Eq. 8; [code])
    local prototype of class c: mean of f(x_i) over its samples of c in the last local epoch
    server: C_c = unweighted mean of the uploaded local prototypes of class c         ([code] agg)
           (a class nobody uploads keeps its value; C starts as U[0, 1) draws, [code])

MSE is the mean over the batch and the feature dimensions (``nn.MSELoss()`` in the code, which
regularises from the first round towards the random initial prototypes). The local prototypes are
the means of the embeddings of the training batches of the last local epoch, collected during
training and detached ([code]: ``local_embedding_by_class`` is reset at every epoch; FedProto's Eq. 5
is a mean over the local data, once per sample). lambda = 0.1 (FedNH App. A.2).

Prediction (the personalized model): the nearest global prototype, argmin_c ||f(x) - C_c||
(:class:`fedpipe.models.prototype.DistanceHead`, with the latest global prototypes). There is no
global model (FedNH's Table 1: "—"): the server's network stays the initial one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedpipe.algorithms.registry import register
from fedpipe.config.core import check
from fedpipe.data import ClientData
from fedpipe.fl.local import local_train
from fedpipe.fl.state import ClientState, ClientUpdate, Payload, ServerState, sum_of
from fedpipe.fl.strategy import RoundInfo, Strategy
from fedpipe.models.prototype import with_distance_head
from fedpipe.tasks import Batch

PROTOTYPES = "head.prototypes"
GROUP = "prototypes"


@dataclass(frozen=True)
class FedProtoConfig:
    lam: float = 0.1
    """lambda, the weight of the prototype term MSE(f(x), C_y) (FedProto Eq. 8; FedNH App. A.2: 0.1)."""

    def validate(self, p: str) -> None:
        check(self.lam >= 0, f"{p}.lam", self.lam, "a number >= 0")


def aggregate_prototypes(old: torch.Tensor, means: list[torch.Tensor], owned: list[torch.Tensor]
                         ) -> torch.Tensor:
    """C_c = mean of the clients' class-c prototypes over the clients that own c; others unchanged."""
    count = sum_of([o.to(old.dtype) for o in owned])
    total = sum_of([m * o[:, None].to(m.dtype) for m, o in zip(means, owned, strict=True)])
    return torch.where(count[:, None] > 0, total / count.clamp_min(1.0)[:, None], old)


@register("fedproto")
class FedProto(Strategy):
    config_class = FedProtoConfig

    @classmethod
    def adapt_model(cls, model: nn.Module, cfg: FedProtoConfig) -> nn.Module:
        return with_distance_head(model)

    def personal_keys(self, model: nn.Module) -> set[str]:
        """Everything but the global prototypes."""
        return set(model.state_dict()) - {PROTOTYPES}

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        model = self.scratch_model(self.local_weights(payload.weights, client_state))
        protos = payload.weights[PROTOTYPES]
        num_classes, dim = protos.shape
        sums = torch.zeros(num_classes, dim, device=protos.device, dtype=protos.dtype)
        counts = torch.zeros(num_classes, device=protos.device, dtype=protos.dtype)
        lam = self.cfg.lam
        seen = [0]  # samples seen so far: a multiple of len(data) starts an epoch

        def objective(m: nn.Module, batch: Batch) -> torch.Tensor:
            x, y = batch
            if seen[0] % len(data) == 0:  # the local prototypes are those of the last epoch [code]
                sums.zero_()
                counts.zero_()
            seen[0] += len(y)
            z = m.features(x)
            sums.index_add_(0, y, z.detach())
            counts.index_add_(0, y, torch.ones(len(y), device=y.device, dtype=counts.dtype))
            # Eq. 8: CE of the linear classifier + lambda * MSE to the global prototypes
            return F.cross_entropy(m.head.linear(z), y) + lam * F.mse_loss(z, protos[y])

        metrics = local_train(model, data, self.task, self.local, payload.round, gen,
                              loss_fn=objective)
        _, own = self.split_personal(self.scratch_weights())
        owned = counts > 0
        means = sums / counts.clamp_min(1.0)[:, None]
        update = ClientUpdate(client_id, len(data), {}, {GROUP: {"mean": means, "owned": owned}},
                              metrics)
        return update, {**client_state, "personal": own}, metrics

    def server_update(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        if not rnd.updates:
            return state
        groups = [u.extra[GROUP] for u in rnd.updates]
        new = aggregate_prototypes(state.weights[PROTOTYPES], [g["mean"] for g in groups],
                                   [g["owned"] for g in groups])
        return ServerState({**state.weights, PROTOTYPES: new}, state.extra, state.meta)
