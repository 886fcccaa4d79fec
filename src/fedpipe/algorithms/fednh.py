"""FedNH (Dai, Chen, Li, Heinecke, Sun, Xu, AAAI 2023, "Tackling Data Heterogeneity in Federated
Learning with Class Prototypes"; §3.2, Algorithm 1; official code's deviations marked [code]).

Model: the classifier's head is replaced by C unit-norm class prototypes W (no bias) and a trainable
scale s (:class:`fedpipe.models.prototype.PrototypeHead`), so with a body f

    logits_c = s * <W_c, f(theta; x) / ||f(theta; x)||>                                   (Eq. 2)

W^0 is maximally separated on the sphere (Eq. 1): ``orthogonal`` rows [code, default] or the simplex
ETF (``etf``). Works on any registered classifier (``head(features(x))``): cnn_fednh, resnet18, ...

Round t (Algorithm 1, code version):

    client k in S^t, from (theta^t, s^t, W^t), with W^t frozen:
        theta_k, s_k <- local SGD on the cross-entropy of Eq. 2                      (Alg. 1, l. 5-7)
        for each class c it owns (n_{k,c} > 0), over its training data (eval mode, no grad):
            S_{k,c} = sum_{i: y_i = c} f(theta_k; x_i) / ||f(theta_k; x_i)||           (Eq. 3 x n_{k,c})
        upload theta_k, s_k, {S_{k,c}}, {n_{k,c}}
    server:
        theta^{t+1}, s^{t+1} = average of (theta_k, s_k)                            (fl.aggregation)
        a_c = normalize( sum_k n_{k,c} normalize(S_{k,c}) / sum_k n_{k,c} )      [code], or
        a_c = sum_k (1/|S^t|) S_{k,c} / n_{k,c}                                  (Eq. 4, ``paper``)
        W_c^{t+1} = normalize( rho W_c^t + (1 - rho) a_c )                          (Eq. 4, Alg. 1 l. 10)
        for every class c owned by some participant; the others keep W_c^t.

normalize(S_{k,c}) is the renormalised class mean mu_{k,c} (Eq. 3) [code]; the ``paper`` variant
averages the raw means with alpha_k = 1/|S^t| (App. A.2), zeros for clients without the class.

Personalized model (§4.1): the client's latest local model, i.e. its trained body and s with the
prototypes W^t it received (they stay frozen). Global model: (theta^{t+1}, s^{t+1}, W^{t+1}).

The client uploads the sums and counts as the extra group ``prototypes`` ({"sum": (C, d), "count":
(C,)}); the prototype pass reuses the client's training generator for its (unshuffled) batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedpipe.algorithms.fedavg import KeepsLocalModel
from fedpipe.algorithms.registry import register
from fedpipe.config.core import check, one_of
from fedpipe.data import ClientData
from fedpipe.device import module_device
from fedpipe.fl.state import ClientState, ClientUpdate, Payload, ServerState, Weights, sum_of
from fedpipe.fl.strategy import RoundInfo
from fedpipe.models.prototype import PROTOTYPE_INITS, with_prototype_head

PROTOTYPES = "head.weight"
"""The state-dict entry of the prototypes W (C, d)."""
GROUP = "prototypes"
EVAL_BATCH = 512
RESNET_SCALE = 20.0  # [code] ResNetModNH's initial s
CNN_SCALE = 1.0  # [code] Conv2CifarNH's initial s


@dataclass(frozen=True)
class FedNHConfig:
    rho: float = 0.9
    """rho, the smoothing of the prototype update W_c <- normalize(rho W_c + (1-rho) a_c) (Eq. 4;
    0.9 in all the paper's experiments, App. A.2)."""
    init: str = "orthogonal"
    """W^0: ``orthogonal`` rows ([code] FedNH_head_init) or ``etf`` (the simplex ETF, Eq. 1's exact
    optimum for d >= C)."""
    scale: float | None = None
    """Initial value of the trainable scale s in Eq. 2. null: by model, 20.0 for resnet18 and 1.0 for
    the others ([code]: Conv2CifarNH 1.0, ResNetModNH 20.0)."""
    aggregation: str = "code"
    """How client class means are combined into a_c: ``code`` (sample-count weighted mean of the
    renormalised client means, renormalised; the official code, docs/papers/fednh.md) or ``paper`` (Eq. 4 with
    alpha_k = 1/|S^t|, raw means, zeros for non-owners)."""

    def validate(self, p: str) -> None:
        check(0.0 <= self.rho < 1.0, f"{p}.rho", self.rho, "a number in [0, 1)")
        one_of(f"{p}.init", self.init, PROTOTYPE_INITS)
        check(self.scale is None or self.scale > 0, f"{p}.scale", self.scale,
              "null (by model) or a number > 0")
        one_of(f"{p}.aggregation", self.aggregation, ("code", "paper"))


def class_sums(model: nn.Module, data: ClientData, num_classes: int, gen: torch.Generator
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, d) sums of normalised features f(x)/||f(x)|| per class over ``data`` and (C,) counts
    (Eq. 3 times n_{k,c}), in eval mode without gradients."""
    was_training = model.training
    model.eval()
    dim = model.head.in_features
    sums = torch.zeros(num_classes, dim, device=module_device(model), dtype=model.head.weight.dtype)
    with torch.inference_mode():
        for x, y in data.batches(EVAL_BATCH, gen, shuffle=False):
            z = F.normalize(model.features(x), dim=1)
            sums.index_add_(0, y, z.to(sums.dtype))
    model.train(was_training)
    counts = torch.bincount(data.y, minlength=num_classes).to(sums.dtype)
    return sums, counts


def prototype_update(w: torch.Tensor, sums: list[torch.Tensor], counts: list[torch.Tensor],
                     rho: float, aggregation: str = "code") -> torch.Tensor:
    """Eq. 4: W_c <- normalize(rho W_c + (1 - rho) a_c) for the classes some client owns (count > 0);
    the other rows of ``w`` are returned unchanged. ``sums`` / ``counts`` per client, in client order."""
    total = sum_of(counts)
    owned = total > 0
    if aggregation == "code":
        # sum_k n_{k,c} normalize(mu_{k,c}); normalize(S) = normalize(S / n) = the renormalised mean
        agg = sum_of([n[:, None] * F.normalize(s, dim=1) for s, n in zip(sums, counts, strict=True)])
        a = F.normalize(agg / total.clamp_min(1e-12)[:, None], dim=1)
    else:  # Eq. 4 with alpha_k = 1/|S^t|: the mean over clients of the raw class means
        means = [s / n.clamp_min(1.0)[:, None] for s, n in zip(sums, counts, strict=True)]
        a = sum_of(means) / len(means)
    new = F.normalize(rho * w + (1 - rho) * a, dim=1)
    return torch.where(owned[:, None], new, w)


@register("fednh")
class FedNH(KeepsLocalModel):
    config_class = FedNHConfig

    @classmethod
    def adapt_model(cls, model: nn.Module, cfg: FedNHConfig) -> nn.Module:
        scale = cfg.scale
        if scale is None:
            from fedpipe.models.classifiers import ResNet18
            scale = RESNET_SCALE if isinstance(model, ResNet18) else CNN_SCALE
        return with_prototype_head(model, cfg.init, scale)

    # -- client ------------------------------------------------------------------------------
    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        # local SGD on body and s; W has requires_grad=False, so no optimizer touches it
        update, client_state, metrics = super().client_update(payload, client_state, data, gen,
                                                              client_id)
        local = update.weights
        model = self.scratch_model_instance()  # still holds the weights just trained
        sums, counts = class_sums(model, data, local[PROTOTYPES].shape[0], gen)
        shared = {k: v for k, v in local.items() if k != PROTOTYPES}  # W is the server's
        update = ClientUpdate(client_id, len(data), shared, {GROUP: {"sum": sums, "count": counts}},
                              metrics)
        return update, self.remember(client_state, local), metrics

    # -- server ------------------------------------------------------------------------------
    def server_update(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        """Eq. 4 on the round's uploaded class sums (the bodies were averaged in ``aggregate``)."""
        if not rnd.updates:
            return state
        groups = [u.extra[GROUP] for u in rnd.updates]
        w = prototype_update(state.weights[PROTOTYPES], [g["sum"] for g in groups],
                             [g["count"] for g in groups], self.cfg.rho, self.cfg.aggregation)
        weights: Weights = {**state.weights, PROTOTYPES: w}
        return ServerState(weights=weights, extra=state.extra, meta=state.meta)
