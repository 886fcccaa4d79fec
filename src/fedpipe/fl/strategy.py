"""The Strategy: the hooks of one round (see docs/architecture.md). The base class is FedAvg
(McMahan et al. 2017): clients run local SGD from the global weights; the server averages them.

Hooks:
- ``init_server(model) -> ServerState`` and ``init_client(client_id) -> client_state`` (a dict of
  tensors the engine keeps per client and checkpoints);
- ``payload(server_state, round) -> Payload`` (what is sent to clients);
- ``client_update(payload, client_state, data, gen) -> (ClientUpdate, client_state, metrics)``: pure;
  its only randomness is ``gen``;
- ``aggregate(server_state, updates) -> ServerState`` (updates sorted by client id);
- ``server_update(server_state, round, ctx) -> ServerState`` (optional server work);
- ``personalized_model(server_state, client_state)`` (optional).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl.local import fix_parameters, local_train
from fedpipe.fl.state import (
    ClientUpdate,
    Payload,
    ServerState,
    Weights,
    aggregation_coeffs,
    clone,
    load_weights,
    repeated_names,
    weighted_average,
)

ClientState = dict[str, torch.Tensor]


@dataclass(frozen=True)
class NoConfig:
    """An algorithm without hyperparameters of its own."""


def check_num_clients(strategy: Strategy, updates: Sequence[ClientUpdate]) -> None:
    if strategy.num_clients < len(updates):
        raise ValueError(f"{strategy.name}: num_clients={strategy.num_clients} is smaller than the "
                         f"{len(updates)} clients of this round; pass the total number of clients")


class Strategy:
    """FedAvg; other algorithms override the hooks they change."""

    name = "fedavg"
    config_class: type = NoConfig

    def __init__(self, task, model_fn: Callable[[], nn.Module], local: LocalTrainConfig,
                 cfg: Any = None, aggregation: str = "weighted", num_clients: int = 1):
        self.task = task
        self.model_fn = model_fn
        self.local = local
        self.cfg = cfg if cfg is not None else self.config_class()
        self.aggregation = aggregation
        self.num_clients = num_clients
        self._scratch: nn.Module | None = None  # working copy for local training

    # -- helpers -------------------------------------------------------------------------------
    def scratch_model(self, weights: Weights) -> nn.Module:
        """A model holding copies of ``weights``: a reused working instance, given new tensors on each
        call (see :func:`load_weights`), so tensors taken from it earlier never change."""
        if self._scratch is None:
            self._scratch = self.model_fn()
            fix_parameters(self._scratch)
            self._slots = self._scratch.state_dict(keep_vars=True)
            self._tied = repeated_names(self._slots)
        self._held = load_weights(self._slots, weights)
        return self._scratch

    def scratch_weights(self) -> Weights:
        """The scratch model's weights, as ``clone(model.state_dict())`` but without the copy: the
        tensors the model trained in (after local training: the client's new weights), which the
        next :meth:`scratch_model` call leaves as they are. A tensor held under several names (tied
        weights) is copied for each further name."""
        weights = dict(self._held)
        for k in self._tied:
            weights[k] = weights[k].clone()
        return weights

    def global_model(self, state: ServerState) -> nn.Module:
        model = self.model_fn()
        model.load_state_dict(state.weights)
        return model

    def average(self, updates: Sequence[ClientUpdate],
                items: Sequence[Weights] | None = None) -> Weights:
        """The ``fl.aggregation`` average of the updates' weights, or of ``items`` (one dict per
        update, e.g. an algorithm's extra tensors) with the same client coefficients."""
        if items is None:
            items = [u.weights for u in updates]
        return weighted_average(items, aggregation_coeffs(updates, self.aggregation))

    # -- hooks ---------------------------------------------------------------------------------
    def init_server(self, model: nn.Module) -> ServerState:
        return ServerState(weights=clone(model.state_dict()))

    def init_client(self, client_id: int) -> ClientState:
        return {}

    def payload(self, state: ServerState, round_: int) -> Payload:
        return Payload(round=round_, weights=state.weights)

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        model = self.scratch_model(payload.weights)
        metrics = local_train(model, data, self.task, self.local, payload.round, gen)
        update = ClientUpdate(client_id, len(data), self.scratch_weights(), metrics=metrics)
        return update, client_state, metrics

    def aggregate(self, state: ServerState, updates: Sequence[ClientUpdate]) -> ServerState:
        return ServerState(weights=self.average(updates), extra=state.extra, meta=state.meta)

    def server_update(self, state: ServerState, round_: int, ctx: Any = None) -> ServerState:
        return state

    def personalized_model(self, state: ServerState, client_state: ClientState) -> nn.Module | None:
        return None
