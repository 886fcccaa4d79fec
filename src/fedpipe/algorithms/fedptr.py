"""FedPTR and FedPTR-S (Chen, Cao, Wang, Hsieh, Chen, "Federated Learning with Projected Trajectory
Regularization", arXiv 2312.14380, 2023; §3.1, Algorithms 2-3).

A small synthetic set D~ (C classes x ``ipc`` images, fixed balanced labels) is fitted by Matching
Training Trajectories (Algorithm 1, :mod:`fedpipe.fl.mtt`) to the last m rounds of the global
trajectory, w^{t-m} -> w^t, and then *projects* the next step: K steps of gradient descent on D~
from w^t (Algorithm 2 lines 9-11),

    w~^{t+1} = w^t;   w~^{t+1} <- w~^{t+1} - eta * grad L(w~^{t+1}; D~)   (K times).

Each client starts from w^t and minimises its task loss plus a layer-adaptive pull toward w~^{t+1}
(Eq. 2 with §3.1's layer-adaptive lambda):

    L(w; D_i) + sum_j (lambda_j / 2) ||w_[j] - w~_[j]||^2,   lambda_j = lambda / ||w_[j] - w~_[j]||,

recomputed at every local step with the current weights. ``lambda_stop_gradient: true`` (default,
our reading) treats lambda_j as a constant, so the penalty's gradient for layer j is
lambda (w_[j] - w~_[j]) / ||w_[j] - w~_[j]||, a pull of constant size lambda; ``false``
backpropagates through lambda_j as well (half that gradient). A "layer" is one module (its weight
and bias together; docs/papers/fedptr.md). ``layer_adaptive: false`` is the fixed-lambda form
(lambda / 2) ||w - w~||^2 of Table 4. The norm is guarded with sqrt(sum d^2 + 1e-12). In rounds
t <= m there is no trajectory yet: lambda~ = 0, plain FedAvg (Algorithms 2-3, lines 9-11).

- ``fedptr`` (client side, Algorithm 2): each client keeps D~_i, its beta_i and the MTT momentum
  buffers in its client state (group ``syn``), initialised at its first selection with ``ipc`` of its
  own images, drawn uniformly with replacement, for each class it holds, and N(0, 1) noise in the
  model's normalised input space for the others (§3.1, "Initialization of the Auxiliary Dataset").
  The client receives w^t and w^{t-m} (a simulation shortcut for partial participation: the
  server's history buffer; docs/papers/fedptr.md), runs MTT and the projection itself, and trains.
- ``fedptr_s`` (server side, Algorithm 3): one D~ on the server, from noise (created at the first
  MTT round from the stream ``fedptr-syn-init``), trained in ``server_update`` on the history of
  global models kept in ``state.extra`` (``hist_0`` = w^t, ..., ``hist_m`` = w^{t-m}). The projected
  model w~^{t+1} reaches the clients in the payload (``extra["proj"]``).
- ``fedptr_s_once``: FedPTR-S with ``mtt_once: true`` (one MTT update, the "one-shot" row of Table 7;
  a registered alias so that one study can run both variants).
- ``fedptr_fixed``: client-side FedPTR with ``layer_adaptive: false``, Table 4's "fixed lambda" row
  (the paper's only ablation of the regulariser; its fixed value is not stated, ``lam`` is kept).
- ``fedptr_noproj``: a control, not a run of the paper: ``target: current`` aims the layer-adaptive,
  constant-magnitude pull at w^t itself (no synthetic set, no MTT, no projection), so that a win of
  FedPTR-S over FedProx can be told apart from a win of the pull's form alone.

D~ lives in the normalised input space (``(x - mean) / std``, MTT's; see :mod:`fedpipe.fl.mtt`):
noise is N(0, 1) there, a client's real images are normalised with the model's own constants, and
MTT, DSA and the projection run on the model without its ``normalize`` layer, so lr_img = 1000 and
the DSA values mean what they mean in MTT.

Reduced frequency (§5.3, Table 7): MTT runs when the previous MTT run is at least ``mtt_every`` (F) rounds
old, or only once (``mtt_once``); the projection and the regularisation run every round t > m.

Round indexing: the engine's round r (0-based) receives w^r. FedPTR-S's ``server_update`` of round r
holds w^{t}, t = r + 1, and prepares w~^{t+1} for round t when t > m, exactly Algorithm 3's order.

Hyperparameters (§5.1): lambda = 0.05, K = 5, eta = 0.01 (the paper's symbol for both the projection
lr and the client lr; one value for both), ipc = 10, H = 20, R = 10, beta0 = 0.01 (stated); m = 1 (the
paper gives no value; docs/papers/fedptr.md); lr_img = 1000, lr_beta = 1e-5, momentum 0.5, DSA on
with ``color_crop_cutout_flip_scale_rotate``, no ZCA (MTT defaults, which §5.1 adopts); beta_min = 0
(no clamp: an optional safeguard of ours, off by default).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedpipe.algorithms.registry import register
from fedpipe.config.core import check
from fedpipe.data import ClientData
from fedpipe.device import generator_on, module_device
from fedpipe.fl.local import local_train
from fedpipe.fl.mtt import (
    DSA_FAMILIES,
    MTTSettings,
    Params,
    SyntheticSet,
    make_dsa,
    mtt_update,
    on_normalised_inputs,
    project,
)
from fedpipe.fl.state import ClientUpdate, Payload, ServerState, Weights, clone, trainable
from fedpipe.fl.strategy import ClientState, RoundInfo, Strategy
from fedpipe.tasks import Batch

EPS = 1e-12


@dataclass(frozen=True)
class FedPTRConfig:
    lam: float = 0.05
    """lambda, the base of the layer-adaptive weight lambda_j = lambda / ||w_[j] - w~_[j]|| (Eq. 2,
    §5.1 default 0.05; Fig. 3's best is 0.1)."""
    layer_adaptive: bool = True
    """lambda_j per layer (all reported results) or one fixed lambda (Table 4's "fixed")."""
    lambda_stop_gradient: bool = True
    """lambda_j is a constant in the gradient (our reading, docs/papers/fedptr.md; the paper does not
    say)."""
    window: int = 1
    """m, the trajectory window w^{t-m} -> w^t (Alg. 2 line 8); the paper gives no value; 1
    is our choice (docs/papers/fedptr.md)."""
    proj_steps: int = 5
    """K, gradient steps of the projection (Alg. 2 lines 9-11)."""
    proj_lr: float = 0.01
    """eta, the projection's lr (the paper's eta = 0.01, the client lr's value)."""
    ipc: int = 10
    """Synthetic images per class (FMNIST/CIFAR10 10, CIFAR100 2)."""
    mtt_iterations: int = 20
    """H, MTT outer iterations per MTT update (Alg. 1)."""
    syn_steps: int = 10
    """R, unrolled student steps (Alg. 1)."""
    beta_init: float = 0.01
    """beta0, the learnable student lr's initial value."""
    lr_img: float = 1000.0
    """lr of the synthetic pixels, SGD momentum ``mtt_momentum`` (MTT default)."""
    lr_beta: float = 1.0e-5
    """lr of beta, SGD momentum ``mtt_momentum`` (MTT default ``lr_lr``)."""
    mtt_momentum: float = 0.5
    """Momentum of both MTT optimisers (MTT default)."""
    beta_min: float = 0.0
    """Clamp beta >= beta_min after each step (a safeguard of ours, not in the paper; 0 = off)."""
    dsa: bool = True
    """Differentiable augmentation in the student steps (MTT default: on)."""
    dsa_strategy: str = "color_crop_cutout_flip_scale_rotate"
    """DSA families, "_"-separated, one drawn per student step (MTT's "single" mode)."""
    mtt_every: int = 1
    """F: MTT runs when its last run is at least F rounds old (§5.3; 1 = every round)."""
    mtt_once: bool = False
    """Run MTT only once (the one-shot variant); the projection still runs every round."""
    init: str = "real"
    """D~ initialisation on a client: ``real`` (own images where the client has the class, noise
    elsewhere; the paper's) or ``noise`` (Table 5's "random init"). FedPTR-S is always noise."""
    target: str = "projected"
    """What the pull aims at in rounds t > m: ``projected``, w~^{t+1} (the method), or ``current``,
    w^t itself with no MTT and no projection (the control ``fedptr_noproj``: FedPTR's pull aimed where
    FedProx's is; not a run of the paper)."""

    def validate(self, p: str) -> None:
        check(self.lam >= 0, f"{p}.lam", self.lam, "a number >= 0")
        for key in ("window", "proj_steps", "ipc", "mtt_iterations", "syn_steps", "mtt_every"):
            v = getattr(self, key)
            check(isinstance(v, int) and v >= 1, f"{p}.{key}", v, "an integer >= 1")
        for key in ("proj_lr", "beta_init", "lr_img"):
            check(getattr(self, key) > 0, f"{p}.{key}", getattr(self, key), "a number > 0")
        for key in ("lr_beta", "beta_min"):
            check(getattr(self, key) >= 0, f"{p}.{key}", getattr(self, key), "a number >= 0")
        check(0 <= self.mtt_momentum < 1, f"{p}.mtt_momentum", self.mtt_momentum, "a number in [0, 1)")
        fams = self.dsa_strategy.split("_")
        check(bool(fams) and all(f in DSA_FAMILIES for f in fams), f"{p}.dsa_strategy",
              self.dsa_strategy, "families joined by '_', each one of " + ", ".join(DSA_FAMILIES))
        check(self.init in ("real", "noise"), f"{p}.init", self.init, "one of noise, real")
        check(self.target in ("projected", "current"), f"{p}.target", self.target,
              "one of current, projected")


@dataclass(frozen=True)
class FedPTRSOnceConfig(FedPTRConfig):
    mtt_once: bool = True
    """The one-shot variant (Table 7's last row)."""


@dataclass(frozen=True)
class FedPTRFixedConfig(FedPTRConfig):
    layer_adaptive: bool = False
    """Table 4's "fixed lambda": (lambda / 2) ||w - w~||^2 with lambda = ``lam`` (the paper does not
    give the fixed value; the base lambda 0.05 is kept)."""


@dataclass(frozen=True)
class FedPTRNoProjConfig(FedPTRConfig):
    target: str = "current"
    """The control: the layer-adaptive pull aimed at w^t, without MTT or projection."""


# -- the layer-adaptive penalty (Eq. 2, §3.1) -----------------------------------------------------
def layer_groups(names: list[str]) -> list[list[str]]:
    """Parameter names grouped by module (``body.0.weight`` and ``body.0.bias`` are one layer)."""
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(n.rsplit(".", 1)[0] if "." in n else n, []).append(n)
    return list(groups.values())


def ptr_penalty(params: dict[str, torch.Tensor], target: Weights, lam: float,
                groups: list[list[str]], adaptive: bool = True, stop_gradient: bool = True
                ) -> torch.Tensor:
    """sum_j (lambda_j / 2) ||w_[j] - w~_[j]||^2 with lambda_j = lambda / ||w_[j] - w~_[j]|| (or
    lambda_j = lambda when not ``adaptive``); lambda_j detached when ``stop_gradient``."""
    first = next(iter(params.values()))
    total = torch.zeros((), dtype=first.dtype, device=first.device)
    for names in groups:
        sq = sum(((params[n] - target[n]) ** 2).sum() for n in names)
        if adaptive:
            norm = torch.sqrt(sq + EPS)
            lam_j = lam / (norm.detach() if stop_gradient else norm)
        else:
            lam_j = lam
        total = total + lam_j / 2 * sq
    return total


def noise_images(model: nn.Module, n: int, shape: tuple[int, ...], gen: torch.Generator
                 ) -> torch.Tensor:
    """N(0, 1) images in the normalised input space where D~ lives (MTT's random init)."""
    g = generator_on(gen, module_device(model))
    return torch.randn(n, *shape, generator=g, device=g.device)


def normalised(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Raw [0, 1] images in the normalised space the model sees (its ``normalize`` layer, if any)."""
    norm = getattr(model, "normalize", None)
    return norm(x) if isinstance(norm, nn.Module) else x


def balanced_labels(num_classes: int, ipc: int, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.arange(num_classes, device=device).repeat_interleave(ipc)


@register("fedptr_s")
class FedPTRS(Strategy):
    """FedPTR-S (Algorithm 3): the synthetic set lives on the server."""

    config_class = FedPTRConfig

    @classmethod
    def adapt_model(cls, model: nn.Module, cfg: FedPTRConfig) -> nn.Module:
        """The model as is, refused when MTT would unroll it and it keeps BatchNorm running
        statistics: torch.func's functional unroll cannot update the captured buffers (an in-place
        add on a captured tensor). MTT's ConvNet (instance norm), the MLP and models with group norm
        train; the pipeline turns the refusal into one line naming model.name before any data
        loads."""
        if getattr(cfg, "target", "trajectory") != "current" and any(
                isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
                for m in model.modules()):
            raise ValueError("FedPTR's MTT unrolls the model with torch.func, which cannot update "
                             "BatchNorm running statistics: a model without BatchNorm (convnet, mlp)"
                             " or with norm: group")
        return model

    # -- shared pieces ------------------------------------------------------------------------
    @property
    def mtt_settings(self) -> MTTSettings:
        c = self.cfg
        return MTTSettings(iterations=c.mtt_iterations, syn_steps=c.syn_steps, lr_img=c.lr_img,
                           lr_beta=c.lr_beta, momentum=c.mtt_momentum, beta_min=c.beta_min)

    def augment(self):
        return make_dsa(self.cfg.dsa_strategy) if self.cfg.dsa else None

    def mtt_model(self) -> nn.Module:
        """The model on normalised inputs (MTT's space, :func:`fedpipe.fl.mtt.on_normalised_inputs`):
        D~ is kept, trained, augmented and projected with in normalised units."""
        if getattr(self, "_mtt_view", None) is None:
            self._mtt_view = on_normalised_inputs(self.scratch_model_instance())
        return self._mtt_view

    def param_names(self) -> list[str]:
        return list(trainable(self.scratch_model_instance()))

    def params_from(self, weights: Weights) -> Params:
        return {n: weights[n] for n in self.param_names()}

    def mtt_due(self, t: int, last_mtt: int | None) -> bool:
        """Whether round t runs MTT (§5.3): never run yet, or the last run >= F rounds old."""
        if last_mtt is None:
            return True
        return not self.cfg.mtt_once and t - last_mtt >= self.cfg.mtt_every

    def mtt_and_project(self, syn: SyntheticSet, w_start: Weights, w_end: Weights, run_mtt: bool,
                        gen: torch.Generator) -> tuple[SyntheticSet, Params, dict[str, float]]:
        """Alg. 2 lines 7-11: MTT(w^{t-m}, w^t, D~) when due, then K projection steps from w^t."""
        model = self.mtt_model()
        metrics: dict[str, float] = {}
        if run_mtt:
            syn, metrics = mtt_update(model, syn, self.params_from(w_start), self.params_from(w_end),
                                      self.mtt_settings, self.augment(), gen)
        proj = project(model, self.params_from(w_end), syn.x, syn.y, self.cfg.proj_lr,
                       self.cfg.proj_steps)
        return syn, proj, metrics

    def regularised_update(self, payload: Payload, proj: Params | None, data: ClientData,
                           gen: torch.Generator, client_id: int
                           ) -> tuple[ClientUpdate, dict[str, float]]:
        """Alg. 2 line 12: one local solve from w^t of L(w; D_i) + the pull toward w~^{t+1}
        (lambda~ = 0, plain local SGD, when ``proj`` is None)."""
        model = self.scratch_model(payload.weights)
        loss_fn = None
        if proj is not None and self.cfg.lam > 0:
            params = trainable(model)
            groups = layer_groups(list(params))
            target = {n: proj[n].detach() for n in params}
            c = self.cfg

            def loss_fn(m: nn.Module, batch: Batch) -> torch.Tensor:
                return self.task.loss(m, batch, gen) + ptr_penalty(
                    params, target, c.lam, groups, c.layer_adaptive, c.lambda_stop_gradient)
        metrics = local_train(model, data, self.task, self.local, payload.round, gen,
                              loss_fn=loss_fn)
        return ClientUpdate(client_id, len(data), self.scratch_weights(), metrics=metrics), metrics

    # -- the history of global models -----------------------------------------------------------
    def history(self, state: ServerState) -> list[Weights]:
        """[w^t, w^{t-1}, ..., w^{t-k}], k <= m, from ``state.extra``."""
        out, i = [], 0
        while f"hist_{i}" in state.extra:
            out.append(state.extra[f"hist_{i}"])
            i += 1
        return out

    def with_history(self, state: ServerState, hist: list[Weights]) -> dict[str, Weights]:
        extra = {k: v for k, v in state.extra.items() if not k.startswith("hist_")}
        extra.update({f"hist_{i}": w for i, w in enumerate(hist[: self.cfg.window + 1])})
        return extra

    def init_server(self, model: nn.Module) -> ServerState:
        state = super().init_server(model)
        state.extra["hist_0"] = clone(state.weights)
        return state

    # -- hooks ----------------------------------------------------------------------------------
    def payload(self, state: ServerState, round_: int, client_id: int = 0) -> Payload:
        if self.cfg.target == "current":  # the control: w~ = w^t itself, in rounds t > m
            extra = {"proj": self.params_from(state.weights)} if round_ > self.cfg.window else {}
        else:
            extra = {"proj": state.extra["proj"]} if "proj" in state.extra else {}
        return Payload(round=round_, weights=state.weights, extra=extra, client_id=client_id)

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        update, metrics = self.regularised_update(payload, payload.extra.get("proj"), data, gen,
                                                  client_id)
        return update, client_state, metrics

    def server_update(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        t, m = rnd.index + 1, self.cfg.window
        hist = [clone(state.weights)] + self.history(state)
        extra = self.with_history(state, hist)
        meta = dict(state.meta)
        if t > m and len(hist) > m and self.cfg.target == "projected":
            model = self.scratch_model_instance()
            if "syn" in extra:
                syn = SyntheticSet.from_group(extra["syn"])
            else:  # Alg. 3 line 1: noise images, fixed balanced labels, beta0
                n, ipc = model.num_classes, self.cfg.ipc
                x = noise_images(model, n * ipc, model.in_shape, rnd.generator("fedptr-syn-init"))
                syn = SyntheticSet.create(x, balanced_labels(n, ipc, x.device), self.cfg.beta_init)
            run = self.mtt_due(t, meta.get("last_mtt"))
            syn, proj, metrics = self.mtt_and_project(syn, hist[m], hist[0], run,
                                                      rnd.generator("fedptr-mtt"))
            if run:
                meta["last_mtt"] = t
                meta["mtt_updates"] = int(meta.get("mtt_updates", 0)) + 1
                meta["mtt_loss_last"] = metrics["mtt_loss_last"]
                meta["beta"] = metrics["beta"]
            extra["syn"] = syn.to_group()
            extra["proj"] = proj
        return ServerState(weights=state.weights, extra=extra, meta=meta)


@register("fedptr_s_once")
class FedPTRSOnce(FedPTRS):
    """FedPTR-S with one MTT update (``mtt_once: true``)."""

    config_class = FedPTRSOnceConfig


@register("fedptr_noproj")
class FedPTRNoProj(FedPTRS):
    """The control (``target: current``): FedPTR's layer-adaptive, constant-magnitude pull aimed at
    the current global model w^t, with no synthetic set, no MTT and no projection; the same
    schedule (no pull in rounds t <= m)."""

    config_class = FedPTRNoProjConfig


@register("fedptr")
class FedPTR(FedPTRS):
    """FedPTR (Algorithm 2): each client keeps its own synthetic set and beta."""

    config_class = FedPTRConfig

    def payload(self, state: ServerState, round_: int, client_id: int = 0) -> Payload:
        """w^t, and w^{t-m} from the server's history once t > m."""
        hist, m = self.history(state), self.cfg.window
        extra = {"start": hist[m]} if round_ > m and len(hist) > m else {}
        return Payload(round=round_, weights=state.weights, extra=extra, client_id=client_id)

    def server_update(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        hist = [clone(state.weights)] + self.history(state)
        return ServerState(weights=state.weights, extra=self.with_history(state, hist),
                           meta=state.meta)

    def init_synthetic(self, data: ClientData, gen: torch.Generator) -> SyntheticSet:
        """§3.1: per class, ``ipc`` own images (uniform with replacement) or noise, all in
        normalised units."""
        model = self.scratch_model_instance()
        n, ipc = model.num_classes, self.cfg.ipc
        x = noise_images(model, n * ipc, tuple(data.x.shape[1:]), gen).to(data.x.dtype)
        g = generator_on(gen, data.x.device)
        if self.cfg.init == "real":
            for c in range(n):
                idx = (data.y == c).nonzero().flatten()
                if len(idx):
                    pick = idx[torch.randint(len(idx), (ipc,), generator=g, device=g.device)]
                    x[c * ipc:(c + 1) * ipc] = normalised(model, data.x[pick])
        return SyntheticSet.create(x, balanced_labels(n, ipc, x.device), self.cfg.beta_init)

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        group = client_state.get("syn")
        syn = SyntheticSet.from_group(group) if group else self.init_synthetic(data, gen)
        last = client_state.get("mtt", {}).get("last")
        last_mtt = int(last[0]) if last is not None else None
        proj = None
        mtt_metrics: dict[str, float] = {}
        if "start" in payload.extra and self.cfg.target == "current":  # the control: w~ = w^t
            proj = self.params_from(payload.weights)
        elif "start" in payload.extra:  # t > m: Alg. 2 lines 7-11
            t = payload.round
            run = self.mtt_due(t, last_mtt)
            syn, proj, mtt_metrics = self.mtt_and_project(syn, payload.extra["start"],
                                                          payload.weights, run, gen)
            if run:
                last_mtt = t
        update, metrics = self.regularised_update(payload, proj, data, gen, client_id)
        new_state = {**client_state, "syn": syn.to_group()}
        if last_mtt is not None:
            new_state["mtt"] = {"last": torch.tensor([last_mtt], device="cpu")}  # a round number
        metrics = {**metrics, **{k: v for k, v in mtt_metrics.items() if k != "mtt_skipped"}}
        return update, new_state, metrics


@register("fedptr_fixed")
class FedPTRFixed(FedPTR):
    """FedPTR with a fixed lambda (``layer_adaptive: false``): Table 4's "fixed lambda" row."""

    config_class = FedPTRFixedConfig
