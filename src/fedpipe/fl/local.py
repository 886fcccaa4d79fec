"""Local training of one client: the inner loop every algorithm shares.

Algorithms customise it through two hooks instead of copying it:
- ``loss_fn(model, batch) -> loss``: the local objective (FedProx adds its proximal term here);
- ``grad_hook(model)``: called after the gradients are computed and before clipping/stepping
  (SCAFFOLD and FedDC add their gradient corrections here);
- ``grads_fn(model, batch, loss_fn) -> loss``: replaces "forward + backward" entirely (SAM's two-pass
  step in MoFedSAM).

No host synchronisation inside the loop: the loss is accumulated on the device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn

from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.tasks import Batch, Task

LossFn = Callable[[nn.Module, Batch], torch.Tensor]
GradsFn = Callable[[nn.Module, Batch, LossFn], torch.Tensor]


def make_optimizer(params, cfg: LocalTrainConfig, lr: float) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


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
                grad_hook: Callable[[nn.Module], None] | None = None,
                grads_fn: GradsFn | None = None) -> dict[str, float]:
    """Train ``model`` in place on ``data``; returns {'loss': mean batch loss, 'steps': count}."""
    if loss_fn is None:
        def loss_fn(m: nn.Module, b: Batch) -> torch.Tensor:
            return task.loss(m, b, gen)
    grads_fn = grads_fn or backward
    if not model.training:
        model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, cfg, cfg.lr_at(round_))
    losses: list[torch.Tensor] = []  # summed once at the end: no per-step op or host sync
    for batch in iterate_batches(data, cfg, gen):
        opt.zero_grad(set_to_none=True)
        loss = grads_fn(model, batch, loss_fn)
        if grad_hook is not None:
            grad_hook(model)
        if cfg.grad_clip is not None:
            nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        losses.append(loss.detach())
    steps = len(losses)
    mean = float(torch.stack(losses).double().mean()) if steps else 0.0
    return {"loss": mean, "steps": float(steps)}
