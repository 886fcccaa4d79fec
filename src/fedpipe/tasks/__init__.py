"""Tasks: *what* is learned. A task knows the loss of a model on a batch and how to evaluate a model.

The engine and task-agnostic algorithms (FedAvg, FedProx, SCAFFOLD, FedDyn, FedDC, MoFedSAM) only
call ``task.loss(model, batch, generator)``; a diffusion task fits the same interface.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from fedpipe.device import autocast, compiled

Batch = tuple[torch.Tensor, torch.Tensor]


class Task(Protocol):
    name: str

    def loss(self, model: nn.Module, batch: Batch, generator: torch.Generator) -> torch.Tensor:
        """Scalar training loss of ``model`` on ``batch`` (``generator`` for any randomness)."""
        ...

    def evaluate(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                 batch_size: int = 1024) -> dict[str, float]:
        """Evaluation metrics of ``model`` on a dataset."""
        ...


class ClassificationTask:
    """Cross-entropy training; accuracy and mean loss for evaluation.

    On CUDA (the batch's device), the training forward runs under bf16 autocast when
    ``bf16_autocast`` and through ``torch.compile`` when ``compile`` (:mod:`fedpipe.device`); on the
    CPU neither applies and the loss is computed as it always was."""

    name = "classification"

    def __init__(self, bf16_autocast: bool = True, compile: bool = False):
        self.bf16_autocast = bf16_autocast
        self.compile = compile

    def loss(self, model: nn.Module, batch: Batch, generator: torch.Generator) -> torch.Tensor:
        x, y = batch
        if x.device.type == "cpu":  # the CPU path as it always was (no per-step device checks)
            return F.cross_entropy(model(x), y)
        with autocast(x.device, self.bf16_autocast):
            logits = compiled(model, x.device, self.compile)(x)
        return F.cross_entropy(logits.float(), y)  # .float(): a no-op in float32

    @torch.inference_mode()
    def correct(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                batch_size: int = 1024) -> torch.Tensor:
        """Boolean vector: is sample i classified correctly."""
        was_training = model.training
        model.eval()
        if len(y) == 0:
            return torch.zeros(0, dtype=torch.bool, device=y.device)
        out = torch.cat([model(x[i:i + batch_size]).argmax(1) == y[i:i + batch_size]
                         for i in range(0, len(y), batch_size)])
        model.train(was_training)
        return out

    @torch.inference_mode()
    def evaluate(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                 batch_size: int = 1024) -> dict[str, float]:
        was_training = model.training
        model.eval()
        loss_sum = torch.zeros((), dtype=torch.float64, device=x.device)  # summed where x lives
        correct = torch.zeros((), dtype=torch.int64, device=x.device)
        for i in range(0, len(y), batch_size):
            logits = model(x[i:i + batch_size])
            yb = y[i:i + batch_size]
            loss_sum += F.cross_entropy(logits, yb, reduction="sum").double()
            correct += (logits.argmax(1) == yb).sum()
        model.train(was_training)
        n = max(len(y), 1)
        return {"loss": float(loss_sum) / n, "accuracy": float(correct) / n, "n": float(len(y))}



__all__ = ["Batch", "ClassificationTask", "DiffusionTask", "TASKS", "Task"]


def __getattr__(name: str) -> Any:
    """``DiffusionTask`` (and ``TASKS``, which names it) load on first use: it imports diffusers
    (seconds), which the classification stages never need."""
    if name in ("DiffusionTask", "TASKS"):
        from fedpipe.tasks.diffusion import DiffusionTask

        if name == "TASKS":
            return {"classification": ClassificationTask, "diffusion": DiffusionTask}
        return DiffusionTask
    raise AttributeError(f"module 'fedpipe.tasks' has no attribute {name!r}")
