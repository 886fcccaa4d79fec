"""Local training of one client: the inner loop every algorithm shares.

Algorithms customise it through hooks instead of copying it:
- ``loss_fn(model, batch) -> loss``: the local objective (FedProx adds its proximal term here);
- ``grad_hook(model)``: called after the gradients are computed and before clipping/stepping
  (SCAFFOLD and FedDC add their gradient corrections here);
- ``grads_fn(model, batch, loss_fn) -> loss``: replaces "forward + backward" entirely (SAM's two-pass
  step in MoFedSAM);
- ``step_hook(model)``: called right after each optimizer step (e.g. an EMA of the weights).

No host synchronisation inside the loop: the losses stay on the device until the end.

The engine trains one scratch model for every client, so the per-call set-up is kept small: the
optimizer built for the same model, parameters and settings is reused with its state cleared
(:func:`fresh_optimizer`, bit for bit a new one), and the parameters of a model declared fixed
(:func:`fix_parameters`) are listed once, not on every call.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn

from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.tasks import Batch, Task

LossFn = Callable[[nn.Module, Batch], torch.Tensor]
GradsFn = Callable[[nn.Module, Batch, LossFn], torch.Tensor]
ModelHook = Callable[[nn.Module], None]


def make_optimizer(params, cfg: LocalTrainConfig, lr: float) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


# weak-keyed: an entry goes with its model
_fixed_params: weakref.WeakKeyDictionary[nn.Module, list[nn.Parameter]] = weakref.WeakKeyDictionary()
_optimizers: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, torch.optim.Optimizer]] = (
    weakref.WeakKeyDictionary())  # model -> (what its optimizer was built for, the optimizer)


def fix_parameters(model: nn.Module) -> None:
    """Declare that ``model`` keeps its parameters (the same tensors; their values and
    ``requires_grad`` may change): :func:`trainable_parameters` then lists them without walking the
    modules (done for the engine's scratch model, which nothing restructures)."""
    _fixed_params[model] = list(model.parameters())


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """``model``'s parameters with ``requires_grad``, in ``model.parameters()`` order."""
    params = _fixed_params.get(model)
    return [p for p in (model.parameters() if params is None else params) if p.requires_grad]


def fresh_optimizer(model: nn.Module, params: Sequence[nn.Parameter], cfg: LocalTrainConfig,
                    lr: float) -> torch.optim.Optimizer:
    """An optimizer of ``params`` (``model``'s trainable parameters) in the state of a new
    ``make_optimizer(params, cfg, lr)``: the last one built for ``model`` when it has the same
    parameters and settings, with its state (momentum, Adam moments and step) cleared and ``lr`` set.

    The parameters are compared by identity (``id``: the cached optimizer keeps them alive).
    """
    key = (cfg.optimizer, cfg.momentum, cfg.weight_decay, *map(id, params))
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
    losses: list[torch.Tensor] = []  # summed once at the end: no per-step op or host sync
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
        losses.append(loss.detach())
    steps = len(losses)
    mean = float(torch.stack(losses).double().mean()) if steps else 0.0
    return {"loss": mean, "steps": float(steps)}
