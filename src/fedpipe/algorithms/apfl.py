"""APFL (Deng, Kamani, Mahdavi, 2020, "Adaptive Personalized Federated Learning"; a PerAda baseline,
Sec. 7).

Client i keeps a personal model v_i; its personalized model mixes it with the global one,

    v_bar_i = alpha v_i + (1 - alpha) w_i,                                          (Eq. 3)

and each local step on a batch xi (Algorithm 1, lines 6-7) updates both from the same point:

    w_i <- w_i - eta grad f_i(w_i; xi)                               (the FedAvg copy, uploaded)
    v_i <- v_i - eta grad_v f_i(v_bar_i; xi) = v_i - eta alpha grad f_i(v_bar_i; xi)

with v_bar_i formed from the values before this step. The server averages the w_i (FedAvg). The
personalized model for evaluation is alpha v_i + (1 - alpha) w with the current global w (to which
w_i is reset at the start of each round); buffers (BatchNorm statistics) are v_i's.

alpha: PerAda tunes it on {0.1, 0.3, 0.5, 0.7} without reporting the pick (App. A.2); the default
0.5 is the grid's middle, fixed, as in PerAda's grid. ``adaptive: true`` gives the paper's adaptive
alpha_i (its Section 3 update), one step per local step from the same point, kept per client and
clipped to [0, 1]:

    alpha_i <- alpha_i - eta_alpha grad_alpha f_i(v_bar_i; xi)
             = alpha_i - eta_alpha <v_i - w_i, grad f_i(v_bar_i; xi)>

with ``alpha`` its initial value and eta_alpha = ``alpha_lr`` (None: the client lr). v_i optimises with
the client's ``fl.local`` optimizer and lr (eta); it starts from the global model at the client's first
participation.

Reference check: none (docs/papers/baselines.md). FL-bench's APFL mixes logits and steps w twice
per batch; PFLlib's trains v on its own loss; neither is Algorithm 1, which this module follows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from fedpipe.algorithms.registry import register
from fedpipe.config.core import check
from fedpipe.data import ClientData
from fedpipe.fl.local import fresh_optimizer, local_train
from fedpipe.fl.state import ClientUpdate, Payload, ServerState, Weights, is_float, load_weights
from fedpipe.fl.strategy import ClientState, Strategy
from fedpipe.tasks import Batch


@dataclass(frozen=True)
class APFLConfig:
    alpha: float = 0.5
    """Mixing weight alpha of Eq. 3 (PerAda's grid {0.1, 0.3, 0.5, 0.7}; pick not reported); the
    initial value when ``adaptive``."""
    adaptive: bool = False
    """Learn alpha_i per client (the paper's adaptive update); PerAda's grid uses a fixed alpha."""
    alpha_lr: float | None = None
    """eta_alpha of the adaptive update; None = the client lr (not given by PerAda)."""

    def validate(self, p: str) -> None:
        check(0.0 <= self.alpha <= 1.0, f"{p}.alpha", self.alpha, "a number in [0, 1]")
        check(self.alpha_lr is None or self.alpha_lr > 0, f"{p}.alpha_lr", self.alpha_lr,
              "null or a number > 0")


def mix(v: Weights, w: Weights, alpha: float) -> Weights:
    """alpha v + (1 - alpha) w for float entries; integer buffers from v."""
    return {k: alpha * t + (1 - alpha) * w[k] if is_float(t) else t.clone() for k, t in v.items()}


@register("apfl")
class APFL(Strategy):
    config_class = APFLConfig

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._personal_model: nn.Module | None = None

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        alpha = self.alpha_of(client_state).clone().requires_grad_(self.cfg.adaptive)
        lr = self.local.lr_at(payload.round)
        alpha_lr = self.cfg.alpha_lr if self.cfg.alpha_lr is not None else lr
        model = self.scratch_model(payload.weights)  # w_i, from the global w
        if self._personal_model is None:
            self._personal_model = self.model_fn()
        vm = self._personal_model
        v_slots = vm.state_dict(keep_vars=True)
        v = load_weights(v_slots, client_state.get("personal") or payload.weights)
        vm.train()
        v_params = {n: p for n, p in vm.named_parameters() if p.requires_grad}
        v_opt = fresh_optimizer(vm, list(v_params.values()), self.local, lr)
        buffers = {n: b for n, b in vm.named_buffers()}

        def both_steps(m: nn.Module, batch: Batch, loss_fn) -> torch.Tensor:
            # v's step, at v_bar = alpha v + (1 - alpha) w (w before its own step: same point)
            w_now = dict(m.named_parameters())
            a = alpha.to(next(iter(v_params.values())).dtype)
            mixed = {n: a * p + (1 - a) * w_now[n].detach() for n, p in v_params.items()}
            v_opt.zero_grad(set_to_none=True)
            alpha.grad = None
            self.task.loss(_Functional(vm, {**mixed, **buffers}), batch, gen).backward()
            if self.local.grad_clip is not None:
                nn.utils.clip_grad_norm_(list(v_params.values()), self.local.grad_clip)
            v_opt.step()
            if self.cfg.adaptive:  # d f(v_bar) / d alpha = <v - w, grad f(v_bar)>
                with torch.no_grad():
                    alpha.sub_(alpha_lr * alpha.grad).clamp_(0.0, 1.0)
            # w's step (local_train clips and steps it)
            loss = loss_fn(m, batch)
            loss.backward()
            return loss

        metrics = local_train(model, data, self.task, self.local, payload.round, gen,
                              grads_fn=both_steps)
        v_opt.state.clear()
        update = ClientUpdate(client_id, len(data), self.scratch_weights(), metrics=metrics)
        v_new = {k: t.detach().clone() for k, t in v.items()}
        client_state = {**client_state, "personal": v_new}
        if self.cfg.adaptive:
            client_state["alpha"] = {"alpha": alpha.detach().clone()}
            metrics = {**metrics, "alpha": float(alpha.detach())}
        return update, client_state, metrics

    def alpha_of(self, client_state: ClientState) -> torch.Tensor:
        """Client's alpha_i (its state's, when adaptive; the configured one otherwise)."""
        if self.cfg.adaptive and "alpha" in client_state:
            return client_state["alpha"]["alpha"]
        return torch.tensor(self.cfg.alpha, dtype=torch.float64, device="cpu")  # a host scalar

    def personalized_model(self, state: ServerState, client_state: ClientState, data: ClientData,
                           gen: torch.Generator, client_id: int = 0) -> Weights | None:
        v = client_state.get("personal")
        return state.weights if not v else mix(v, state.weights, float(self.alpha_of(client_state)))


class _Functional(nn.Module):
    """``module`` called with the tensors ``values`` (torch.func.functional_call) as a model."""

    def __init__(self, module: nn.Module, values: dict[str, torch.Tensor]):
        super().__init__()
        self.module, self.values = module, values

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.module, self.values, (x,))
