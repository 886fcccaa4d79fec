"""FedAvg+FT (Yu et al. 2020, "Salvaging Federated Learning by Local Adaptation"; a PerAda and FedNH
baseline): FedAvg trains the global model; each client's own model, for evaluation, is the global
model fine-tuned on the client's training data.

The fine-tuning uses ``fl.local`` (optimizer, lr, batch size) for ``ft_epochs`` epochs with the stream
``(seed, "personalize", round, client)``. The papers do not give the schedule (PerAda Sec. 7
names the method only); the default, 5 epochs, is FedBABU's fine-tuning schedule in FedNH (App. A.2).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from fedpipe.algorithms.registry import register
from fedpipe.config.core import check
from fedpipe.data import ClientData
from fedpipe.fl.local import local_train
from fedpipe.fl.state import ClientState, ServerState, Weights
from fedpipe.fl.strategy import Strategy


@dataclass(frozen=True)
class FedAvgFTConfig:
    ft_epochs: int = 5
    """Local fine-tuning epochs of the global model before evaluation (not given by the papers)."""

    def validate(self, p: str) -> None:
        check(self.ft_epochs >= 1, f"{p}.ft_epochs", self.ft_epochs, "an integer >= 1")


def fine_tune(strategy: Strategy, weights: Weights, data: ClientData, epochs: int, round_: int,
              gen: torch.Generator) -> Weights:
    """``weights`` trained for ``epochs`` epochs of the task loss on ``data`` (fresh tensors)."""
    model = strategy.scratch_model(weights)
    if len(data):
        local_train(model, data, strategy.task, replace(strategy.local, epochs=epochs, steps=None),
                    round_, gen)
    return strategy.scratch_weights()


@register("fedavg_ft")
class FedAvgFT(Strategy):
    config_class = FedAvgFTConfig

    def personalized_model(self, state: ServerState, client_state: ClientState, data: ClientData,
                           gen: torch.Generator, client_id: int = 0) -> Weights | None:
        return fine_tune(self, state.weights, data, self.cfg.ft_epochs, 0, gen)
