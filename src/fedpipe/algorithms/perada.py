"""PerAda (Xie et al., CVPR 2024, "PerAda: Parameter-Efficient Federated Learning Personalization with
Generalization Guarantees"; §4, Algorithm 1): personalized FL with residual adapters on a frozen
pretrained backbone u, and server-side ensemble distillation of the global adapter.

The model is the study's ResNet with two adapters per BasicBlock (``fedpipe.models.adapters``); the
"adapter" w, v_m, theta_m = adapters + the bn1/bn2 BNs + the head, everything else frozen. Algorithm 1:

Client m in round t, given the global adapter w^t:

    (Personal Obj)  v_m <- argmin_v  L_m(u, v) + lam ||v - w^t||^2       E epochs of SGD, v_m kept
    (Global Obj)    theta_m <- argmin_theta L_m(u, theta), theta init w^t  E epochs of SGD, uploaded

  lambda convention: the official code's, ``CE + lam * ||v - w||^2`` with no 1/2 (docs/papers/perada.md); the
  paper's (lam_paper / 2) ||v - w||^2 has lam_paper = 2 lam. Both adapters use ``fl.local`` (epochs,
  lr, batch size, SGD), v_m first, then theta_m, as the code does. Only theta_m is communicated.

Server:

    w^{t,0} = (1/|S_t|) sum_{m in S_t} theta_m^{t+1}                      (uniform, paper and code)
    R steps:  w <- w - eta_g Adam( grad_w KL( softmax(mean_m f((u, theta_m), x)) || softmax(f((u, w), x)) ) )

on batches of an unlabelled distillation set (server data ``distill``: the generated auxiliary set, or
``holdout``: a held-out real slice), Adam with cosine decay over the R steps
(:func:`fedpipe.algorithms.feddf.distill`). ``kd: false`` is "PerAda w/o KD" (w^{t+1} = w^{t,0}).
Teachers are in eval mode (the official code leaves them in train mode, dropout and batch-stat BN on:
docs/papers/perada.md); the student trains in train mode, as in the code. Not done: the code's
selection of the KD checkpoint on a *labelled* server validation split (docs/papers/perada.md; not in
the paper): the result is w^{t,R} as in Alg. 1.

Personal model (the paper is silent; both as the official code, where each client's personal model
is a whole model of its own, a copy of the initial global model):

- v_m^0 = w^0: a client's personal adapter starts, at its first round, from the *initial* global
  adapter (kept in the server state as ``extra["initial"]`` and sent in the payload), not from the
  w^t it receives then; a client never selected is evaluated with v_m^0 = w^0;
- the frozen layers' BN running statistics (the downsample BNs: not in the adapter set, so never
  trained, uploaded or distilled) are personal too: they start at the backbone's, follow the client's
  own data while v_m trains (train mode), and its personalized model is evaluated with them, never
  with the server's (which the distillation re-estimates on the server data).

Evaluation: client m predicts with f((u, v_m), x) (``personalized_model``): the global weights
(frozen backbone) with the client's personal entries.

Backbone: where the model starts is the pipeline's, for every algorithm
(:class:`fedpipe.config.fl.InitConfig`, keys ``backbone`` and ``pretrain_rounds`` of
``algorithms.perada``); PerAda's default is ``fedavg`` (the paper's Fig. 5 alternative to ImageNet
weights: the plain model trained with FedAvg on the federation's data by the pipeline's ``backbone``
stage, then frozen). ``none`` is Fig. 5's random init; a safetensors path gives e.g. torchvision's
ImageNet ResNet-18 weights (never downloaded). The head is always freshly initialised (docs/papers/perada.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import nn

from fedpipe.algorithms.feddf import DistillConfig, distill_round, global_rng_from
from fedpipe.algorithms.registry import register
from fedpipe.config.core import check
from fedpipe.data import ClientData
from fedpipe.fl.local import local_train
from fedpipe.fl.state import (
    ClientUpdate,
    Payload,
    ServerState,
    Weights,
    trainable,
    weighted_average,
)
from fedpipe.fl.strategy import ClientState, RoundInfo, Strategy
from fedpipe.models.adapters import (
    ADAPTER_DROPOUT,
    ADAPTER_INIT_STD,
    adapter_keys,
    add_adapters,
    freeze_backbone,
)
from fedpipe.tasks import Batch


@dataclass(frozen=True)
class PerAdaConfig(DistillConfig):
    lam: float = 1.0
    """lam in Personal Obj, code convention CE + lam ||v - w||^2 (paper's lam/2 form: lam_paper = 2
    lam); Table 9, CIFAR-10: 1."""
    kd: bool = True
    """Server-side ensemble distillation of the global adapter (false: "PerAda w/o KD")."""
    adapter_dropout: float = ADAPTER_DROPOUT
    """Dropout inside each adapter (the official code's default, 0.3)."""
    adapter_init_std: float = ADAPTER_INIT_STD
    """Std of the adapters' 1x1 conv init, N(0, std^2) (code: 1e-4; near identity)."""

    def validate(self, p: str) -> None:
        super().validate(p)
        check(self.lam >= 0, f"{p}.lam", self.lam, "a number >= 0")
        check(0 <= self.adapter_dropout < 1, f"{p}.adapter_dropout", self.adapter_dropout,
              "a number in [0, 1)")
        check(self.adapter_init_std >= 0, f"{p}.adapter_init_std", self.adapter_init_std,
              "a number >= 0")


@dataclass(frozen=True)
class PerAdaNoKDConfig(PerAdaConfig):
    kd: bool = False
    """PerAda w/o KD (a registry alias so that a study can run both arms)."""


@register("perada")
class PerAda(Strategy):
    config_class = PerAdaConfig
    default_backbone = "fedavg"  # frozen: a random one is Fig. 5's worst case

    # -- declarations ---------------------------------------------------------------------------
    @classmethod
    def adapt_model(cls, model: nn.Module, cfg: PerAdaConfig) -> nn.Module:
        """The study's ResNet with adapters, backbone frozen (``Strategy.adapt_model``: the pipeline calls
        this for every model of the run: training, evaluation)."""
        add_adapters(model, cfg.adapter_dropout, cfg.adapter_init_std)
        return freeze_backbone(model)

    @classmethod
    def server_data_kind(cls, cfg: PerAdaConfig) -> str:
        return cfg.server_data if cfg.kd and cfg.kd_steps > 0 else "none"

    def personal_keys(self, model: nn.Module) -> set[str]:
        """v_m per client: the adapter set (adapters, bn1/bn2 BNs, head) and the running statistics
        of the frozen layers' BNs (the downsample BNs), each client's own as in the official code."""
        adapter = adapter_keys(model)
        return adapter | {k for k, _ in model.named_buffers() if k not in adapter}

    @cached_property
    def adapter(self) -> frozenset[str]:
        """The adapter set: what theta_m and w hold (trained, uploaded, averaged, distilled)."""
        return frozenset(adapter_keys(self.scratch_model_instance()))

    def init_server(self, model: nn.Module) -> ServerState:
        """w^0, and the personal entries of the initial model (v_m^0 = w^0 for every client)."""
        state = super().init_server(model)
        initial = {k: v.clone() for k, v in state.weights.items() if k in self.personal}  # a snapshot
        return ServerState(state.weights, {**state.extra, "initial": initial}, state.meta)

    def payload(self, state: ServerState, round_: int, client_id: int = 0) -> Payload:
        """w^t, and v_m^0 for a client's first round."""
        return Payload(round_, state.weights, {"initial": state.extra["initial"]}, client_id)

    @staticmethod
    def own_entries(extra: dict[str, Weights], client_state: ClientState) -> Weights:
        """v_m: the client's personal entries, or v_m^0 = w^0 (``extra["initial"]``, from the
        payload or the server state) before its first round."""
        return client_state.get("personal") or extra["initial"]

    # -- client ---------------------------------------------------------------------------------
    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        lam = self.cfg.lam
        # Personal Obj: v_m from its last value (w^0 at the client's first round), proximal to w^t
        own = self.own_entries(payload.extra, client_state)
        model = self.scratch_model({**payload.weights, **own})
        params = trainable(model)
        w_t = {n: payload.weights[n] for n in params}  # the proximal centre (not trained)

        def personal_objective(m: nn.Module, batch: Batch) -> torch.Tensor:
            proximal = sum(((p - w_t[n]) ** 2).sum() for n, p in params.items())
            return self.task.loss(m, batch, gen) + lam * proximal

        with global_rng_from(gen):  # the adapters' dropout masks come from the client's stream
            mp = local_train(model, data, self.task, self.local, payload.round, gen,
                             loss_fn=personal_objective)
        _, v_m = self.split_personal(self.scratch_weights())
        # Global Obj: theta_m from w^t, plain task loss; the adapter set is uploaded
        model = self.scratch_model(payload.weights)
        with global_rng_from(gen):
            ml = local_train(model, data, self.task, self.local, payload.round, gen)
        theta_m = {k: v for k, v in self.scratch_weights().items() if k in self.adapter}
        metrics = {"loss": ml["loss"], "steps": ml["steps"] + mp["steps"],
                   "personal_loss": mp["loss"]}
        return (ClientUpdate(client_id, len(data), theta_m, metrics=metrics),
                {**client_state, "personal": v_m}, metrics)

    # -- server ---------------------------------------------------------------------------------
    def aggregate(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        """w^{t,0}: the uniform average of the uploaded local adapters (paper and code)."""
        if not rnd.updates:
            return state
        avg = weighted_average([u.weights for u in rnd.updates], [1.0] * len(rnd.updates))
        return ServerState(weights={**state.weights, **avg}, extra=state.extra, meta=state.meta)

    def server_update(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        """R steps of ensemble distillation of w from the round's local adapters."""
        return distill_round(self, state, rnd) if self.cfg.kd else state

    # -- personalization ------------------------------------------------------------------------
    def personalized_model(self, state: ServerState, client_state: ClientState, data: ClientData,
                           gen: torch.Generator, client_id: int = 0) -> Weights:
        """f((u, v_m), .): the global weights (the frozen backbone u) with the client's own entries
        (v_m^0 = w^0 for a client never selected)."""
        return {**state.weights, **self.own_entries(state.extra, client_state)}


@register("perada_nokd")
class PerAdaNoKD(PerAda):
    """PerAda w/o KD under its own registry name (``algorithms.perada_nokd``: kd false by default),
    so that one study compares the two arms."""

    config_class = PerAdaNoKDConfig
