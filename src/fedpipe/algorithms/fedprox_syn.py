"""FedProx trained with MTT-distilled data added: FedPTR's own control (Chen et al., "Federated
Learning with Projected Trajectory Regularization", arXiv 2312.14380, App. E, Table 12, "Extra
synthetic data").

App. E: "a trivial idea for tackling data heterogeneity is to apply MTT to obtain the synthetic
dataset and combine those distilled data with the available local data to train FedProx". Here:

- the server fits one synthetic set D~ by Matching Training Trajectories to the last m rounds of the
  global trajectory, w^{t-m} -> w^t, exactly as FedPTR-S does (Algorithm 3 lines 1-8: noise
  initialisation from the stream ``fedptr-syn-init``, the same MTT settings and schedule, the
  config of :class:`fedpipe.algorithms.fedptr.FedPTRConfig`); there is no projection and no
  trajectory pull;
- each selected client trains FedProx (Li et al. 2020, Eq. 2: F_k(w) + mu/2 ||w - w^t||^2 from w^t)
  on its own data with D~ appended (its images mapped back from MTT's normalised space to the
  model's input space, its balanced labels), in rounds t > m once D~ exists; plain FedProx before.

The paper says no more about the arm (where the MTT runs, how many images, how they are mixed):
the server-side fit is our reading (a client-side fit would be FedPTR's Algorithm 2 without the
projection; docs/papers/fedptr.md), chosen so that the arm differs from FedPTR-S only in what the
distilled data are used for. Table 12 (CIFAR10 Dir(0.01), 10 clients, 100%): 50.08 against FedAvg
55.45 and FedPTR-S 68.16; the claim the paper makes of it is that it scores below FedAvg
(:mod:`fedpipe.claims.fedptr`, claim 6).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedpipe.algorithms.fedptr import FedPTRConfig, FedPTRS
from fedpipe.algorithms.registry import register
from fedpipe.config.core import check
from fedpipe.data import ClientData
from fedpipe.fl.local import local_train, proximal_loss
from fedpipe.fl.mtt import Params, SyntheticSet, mtt_update
from fedpipe.fl.state import ClientUpdate, Payload, ServerState, Weights, trainable
from fedpipe.fl.strategy import ClientState, RoundInfo


@dataclass(frozen=True)
class FedProxSynConfig(FedPTRConfig):
    mu: float = 0.01
    """FedProx's proximal coefficient (Eq. 2); 0.01 as the ``fedprox`` arm (the paper gives none)."""

    def validate(self, p: str) -> None:
        super().validate(p)
        check(self.mu >= 0, f"{p}.mu", self.mu, "a number >= 0")


def raw_images(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Images of MTT's normalised space back in the model's input space: ``x * std + mean`` through
    the model's ``normalize`` layer (the inverse of :func:`fedpipe.algorithms.fedptr.normalised`)."""
    norm = getattr(model, "normalize", None)
    if not isinstance(norm, nn.Module) or getattr(norm, "identity", True):
        return x
    return x * norm.std.to(x.device) + norm.mean.to(x.device)


@register("fedprox_syn")
class FedProxSyn(FedPTRS):
    """FedProx on each client's data plus the server's MTT-distilled set (Table 12's arm)."""

    config_class = FedProxSynConfig

    def mtt_and_project(self, syn: SyntheticSet, w_start: Weights, w_end: Weights, run_mtt: bool,
                        gen: torch.Generator) -> tuple[SyntheticSet, Params, dict[str, float]]:
        """MTT only (no projection: the distilled data are trained on, not projected with)."""
        if not run_mtt:
            return syn, {}, {}
        syn, metrics = mtt_update(self.mtt_model(), syn, self.params_from(w_start),
                                  self.params_from(w_end), self.mtt_settings, self.augment(), gen)
        return syn, {}, metrics

    def server_update(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        new = super().server_update(state, rnd)
        new.extra.pop("proj", None)
        return new

    def payload(self, state: ServerState, round_: int, client_id: int = 0) -> Payload:
        """w^t, and D~ (``syn``) once the server has fitted it."""
        extra = {"syn": state.extra["syn"]} if "syn" in state.extra else {}
        return Payload(round=round_, weights=state.weights, extra=extra, client_id=client_id)

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        model = self.scratch_model(payload.weights)
        own = len(data)  # the aggregation weight: the client's own samples (fl.aggregation)
        if "syn" in payload.extra:
            syn = SyntheticSet.from_group(payload.extra["syn"])
            x = raw_images(model, syn.x.detach().to(data.x.device, data.x.dtype))
            data = ClientData(torch.cat([data.x, x]), torch.cat([data.y, syn.y.to(data.y)]),
                              data.skew)
        params = trainable(model)
        centre = {n: payload.weights[n] for n in params}
        metrics = local_train(model, data, self.task, self.local, payload.round, gen,
                              loss_fn=proximal_loss(self.task, gen, params, self.cfg.mu, centre))
        return (ClientUpdate(client_id, own, self.scratch_weights(), metrics=metrics),
                client_state, metrics)
