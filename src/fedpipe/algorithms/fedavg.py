"""FedAvg (McMahan et al. 2017) as a registered method: the base :class:`~fedpipe.fl.Strategy`
(clients run local SGD from the global weights, the server averages them), plus one evaluation
option from FedNH's protocol (§4.1):

    keep_local_model: each client's personalized model is its *latest local model*, the weights it
    ended its last local training with ("We take the latest local models as the personalized model
    for methods that do not explicitly produce personalized models", FedNH §4.1).

Off by default (FedAvg then has no personal models, as before); FedNH's studies turn it on so that
FedAvg gets PM(V) / PM(L) columns. Training is unchanged either way. :class:`KeepsLocalModel` is the
mechanism, shared with FedNH, FedBABU and FedProto: the local weights go into the client's state
group ``local_model`` after training; a client not yet selected has the global weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedpipe.algorithms.registry import register
from fedpipe.data import ClientData
from fedpipe.fl.state import ClientState, ServerState, Weights
from fedpipe.fl.strategy import Strategy

LOCAL_MODEL = "local_model"
"""Client state group: the client's weights after its latest local training."""


class KeepsLocalModel(Strategy):
    """Keeps each client's latest local model (all of its state dict) as its personalized model."""

    def keeps_local_model(self) -> bool:
        return True

    @property
    def personalizes(self) -> bool:
        return self.keeps_local_model() or bool(self.personal)

    def remember(self, client_state: ClientState, local: Weights) -> ClientState:
        """``client_state`` with ``local`` (the trained weights) as the latest local model."""
        if not self.keeps_local_model():
            return client_state
        return {**client_state, LOCAL_MODEL: dict(local)}

    def latest_local_model(self, state: ServerState, client_state: ClientState) -> Weights:
        """The client's latest local model; the global weights if it was never selected."""
        return client_state.get(LOCAL_MODEL) or state.weights

    def personalized_model(self, state: ServerState, client_state: ClientState, data: ClientData,
                           gen: torch.Generator, client_id: int = 0) -> Weights | None:
        if not self.keeps_local_model():
            return super().personalized_model(state, client_state, data, gen, client_id)
        return self.latest_local_model(state, client_state)


@dataclass(frozen=True)
class FedAvgConfig:
    keep_local_model: bool = False
    """Evaluate each client's latest local model as its personalized model (FedNH §4.1: FedAvg's
    PM). Off: FedAvg has no personal models."""


@register("fedavg")
class FedAvg(KeepsLocalModel):
    tracks = ("classification", "diffusion")  # task-agnostic: the task's loss only
    config_class = FedAvgConfig
    batchable = True  # fl.executor: batched (fedpipe.fl.batched)

    def keeps_local_model(self) -> bool:
        return self.cfg.keep_local_model

    def finish_update(self, plan, payload, client_state, data, client_id, weights, metrics,
                      grad_sum):
        update, client_state, metrics = super().finish_update(plan, payload, client_state, data,
                                                              client_id, weights, metrics, grad_sum)
        return update, self.remember(client_state, update.weights), metrics
