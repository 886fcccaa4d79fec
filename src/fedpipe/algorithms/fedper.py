"""FedPer (Arivazhagan et al. 2019, "Federated Learning with Personalization Layers"; settings of FedNH
App. A.2): the last linear layer (``head``) is personal, the rest (the body) is shared and
averaged as in FedAvg. Each client trains body and head together on its data; the global model keeps
the initial head ("GM uses the initial head").
"""

from __future__ import annotations

from fedpipe.algorithms.registry import register
from fedpipe.fl.strategy import Strategy


@register("fedper")
class FedPer(Strategy):
    personal_modules = ("head",)
    batchable = True  # the base client step with a personal head (fedpipe.fl.batched)
