"""FedBABU (Oh, Kim, Yun, ICLR 2022, "FedBABU: Toward Enhanced Representation for Federated Image
Classification"; a FedNH baseline, App. A.2, FedNH's FedBABU code).

    federated training: the head W^0 (PyTorch's default nn.Linear init) is frozen on every client
        and never aggregated; client k trains only the body:  theta_k <- local SGD on f_k(theta, W^0)
        the server averages the bodies (FedAvg); the global model is (theta^{t+1}, W^0)
    personalization (after training): each client fine-tunes its model, head included, for
        ``ft_epochs`` (5) epochs of the task loss on its training data.

[code] FedNH's FedBABU fine-tunes each client's *latest local model* (``ft_from: local``, default;
a client never selected has the global model); FedBABU's paper fine-tunes the final global model
(``ft_from: global``). The fine-tuning uses ``fl.local`` (optimizer, batch size) at the learning rate
of the round after the last ([code]: ``training(final_round, FedBABU_finetune_epoch)``), with the
stream (seed, "personalize", round, client). It runs whenever the engine evaluates personalized
models; set ``fl.eval_every`` to ``fl.rounds`` to run it once, after training, as the code does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedpipe.algorithms.fedavg import KeepsLocalModel
from fedpipe.algorithms.fedavg_ft import fine_tune
from fedpipe.algorithms.registry import register
from fedpipe.config.core import check, one_of
from fedpipe.data import ClientData
from fedpipe.fl.local import local_train, training_only
from fedpipe.fl.state import ClientState, ClientUpdate, Payload, ServerState, Weights
from fedpipe.fl.strategy import RoundInfo, module_keys

ROUNDS_DONE = "rounds_done"


@dataclass(frozen=True)
class FedBABUConfig:
    ft_epochs: int = 5
    """Fine-tuning epochs of the personalized model, head included (FedNH App. A.2: 5)."""
    ft_from: str = "local"
    """What each client fine-tunes: ``local`` (its latest local model; [code]) or ``global`` (the
    final global model; FedBABU's paper)."""

    def validate(self, p: str) -> None:
        check(self.ft_epochs >= 1, f"{p}.ft_epochs", self.ft_epochs, "an integer >= 1")
        one_of(f"{p}.ft_from", self.ft_from, ("local", "global"))


@register("fedbabu")
class FedBABU(KeepsLocalModel):
    config_class = FedBABUConfig

    def keeps_local_model(self) -> bool:
        return self.cfg.ft_from == "local"

    @property
    def personalizes(self) -> bool:
        return True

    def head_keys(self) -> set[str]:
        return module_keys(self.scratch_model_instance(), ("head",))

    # -- client: the body only, the head frozen ---------------------------------------------
    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        model = self.scratch_model(payload.weights)
        body = {n for n, _ in model.named_parameters() if not n.startswith("head.")}
        with training_only(model, body):
            metrics = local_train(model, data, self.task, self.local, payload.round, gen)
        local = self.scratch_weights()
        heads = self.head_keys()
        body = {k: v for k, v in local.items() if k not in heads}  # the head is never aggregated
        update = ClientUpdate(client_id, len(data), body, metrics=metrics)
        return update, self.remember(client_state, local), metrics

    def server_update(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        return ServerState(state.weights, state.extra, {**state.meta, ROUNDS_DONE: rnd.index + 1})

    # -- personalization: fine-tune everything ------------------------------------------------
    def personalized_model(self, state: ServerState, client_state: ClientState, data: ClientData,
                           gen: torch.Generator, client_id: int = 0) -> Weights | None:
        start = (self.latest_local_model(state, client_state) if self.cfg.ft_from == "local"
                 else state.weights)
        return fine_tune(self, start, data, self.cfg.ft_epochs,
                         int(state.meta.get(ROUNDS_DONE, 0)), gen)
