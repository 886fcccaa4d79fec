"""LG-FedAvg (Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov, Morency, 2020, "Think Locally,
Act Globally: Federated Learning with Local and Global Representations"; a PerAda baseline,
Sec. 7 and Table 1: personal feature extractor, shared head).

Each client k keeps a local representation (the body, theta_k^l) and shares the global head
(theta^g). In round t client k trains (theta_k^l, theta^g) jointly on its data with its task loss and
uploads only the head; the server averages the heads (Algorithm 1):

    theta^g_{t+1} = sum_k p_k theta^g_k,    theta_k^l never leaves client k.

The personalized model of client k is its own body with the global head; the global model keeps the
initial body (no global representation exists), so its generic accuracy is not meaningful.

``warmup_rounds``: the official code starts the local phase from a FedAvg-trained model; the first
``warmup_rounds`` rounds are plain FedAvg of the whole model, after which each client's body starts
from the global body. Neither the paper's Table settings nor PerAda give this number (PerAda starts
every method from one pretrained model), so the default is 0 (local representations from round 0).

Reference check (tests/test_equivalence_flbench_ref.py, docs/papers/baselines.md): client body and
head and the server's head average equal PFLlib's LG-FedAvg to 1.1e-16 in float64. FL-bench's
``lgfedavg`` keeps the first layers global and the rest personal, the reverse of the paper, and
was not followed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedpipe.algorithms.registry import register
from fedpipe.config.core import check
from fedpipe.data import ClientData
from fedpipe.fl.local import local_train
from fedpipe.fl.state import ClientUpdate, Payload
from fedpipe.fl.strategy import ClientState, Strategy


@dataclass(frozen=True)
class LGFedAvgConfig:
    warmup_rounds: int = 0
    """Rounds of plain FedAvg before the body turns local (official code: from a FedAvg model; not
    given by the papers, 0 here)."""

    def validate(self, p: str) -> None:
        check(self.warmup_rounds >= 0, f"{p}.warmup_rounds", self.warmup_rounds, "an integer >= 0")


@register("lg_fedavg")
class LGFedAvg(Strategy):
    config_class = LGFedAvgConfig
    personal_modules = ("body",)

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        if payload.round >= self.cfg.warmup_rounds:
            return super().client_update(payload, client_state, data, gen, client_id)
        model = self.scratch_model(payload.weights)  # FedAvg warm-up: everything shared
        metrics = local_train(model, data, self.task, self.local, payload.round, gen)
        return ClientUpdate(client_id, len(data), self.scratch_weights(), metrics=metrics), \
            client_state, metrics
