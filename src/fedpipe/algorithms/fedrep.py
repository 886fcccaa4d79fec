"""FedRep (Collins et al., ICML 2021, "Exploiting Shared Representations for Personalized Federated
Learning"; settings of FedNH App. A.2, "official implementation"): the head is personal, the body
shared. Each round client i, from the global body phi and its own head h_i:

    1. ``head_epochs`` epochs on h_i with phi fixed:   h_i <- argmin_h  f_i(phi, h)
    2. ``body_epochs`` epochs on phi with h_i fixed:   phi_i <- argmin_phi f_i(phi, h_i)
    upload phi_i; the server averages the bodies (FedAvg).

Both phases use ``fl.local`` (optimizer, lr, batch size) with their own epoch counts; the client's
generator continues from phase 1 into phase 2. The global model keeps the initial head.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from fedpipe.algorithms.registry import register
from fedpipe.config.core import check
from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl.local import local_train, training_only
from fedpipe.fl.state import ClientUpdate, Payload
from fedpipe.fl.strategy import ClientState, Strategy


@dataclass(frozen=True)
class FedRepConfig:
    head_epochs: int = 10
    """Epochs on the personal head with the body fixed (step 1; FedRep's official code, FedNH App. A.2)."""
    body_epochs: int = 5
    """Epochs on the shared body with the head fixed (step 2; same source)."""

    def validate(self, p: str) -> None:
        check(self.head_epochs >= 0, f"{p}.head_epochs", self.head_epochs, "an integer >= 0")
        check(self.body_epochs >= 1, f"{p}.body_epochs", self.body_epochs, "an integer >= 1")


@register("fedrep")
class FedRep(Strategy):
    config_class = FedRepConfig
    personal_modules = ("head",)

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        head = (replace(self.local, epochs=self.cfg.head_epochs, steps=None)
                if self.cfg.head_epochs else None)
        body = replace(self.local, epochs=self.cfg.body_epochs, steps=None)
        return alternating_update(self, payload, client_state, data, gen, client_id,
                                  ("head", head), ("body", body))


def alternating_update(strategy: Strategy, payload: Payload, client_state: ClientState,
                       data: ClientData, gen: torch.Generator, client_id: int,
                       personal: tuple[str, LocalTrainConfig | None],
                       shared: tuple[str, LocalTrainConfig]
                       ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
    """The client step of a method that alternates (FedRep, step 1 then 2; FedAlt, Pillutla et al.
    2022, Alg. 1): from the global shared entries and the client's own personal ones, train the
    personal parameters with the shared ones fixed, then the shared ones with the personal ones
    fixed, one generator throughout; upload the shared entries and keep the personal ones.

    ``personal``/``shared``: each phase's name and schedule (``personal``'s None skips it). The
    metrics hold ``<name>_loss`` and ``<name>_steps`` of each phase run, and ``loss``/``steps`` of
    the last (the shared phase)."""
    model = strategy.scratch_model(strategy.local_weights(payload.weights, client_state))
    names = {n for n, _ in model.named_parameters()}
    own = {n for n in names if n in strategy.personal}
    metrics: dict[str, float] = {}
    for (phase, sched), train in ((personal, own), (shared, names - own)):
        if sched is None:
            continue
        with training_only(model, train):
            m = local_train(model, data, strategy.task, sched, payload.round, gen)
        metrics |= {f"{phase}_loss": m["loss"], f"{phase}_steps": m["steps"]}
        metrics |= m
    weights, kept = strategy.split_personal(strategy.scratch_weights())
    return (ClientUpdate(client_id, len(data), weights, metrics=metrics),
            {**client_state, "personal": kept}, metrics)
