"""Local training of one client: the inner loop every algorithm shares.

Algorithms customise it through hooks instead of copying it:
- ``loss_fn(model, batch) -> loss``: the local objective (FedProx's proximal term:
  :func:`proximal_loss`);
- ``grad_hook(model)``: called after the gradients are computed and before clipping/stepping
  (SCAFFOLD's and FedDC's gradient corrections: :func:`corrected_grad_hook`);
- ``grads_fn(model, batch, loss_fn) -> loss``: replaces "forward + backward" entirely (SAM's two-pass
  step in MoFedSAM);
- ``step_hook(model)``: called right after each optimizer step (e.g. an EMA of the weights).
A method that trains part of its model at a time (FedRep's and FedAlt's phases, FedBABU's frozen head)
wraps the call in :func:`training_only`.

No host synchronisation inside the loop: on an accelerator the losses stay on the device until the
end (:class:`LossMean`); on the CPU, where reading a scalar costs no synchronisation, each is read as
it comes, which is cheaper than keeping the tensors.

The engine trains one scratch model for every client, so the per-call set-up is kept small: the
optimizer built for the same model, parameters and settings is reused with its state cleared
(:func:`fresh_optimizer`, bit for bit a new one), and the parameters of a model declared fixed
(:func:`fix_parameters`) are listed once, not on every call.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence

import torch
from torch import nn

from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.device import optimizer_options
from fedpipe.tasks import Batch, Task

LossFn = Callable[[nn.Module, Batch], torch.Tensor]
GradsFn = Callable[[nn.Module, Batch, LossFn], torch.Tensor]
ModelHook = Callable[[nn.Module], None]


def make_optimizer(params, cfg: LocalTrainConfig, lr: float) -> torch.optim.Optimizer:
    """``cfg.optimizer`` over ``params``; fused kernels when the parameters are on CUDA
    (:func:`fedpipe.device.optimizer_options`; nothing changes on the CPU)."""
    params = list(params)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=cfg.weight_decay,
                                **optimizer_options(params, torch.optim.Adam))
    return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                           **optimizer_options(params, torch.optim.SGD))


# Per-model caches, weak-keyed: an entry goes with its model.
_fixed_params: weakref.WeakKeyDictionary[nn.Module, list[nn.Parameter]] = weakref.WeakKeyDictionary()
_optimizers: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, torch.optim.Optimizer]] = (
    weakref.WeakKeyDictionary())  # model -> (what its optimizer was built for, the optimizer)


def fix_parameters(model: nn.Module) -> None:
    """Declare that ``model`` keeps its parameters (the same tensor objects; their values, data and
    ``requires_grad`` may change): :func:`trainable_parameters` then lists them without walking the
    modules. The engine does this for its scratch model, which nothing restructures."""
    _fixed_params[model] = list(model.parameters())


@contextlib.contextmanager
def training_only(model: nn.Module, names: Collection[str]) -> Iterator[None]:
    """Within the block, only the parameters of ``model`` named in ``names`` are trained: the others
    are frozen (``requires_grad`` off; a parameter frozen before stays frozen). Every parameter's
    ``requires_grad`` is restored when the block ends, also on an error."""
    params = dict(model.named_parameters())
    flags = {n: p.requires_grad for n, p in params.items()}
    try:
        for n, p in params.items():
            p.requires_grad_(flags[n] and n in names)
        yield
    finally:
        for n, p in params.items():
            p.requires_grad_(flags[n])


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """``model``'s parameters with ``requires_grad``, in ``model.parameters()`` order."""
    params = _fixed_params.get(model)
    return [p for p in (model.parameters() if params is None else params) if p.requires_grad]


def fresh_optimizer(model: nn.Module, params: Sequence[nn.Parameter], cfg: LocalTrainConfig,
                    lr: float) -> torch.optim.Optimizer:
    """``make_optimizer(params, cfg, lr)`` for ``model``'s trainable ``params``, reusing the one built
    last for ``model`` when it was for the same parameters (by identity) and ``cfg``: its state
    (momentum buffers, Adam's moments and step) is cleared and ``lr`` set, which makes it bit for bit
    a new one (an optimizer's state is created at its first step)."""
    key = (cfg, *map(id, params))  # ids are safe: the cached optimizer keeps its parameters alive
    cached = _optimizers.get(model)
    if cached is None or cached[0] != key:
        opt = make_optimizer(params, cfg, lr)
        _optimizers[model] = (key, opt)
        return opt
    opt = cached[1]
    opt.state.clear()
    for group in opt.param_groups:
        group["lr"] = lr
    return opt


def iterate_batches(data: ClientData, cfg: LocalTrainConfig, gen: torch.Generator
                    ) -> Iterator[Batch]:
    """``epochs`` shuffled passes, or exactly ``steps`` batches (cycling through epochs)."""
    if cfg.steps is None:
        for _ in range(cfg.epochs):
            yield from data.batches(cfg.batch_size, gen)
        return
    done = 0
    while done < cfg.steps:
        for batch in data.batches(cfg.batch_size, gen):
            yield batch
            done += 1
            if done == cfg.steps:
                return


class LossMean:
    """The mean of a run of scalar losses, accumulated in float64.

    On the CPU each loss is read as it comes (``item()`` costs no synchronisation there, and keeping
    the tensors costs more than reading them); on an accelerator the losses are kept on the device and
    read with one synchronisation in :meth:`value`. ``on_device`` forces the second path (tests).
    """

    def __init__(self, on_device: bool | None = None):
        self.on_device = on_device
        self.total = 0.0
        self.count = 0
        self.kept: list[torch.Tensor] = []

    def add(self, loss: torch.Tensor) -> None:
        self.count += 1
        on_device = self.on_device
        if on_device is None:
            on_device = loss.device.type != "cpu"
        if on_device:
            self.kept.append(loss.detach())
        else:
            self.total += loss.item()

    def value(self) -> float:
        """The mean (0.0 for no losses)."""
        if not self.count:
            return 0.0
        total = self.total
        if self.kept:
            total += float(torch.stack(self.kept).double().sum())
        return total / self.count


def backward(model: nn.Module, batch: Batch, loss_fn: LossFn) -> torch.Tensor:
    loss = loss_fn(model, batch)
    loss.backward()
    return loss


def local_train(model: nn.Module, data: ClientData, task: Task, cfg: LocalTrainConfig,
                round_: int, gen: torch.Generator, *, loss_fn: LossFn | None = None,
                grad_hook: ModelHook | None = None, grads_fn: GradsFn | None = None,
                step_hook: ModelHook | None = None) -> dict[str, float]:
    """Train ``model`` in place on ``data``; returns {'loss': mean batch loss, 'steps': count}."""
    if loss_fn is None:
        def loss_fn(m: nn.Module, b: Batch) -> torch.Tensor:
            return task.loss(m, b, gen)
    grads_fn = grads_fn or backward
    if not model.training:
        model.train()
    params = trainable_parameters(model)
    opt = fresh_optimizer(model, params, cfg, cfg.lr_at(round_))
    losses = LossMean()
    for batch in iterate_batches(data, cfg, gen):
        opt.zero_grad(set_to_none=True)
        loss = grads_fn(model, batch, loss_fn)
        if grad_hook is not None:
            grad_hook(model)
        if cfg.grad_clip is not None:
            nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        if step_hook is not None:
            step_hook(model)
        losses.add(loss)
    opt.state.clear()  # free momentum / Adam moments now, as a discarded optimizer would
    return {"loss": losses.value(), "steps": float(losses.count)}


# -- the terms of a local objective (fedpipe.fl.strategy.LocalPlan), for the serial executors -------
def proximal_loss(task: Task, gen: torch.Generator, params: dict[str, nn.Parameter], mu: float,
                  centre: dict[str, torch.Tensor] | None) -> LossFn | None:
    """The ``loss_fn`` F_k(w) + mu/2 ||w - centre||^2 over ``params`` (FedProx, Eq. 2), or None (the
    task loss alone) without a centre."""
    if centre is None:
        return None

    def loss_fn(m: nn.Module, batch: Batch) -> torch.Tensor:
        proximal = sum(((p - centre[n]) ** 2).sum() for n, p in params.items())
        return task.loss(m, batch, gen) + mu / 2 * proximal

    return loss_fn


def accumulate_gradients(total: dict[str, torch.Tensor], params: dict[str, nn.Parameter]) -> None:
    """total <- total + grad for each parameter with a gradient (one without adds nothing)."""
    for n, p in params.items():
        if p.grad is not None:
            total[n].add_(p.grad)


def correct_gradients(params: dict[str, nn.Parameter], correction: dict[str, torch.Tensor]) -> None:
    """grad <- grad + correction (a parameter without a gradient gets the correction alone)."""
    for n, p in params.items():
        if p.grad is None:
            p.grad = correction[n].clone()
        else:
            p.grad.add_(correction[n])


def corrected_grad_hook(params: dict[str, nn.Parameter], correction: dict[str, torch.Tensor] | None,
                        grad_sum: dict[str, torch.Tensor] | None = None) -> ModelHook | None:
    """The ``grad_hook`` of a corrected local step (SCAFFOLD Alg. 1 line 10): adds the raw
    stochastic gradient to ``grad_sum`` (when given), then grad <- grad + correction (when given).
    None when there is neither."""
    if correction is None and grad_sum is None:
        return None

    def hook(model: nn.Module) -> None:
        if grad_sum is not None:
            accumulate_gradients(grad_sum, params)
        if correction is not None:
            correct_gradients(params, correction)

    return hook
