"""FedRep (Collins et al., ICML 2021, "Exploiting Shared Representations for Personalized Federated
Learning"; settings of FedNH spec 004 §5, "official implementation"): the head is personal, the body
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

from fedpipe.config.core import check
from fedpipe.data import ClientData
from fedpipe.fl.local import local_train
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


class FedRep(Strategy):
    name = "fedrep"
    config_class = FedRepConfig
    personal_modules = ("head",)

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        model = self.scratch_model(self.local_weights(payload.weights, client_state))
        params = dict(model.named_parameters())
        head = {n for n in params if n in self.personal}
        flags = {n: p.requires_grad for n, p in params.items()}
        metrics: dict[str, float] = {}
        try:
            for phase, epochs, train in (("head", self.cfg.head_epochs, head),
                                         ("body", self.cfg.body_epochs, set(params) - head)):
                if epochs == 0:
                    continue
                for n, p in params.items():
                    p.requires_grad_(flags[n] and n in train)
                m = local_train(model, data, self.task, replace(self.local, epochs=epochs, steps=None),
                                payload.round, gen)
                metrics |= {f"{phase}_loss": m["loss"], f"{phase}_steps": m["steps"]}
                metrics |= m  # "loss" and "steps" of the last phase (the body's)
        finally:
            for n, p in params.items():
                p.requires_grad_(flags[n])
        shared, own = self.split_personal(self.scratch_weights())
        return (ClientUpdate(client_id, len(data), shared, metrics=metrics),
                {**client_state, "personal": own}, metrics)
