"""FedBN (Li, Jiang, Zhang, Kamp, Dou, ICLR 2021, "FedBN: Federated Learning on Non-IID Features via
Local Batch Normalization"; a PerAda baseline, Sec. 7 and Table 1: personal BN).

FedAvg in which every BatchNorm layer stays on its client: its affine parameters (gamma, beta) and its
running statistics (mean, variance, batch count) are personal, all other parameters are averaged
(Algorithm 1: w^{t+1} = sum_k p_k w_k for every non-BN entry; the BN entries of client k are never
sent). The personalized model of client k is the global model with k's own BN layers; the global model
keeps the initial BN layers (as FedPer's global model keeps the initial head).

``norm: batch`` (the paper) makes the BatchNorm layers personal; ``norm: all`` extends FedBN to every
normalisation layer (GroupNorm, LayerNorm, InstanceNorm too: an option, not the paper). A model
without such layers is refused (FedBN would silently be FedAvg).

Reference check (tests/test_equivalence_flbench_ref.py, docs/papers/baselines.md): the client's
BatchNorm state, its shared weights and the server average equal PFLlib's FedBN to 2.2e-16 in
float64. PFLlib selects BN layers by the name containing "bn"; this module by module type.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from fedpipe.algorithms.registry import register
from fedpipe.config.core import one_of
from fedpipe.fl.strategy import Strategy, module_keys

NORM_CHOICES = ("batch", "all")
NORMS = {"batch": (_BatchNorm,), "all": (_BatchNorm, _InstanceNorm, nn.GroupNorm, nn.LayerNorm)}


@dataclass(frozen=True)
class FedBNConfig:
    norm: str = "batch"
    """Which layers are personal: ``batch`` (every BatchNorm: the paper) or ``all`` (every
    normalisation layer; an extension for models without BatchNorm)."""

    def validate(self, p: str) -> None:
        one_of(f"{p}.norm", self.norm, NORM_CHOICES)


@register("fedbn")
class FedBN(Strategy):
    config_class = FedBNConfig

    def personal_keys(self, model: nn.Module) -> set[str]:
        layers = [n for n, m in model.named_modules() if isinstance(m, NORMS[self.cfg.norm])]
        if not layers:
            raise ValueError(f"fedbn: the model ({type(model).__name__}) has no "
                             f"{'BatchNorm' if self.cfg.norm == 'batch' else 'normalisation'} "
                             f"layer, so FedBN would be FedAvg; use a model with BatchNorm "
                             f"(resnet18) or algorithms.fedbn.norm: all")
        return module_keys(model, layers)
