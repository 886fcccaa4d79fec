"""FedSim and FedAlt (Pillutla, Malik, Mohamed, Rabbat, Sanjabi, Xiao, ICML 2022, "Federated Learning
with Partial Model Personalization"; PerAda baselines (Sec. 7, Table 1), each with a personal input layer,
output layer or adapter).

The parameters split into shared u and personal v_i (``part``); client i minimises F_i(u, v_i).

- FedAlt (alternating; Algorithm 1): from the received u^t and its own v_i,
      1. v_i <- v_i - eta grad_v F_i(u^t, v_i)   for the personal epochs (u fixed),
      2. u_i <- u^t - eta grad_u F_i(u, v_i)     for the shared epochs (v_i fixed),
  upload u_i.
- FedSim (simultaneous; Algorithm 2): (u_i, v_i) <- (u, v_i) - eta grad F_i(u, v_i) jointly for
  the local epochs; upload u_i.

The server averages the u_i (FedAvg); the personalized model is (u, v_i). With ``part: output``
FedSim is FedPer and FedAlt is FedRep's alternation with its own epoch counts.

``part`` (the personal/shared split, a config value so that adapters plug in):
- ``output``: the head (the last linear layer);
- ``input``: the first parameterised layer of the body (PerAda's "input layer");
- ``adapter``: every module whose name starts with ``adapter`` (the residual adapters of
  ``fedpipe.models.adapters``; the rest of the model, backbone and head, is shared and trained: the
  paper's "adapter + shared full model", 12.59 M trained for ResNet-18 in Table 1). With this part
  the method puts PerAda's adapters into the study's ResNet itself (``adapt_model``; nothing frozen;
  PerAda's adapter dropout 0.3 and init std 1e-4, since the paper gives no FedSim/FedAlt adapter
  settings); a model without BasicBlocks is refused;
- ``modules``: the module names listed in ``modules``.
Epochs (not given by PerAda): the personal and shared phases of FedAlt each take the
client's ``fl.local`` epochs unless ``personal_epochs`` / ``shared_epochs`` are set.

Reference check (tests/test_equivalence_flbench_ref.py, docs/papers/baselines.md): with
``part=output`` and ``fl.aggregation=uniform``, FedSim's and FedAlt's client models and the server
average equal the authors' code (facebookresearch/FL_partial_personalization) to 1.1e-16 in float64
(constant lr, no momentum, no clipping, no client L2 term). The code weights clients by their
number of batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from fedpipe.algorithms.fedrep import alternating_update
from fedpipe.algorithms.registry import register
from fedpipe.config.core import check, one_of
from fedpipe.data import ClientData
from fedpipe.fl.state import ClientUpdate, Payload
from fedpipe.fl.strategy import ClientState, Strategy, module_keys
from fedpipe.models.adapters import add_adapters

PARTS = ("output", "input", "adapter", "modules")


@dataclass(frozen=True)
class PartialConfig:
    part: str = "output"
    """The personal part v: ``output`` (head), ``input`` (first layer), ``adapter`` or ``modules``."""
    modules: list[str] = field(default_factory=list)
    """Module names of the personal part when ``part: modules``."""
    personal_epochs: int | None = None
    """FedAlt step 1 epochs (v, u fixed); None = ``fl.local``'s schedule. Unused by FedSim."""
    shared_epochs: int | None = None
    """FedAlt step 2 epochs (u, v fixed); None = ``fl.local``'s schedule. Unused by FedSim."""

    def validate(self, p: str) -> None:
        one_of(f"{p}.part", self.part, PARTS)
        check(self.part != "modules" or bool(self.modules), f"{p}.modules", self.modules,
              "a non-empty list of module names when part is modules")
        for k in ("personal_epochs", "shared_epochs"):
            v = getattr(self, k)
            check(v is None or v >= 1, f"{p}.{k}", v, "null or an integer >= 1")


def partial_keys(model: nn.Module, cfg: PartialConfig, who: str) -> set[str]:
    """The state-dict names of the personal part ``cfg.part`` of ``model``."""
    if cfg.part == "output":
        keys = module_keys(model, ("head",))
    elif cfg.part == "input":
        first = next((n for n, m in model.named_modules()
                      if n and any(True for _ in m.parameters(recurse=False))), None)
        keys = module_keys(model, (first,)) if first is not None else set()
    elif cfg.part == "adapter":
        names = [n for n, _ in model.named_modules()
                 if n and n.rsplit(".", 1)[-1].startswith("adapter")]
        keys = module_keys(model, names)
    else:
        keys = module_keys(model, cfg.modules)
    if not keys:
        raise ValueError(f"{who}: part={cfg.part!r} names no entry of the model "
                         f"({type(model).__name__}); part adapter needs a model with adapters")
    if len(keys) == len(model.state_dict()):
        raise ValueError(f"{who}: part={cfg.part!r} makes the whole model personal (use local)")
    return keys


@register("fedsim")
class FedSim(Strategy):
    config_class = PartialConfig

    @classmethod
    def adapt_model(cls, model: nn.Module, cfg: PartialConfig) -> nn.Module:
        """``part: adapter``: the study's ResNet with two residual adapters per BasicBlock, all of it
        trainable (personal adapters, shared full model); other parts: the model as it is."""
        if cfg is not None and cfg.part == "adapter" and not any(
                n.rsplit(".", 1)[-1].startswith("adapter") for n, _ in model.named_modules()):
            add_adapters(model)
        return model

    def personal_keys(self, model: nn.Module) -> set[str]:
        return partial_keys(model, self.cfg, self.name)


@register("fedalt")
class FedAlt(FedSim):
    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        personal, shared = (self.local if e is None else replace(self.local, epochs=e, steps=None)
                            for e in (self.cfg.personal_epochs, self.cfg.shared_epochs))
        return alternating_update(self, payload, client_state, data, gen, client_id,
                                  ("personal", personal), ("shared", shared))
