"""Matching Training Trajectories (MTT; Cazenavette et al., CVPR 2022) as FedPTR uses it (Chen et al.
2023, arXiv 2312.14380, §3.1, Algorithm 1; settings §5.1), written with ``torch.func``.

A synthetic set D~ = (X~, y~) with fixed, class-balanced hard labels y~ and a learnable student
learning rate beta is optimised so that R student steps of full-batch gradient descent on D~, started
from w_start, land near w_end:

    w^_0 = w_start,   w^_{r+1} = w^_r - beta * grad_w L(w^_r; A_r(X~), y~),   r = 0 .. R-1
    L_MTT(X~, beta) = ||w^_R - w_end||^2 / ||w_end - w_start||^2            (norms over all parameters)

The inner gradient is ``torch.func.grad`` of ``functional_call``; the outer gradient
(``torch.func.grad_and_value`` with respect to X~ and beta) differentiates through all R unrolled
steps, i.e. second order. Each of the H outer iterations takes one SGD-with-momentum step on X~
(lr_img, MTT default 1000, momentum 0.5) and one on beta (lr_lr, MTT default 1e-5, momentum 0.5);
the momentum buffers are kept with the set so that they persist across FL rounds (our reading of
Algorithm 2's in-place update of D~; docs/papers/fedptr.md). beta is clamped to ``>= beta_min``
after each step (a safeguard of ours, not in the paper; 0 disables it).

A_r is MTT's differentiable Siamese augmentation (DSA) in "single" mode: one family drawn per call
from ``color_crop_cutout_flip_scale_rotate`` with MTT's ``ParamDiffAug`` values (implemented here:
all six families: color = brightness, saturation and contrast in sequence; crop = a translation by
up to ``ratio_crop_pad`` of the size, integer pixels; cutout; horizontal flip; scale; rotate). Every
draw comes from the ``torch.Generator`` passed in. With ``augment=None`` no augmentation is applied.

The projection (Algorithm 2 lines 9-11) is plain full-batch gradient descent on D~ (no momentum, no
augmentation).

Input space: MTT distils images in the normalised space the network sees, ``(x - mean) / std`` (its
``distill.py`` normalises the real images before it initialises and trains the synthetic ones), so
lr_img = 1000 and DSA's ParamDiffAug values are in normalised units. This project's classifiers take
raw [0, 1] pixels and normalise inside (``model.normalize``); :func:`on_normalised_inputs` gives the
view of a model without that layer, and FedPTR keeps X~ in normalised units and runs every function
here on that view. (Optimising raw pixels instead scales the step in normalised units by 1 / std^2,
about 7x on digits and 16-25x on CIFAR, and DSA's colour and cutout values likewise.)
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, grad_and_value

from fedpipe.device import generator_on

Params = dict[str, torch.Tensor]
Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]

DSA_FAMILIES = ("color", "crop", "cutout", "flip", "scale", "rotate")


def on_normalised_inputs(model: nn.Module) -> nn.Module:
    """``model`` reading images already normalised: a shallow copy whose ``normalize`` submodule (the
    classifiers' ``(x - mean) / std``, :class:`fedpipe.models.classifiers.Normalize`) is the identity.
    It shares every other submodule, so its parameters are the model's, under the same names
    (``functional_call`` takes the same dict). A model without such a layer is returned as it is."""
    norm = getattr(model, "normalize", None)
    if not isinstance(norm, nn.Module) or getattr(norm, "identity", False):
        return model
    view = copy.copy(model)
    view.__dict__["_modules"] = {**model._modules, "normalize": nn.Identity()}
    return view


def params_of(model: nn.Module) -> Params:
    """The model's parameters by name, detached (the point a trajectory starts from)."""
    return {n: p.detach() for n, p in model.named_parameters()}


def task_loss(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of ``model`` with parameters ``params`` on the full batch (x, y); a 2-D float
    ``y`` (a regression target) uses the mean squared error instead (tests: a linear model)."""
    out = functional_call(model, params, (x,))
    if y.is_floating_point():
        return ((out - y) ** 2).mean()
    return F.cross_entropy(out, y)


def student_step(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
                 beta: torch.Tensor) -> Params:
    """w - beta * grad_w L(w; x, y): differentiable in x and beta when called under an outer grad."""
    g = grad(lambda p: task_loss(model, p, x, y))(params)
    return {n: params[n] - beta * g[n] for n in params}


def unroll(model: nn.Module, w_start: Params, x: torch.Tensor, y: torch.Tensor, beta: torch.Tensor,
           steps: int, augment: Augment | None = None, gen: torch.Generator | None = None) -> Params:
    """R student steps from ``w_start`` (Algorithm 1's inner loop); augmentation per step."""
    w = w_start
    for _ in range(steps):
        xa = augment(x, gen) if augment is not None else x
        w = student_step(model, w, xa, y, beta)
    return w


def sq_dist(a: Params, b: Params) -> torch.Tensor:
    return sum(((a[n] - b[n]) ** 2).sum() for n in b)


def matching_loss(w_hat: Params, w_start: Params, w_end: Params) -> torch.Tensor:
    """||w^ - w_end||^2 / ||w_end - w_start||^2 over the flattened vector of all parameters."""
    return sq_dist(w_hat, w_end) / sq_dist(w_end, w_start)


def mtt_loss(model: nn.Module, x: torch.Tensor, beta: torch.Tensor, y: torch.Tensor,
             w_start: Params, w_end: Params, steps: int, augment: Augment | None = None,
             gen: torch.Generator | None = None) -> torch.Tensor:
    """L_MTT(X~, beta) of Algorithm 1."""
    return matching_loss(unroll(model, w_start, x, y, beta, steps, augment, gen), w_start, w_end)


def mtt_grad(model: nn.Module, x: torch.Tensor, beta: torch.Tensor, y: torch.Tensor,
             w_start: Params, w_end: Params, steps: int, augment: Augment | None = None,
             gen: torch.Generator | None = None
             ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """((dL/dX~, dL/dbeta), L_MTT): second-order, through all ``steps`` unrolled student steps."""
    def f(x_, beta_):
        return mtt_loss(model, x_, beta_, y, w_start, w_end, steps, augment, gen)
    return grad_and_value(f, argnums=(0, 1))(x, beta)


@dataclass
class SyntheticSet:
    """D~ and its learnable student lr, with the momentum buffers of their two optimisers."""

    x: torch.Tensor
    y: torch.Tensor
    beta: torch.Tensor  # shape (1,)
    mom_x: torch.Tensor
    mom_beta: torch.Tensor

    @classmethod
    def create(cls, x: torch.Tensor, y: torch.Tensor, beta: float) -> SyntheticSet:
        b = torch.tensor([beta], dtype=x.dtype, device=x.device)
        return cls(x, y, b, torch.zeros_like(x), torch.zeros_like(b))

    def to_group(self) -> dict[str, torch.Tensor]:
        return {"x": self.x, "y": self.y, "beta": self.beta, "mom_x": self.mom_x,
                "mom_beta": self.mom_beta}

    @classmethod
    def from_group(cls, g: dict[str, torch.Tensor]) -> SyntheticSet:
        return cls(g["x"], g["y"], g["beta"], g["mom_x"], g["mom_beta"])


@dataclass(frozen=True)
class MTTSettings:
    iterations: int = 20  # H
    syn_steps: int = 10  # R
    lr_img: float = 1000.0
    lr_beta: float = 1e-5
    momentum: float = 0.5
    beta_min: float = 0.0


def mtt_update(model: nn.Module, syn: SyntheticSet, w_start: Params, w_end: Params,
               s: MTTSettings, augment: Augment | None = None,
               gen: torch.Generator | None = None) -> tuple[SyntheticSet, dict[str, float]]:
    """Algorithm 1: H outer iterations, each an SGD-momentum step on X~ and on beta from L_MTT's
    gradient. Returns the updated set (new tensors) and {'mtt_loss_first', 'mtt_loss_last',
    'beta', 'mtt_skipped'} (an iteration with a non-finite loss or gradient is skipped)."""
    x = syn.x.detach().clone().requires_grad_(True)
    beta = syn.beta.detach().clone().requires_grad_(True)
    opt_x = torch.optim.SGD([x], lr=s.lr_img, momentum=s.momentum)
    opt_b = torch.optim.SGD([beta], lr=s.lr_beta, momentum=s.momentum)
    # a zero buffer is the same as none at the first step (buf = momentum * 0 + grad)
    opt_x.state[x]["momentum_buffer"] = syn.mom_x.detach().clone()
    opt_b.state[beta]["momentum_buffer"] = syn.mom_beta.detach().clone()
    w_start = {n: t.detach() for n, t in w_start.items()}
    w_end = {n: t.detach() for n, t in w_end.items()}
    losses, skipped = [], 0
    for _ in range(s.iterations):
        (gx, gb), loss = mtt_grad(model, x.detach(), beta.detach(), syn.y, w_start, w_end,
                                  s.syn_steps, augment, gen)
        if not (torch.isfinite(loss) and torch.isfinite(gx).all() and torch.isfinite(gb).all()):
            skipped += 1
            continue
        losses.append(float(loss))
        x.grad, beta.grad = gx, gb
        opt_x.step()
        opt_b.step()
        if s.beta_min > 0:
            with torch.no_grad():
                beta.clamp_(min=s.beta_min)
    new = SyntheticSet(x.detach(), syn.y, beta.detach(),
                       opt_x.state[x]["momentum_buffer"].detach().clone(),
                       opt_b.state[beta]["momentum_buffer"].detach().clone())
    nan = float("nan")
    return new, {"mtt_loss_first": losses[0] if losses else nan,
                 "mtt_loss_last": losses[-1] if losses else nan,
                 "beta": float(new.beta[0]), "mtt_skipped": float(skipped)}


def project(model: nn.Module, w: Params, x: torch.Tensor, y: torch.Tensor, lr: float,
            steps: int) -> Params:
    """K steps of plain full-batch gradient descent on D~ from ``w`` (Algorithm 2 lines 9-11)."""
    w = {n: t.detach() for n, t in w.items()}
    for _ in range(steps):
        g = grad(lambda p: task_loss(model, p, x, y))(w)
        w = {n: w[n] - lr * g[n].detach() for n in w}
    return w


# -- DSA (MTT's utils.DiffAugment, "single" mode) ------------------------------------------------
@dataclass(frozen=True)
class DSAParams:
    """MTT's ``ParamDiffAug`` values."""

    prob_flip: float = 0.5
    ratio_scale: float = 1.2
    ratio_rotate: float = 15.0
    ratio_crop_pad: float = 0.125
    ratio_cutout: float = 0.5
    brightness: float = 1.0
    saturation: float = 2.0
    contrast: float = 0.5


def _rand(gen: torch.Generator, *shape: int, like: torch.Tensor) -> torch.Tensor:
    g = generator_on(gen, like.device)  # ``gen`` itself on the CPU; its device stream elsewhere
    return torch.rand(*shape, generator=g, device=g.device).to(dtype=like.dtype)


def _affine(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    grid = F.affine_grid(theta, list(x.shape), align_corners=True)
    return F.grid_sample(x, grid, align_corners=True)


def dsa_color(x, gen, p: DSAParams):
    n = x.shape[0]
    x = x + (_rand(gen, n, 1, 1, 1, like=x) - 0.5) * p.brightness
    m = x.mean(dim=1, keepdim=True)
    x = (x - m) * (_rand(gen, n, 1, 1, 1, like=x) * p.saturation) + m
    m = x.mean(dim=(1, 2, 3), keepdim=True)
    return (x - m) * (_rand(gen, n, 1, 1, 1, like=x) + p.contrast) + m


def dsa_crop(x, gen, p: DSAParams):
    n, _, h, w = x.shape
    sh, sw = int(h * p.ratio_crop_pad + 0.5), int(w * p.ratio_crop_pad + 0.5)
    g = generator_on(gen, x.device)
    dy = torch.randint(-sh, sh + 1, (n,), generator=g, device=g.device).to(x.dtype)
    dx = torch.randint(-sw, sw + 1, (n,), generator=g, device=g.device).to(x.dtype)
    theta = torch.zeros(n, 2, 3, dtype=x.dtype, device=x.device)
    theta[:, 0, 0] = theta[:, 1, 1] = 1.0
    theta[:, 0, 2] = dx * 2 / max(w - 1, 1)
    theta[:, 1, 2] = dy * 2 / max(h - 1, 1)
    return _affine(x, theta)


def dsa_cutout(x, gen, p: DSAParams):
    n, _, h, w = x.shape
    ch, cw = int(h * p.ratio_cutout + 0.5), int(w * p.ratio_cutout + 0.5)
    g = generator_on(gen, x.device)
    cy = torch.randint(0, h + (1 - ch % 2), (n, 1, 1), generator=g, device=g.device)
    cx = torch.randint(0, w + (1 - cw % 2), (n, 1, 1), generator=g, device=g.device)
    yy = torch.arange(h, device=x.device).view(1, h, 1)
    xx = torch.arange(w, device=x.device).view(1, 1, w)
    oy, ox = yy - cy + ch // 2, xx - cx + cw // 2  # position inside the box
    inside = (oy >= 0) & (oy < ch) & (ox >= 0) & (ox < cw)
    return x * (~inside).unsqueeze(1).to(x.dtype)


def dsa_flip(x, gen, p: DSAParams):
    flip = (_rand(gen, x.shape[0], 1, 1, 1, like=x) < p.prob_flip)
    return torch.where(flip, x.flip(3), x)


def dsa_scale(x, gen, p: DSAParams):
    n, r = x.shape[0], p.ratio_scale
    sx = _rand(gen, n, like=x) * (r - 1 / r) + 1 / r
    sy = _rand(gen, n, like=x) * (r - 1 / r) + 1 / r
    theta = torch.zeros(n, 2, 3, dtype=x.dtype, device=x.device)
    theta[:, 0, 0], theta[:, 1, 1] = sx, sy
    return _affine(x, theta)


def dsa_rotate(x, gen, p: DSAParams):
    n = x.shape[0]
    a = (_rand(gen, n, like=x) - 0.5) * 2 * p.ratio_rotate / 180 * math.pi
    theta = torch.zeros(n, 2, 3, dtype=x.dtype, device=x.device)
    theta[:, 0, 0], theta[:, 0, 1] = torch.cos(a), torch.sin(-a)
    theta[:, 1, 0], theta[:, 1, 1] = torch.sin(a), torch.cos(a)
    return _affine(x, theta)


DSA_FUNCTIONS = {"color": dsa_color, "crop": dsa_crop, "cutout": dsa_cutout, "flip": dsa_flip,
                 "scale": dsa_scale, "rotate": dsa_rotate}


def make_dsa(strategy: str = "color_crop_cutout_flip_scale_rotate",
             params: DSAParams | None = None) -> Augment:
    """DSA in "single" mode: each call applies one family, drawn uniformly from ``strategy``."""
    families = strategy.split("_")
    unknown = [f for f in families if f not in DSA_FUNCTIONS]
    if unknown:
        raise ValueError(f"unknown DSA families {unknown}; allowed: {', '.join(DSA_FAMILIES)}")
    p = params or DSAParams()

    def augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        i = int(torch.randint(len(families), (1,), generator=gen, device=gen.device))  # host choice
        return DSA_FUNCTIONS[families[i]](x, gen, p)
    return augment
