"""Ditto (Li, Hu, Beirami, Smith, ICML 2021, "Ditto: Fair and Robust Federated Learning Through
Personalization"; a FedNH (§4.1) and PerAda (Sec. 7) baseline).

Two models per client: the global model w, trained by FedAvg, and a personal model v_k that solves

    min_{v_k}  h_k(v_k; w) = F_k(v_k) + (lambda / 2) ||v_k - w||^2                         (Eq. 2)

In round t each selected client k (Algorithm 1, in this order):

    1. w_k <- local SGD on F_k from w^t (the global update, exactly FedAvg's client);
    2. v_k <- v_k - eta (grad F_k(v_k) + lambda (v_k - w^t))  for the personal epochs,
       with the received w^t fixed as the proximal centre;

and uploads w_k; the server averages (FedAvg). The personalized model is v_k; the global model is
FedAvg's.

lambda convention: the paper's, ``lambda/2 ||v - w||^2`` (gradient ``lambda (v - w)``). FedNH
(App. A.2) uses lambda = 0.75, the default here. PerAda (§4, Personal Obj) writes lambda/2 but its
code adds ``lambda ||v - w||^2`` with lambda in {0.1, 1}: the PerAda study sets ``lam: 2.0`` (its code's
1 for CIFAR-10) on this convention.

Personal epochs: the client's ``fl.local`` schedule (FedNH's code: 5 epochs per participation at the
same lr) unless ``personal_epochs`` is set. The proximal term covers the trainable parameters (buffers
are not optimised). v_k starts from the global model the client receives at its first participation
(the official code starts every v_k at w^0: the same for clients selected in round 0); a client never
selected is evaluated with the current global model.

Against FedNH's official code (docs/papers/fednh.md; tests/test_equivalence_fednh_ref.py): equal to
float64 rounding with momentum 0, except that the code's personal step is centred on the client's
freshly trained w_k, not on w^t (Algorithm 1; kept: 0.018 on the test's personal models after 2
rounds), and is plain SGD whatever the global step's momentum and weight decay (fedpipe: ``fl.local``;
0.056 at momentum 0.9, weight decay 1e-3).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from fedpipe.algorithms.registry import register
from fedpipe.config.core import check
from fedpipe.data import ClientData
from fedpipe.fl.local import local_train
from fedpipe.fl.state import ClientUpdate, Payload, ServerState, Weights, trainable
from fedpipe.fl.strategy import ClientState, Strategy
from fedpipe.tasks import Batch


@dataclass(frozen=True)
class DittoConfig:
    lam: float = 0.75
    """lambda of Eq. 2, paper convention lambda/2 ||v - w||^2 (FedNH App. A.2: 0.75; the PerAda
    study sets 2.0, its code's lambda = 1 without the 1/2)."""
    personal_epochs: int | None = None
    """Epochs on v_k per participation (step 2); None = the client's ``fl.local`` schedule (FedNH's
    code: as many as the global update)."""

    def validate(self, p: str) -> None:
        check(self.lam >= 0, f"{p}.lam", self.lam, "a number >= 0")
        check(self.personal_epochs is None or self.personal_epochs >= 1, f"{p}.personal_epochs",
              self.personal_epochs, "null or an integer >= 1")


def proximal_objective(strategy: Strategy, model: nn.Module, centre: Weights, lam: float,
                       gen: torch.Generator):
    """``F_k(v) + lam/2 ||v - centre||^2`` over ``model``'s trainable parameters, as a ``loss_fn``."""
    params = trainable(model)
    w = {n: centre[n] for n in params}

    def objective(m: nn.Module, batch: Batch) -> torch.Tensor:
        proximal = sum(((p - w[n]) ** 2).sum() for n, p in params.items())
        return strategy.task.loss(m, batch, gen) + lam / 2 * proximal

    return objective


def own_model(state: ServerState, client_state: ClientState) -> Weights:
    """A client's personal model (its ``"personal"`` group), or the global model before it has one."""
    return client_state.get("personal") or state.weights


@register("ditto")
class Ditto(Strategy):
    config_class = DittoConfig

    def personal_schedule(self):
        e = self.cfg.personal_epochs
        return self.local if e is None else replace(self.local, epochs=e, steps=None)

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        # 1. the global update: FedAvg's local SGD from w^t
        model = self.scratch_model(payload.weights)
        metrics = local_train(model, data, self.task, self.local, payload.round, gen)
        w_k = self.scratch_weights()
        # 2. the personal update: h_k(v; w^t) from the client's own v_k
        model = self.scratch_model(client_state.get("personal") or payload.weights)
        objective = proximal_objective(self, model, payload.weights, self.cfg.lam, gen)
        pm = local_train(model, data, self.task, self.personal_schedule(), payload.round, gen,
                         loss_fn=objective)
        metrics = {**metrics, "personal_loss": pm["loss"], "personal_steps": pm["steps"]}
        update = ClientUpdate(client_id, len(data), w_k, metrics=metrics)
        return update, {**client_state, "personal": self.scratch_weights()}, metrics

    def personalized_model(self, state: ServerState, client_state: ClientState, data: ClientData,
                           gen: torch.Generator, client_id: int = 0) -> Weights | None:
        return own_model(state, client_state)
