"""Tasks: *what* is learned. A task knows the loss of a model on a batch and how to evaluate a model.

The engine and task-agnostic algorithms (FedAvg, FedProx, SCAFFOLD, FedDyn, FedDC, MoFedSAM) only
call ``task.loss(model, batch, generator)``; a diffusion task fits the same interface.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from fedpipe.device import autocast, compiled
from fedpipe.models.classifiers import Classifier

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
        if len(y) == 0:
            return torch.zeros(0, dtype=torch.bool, device=y.device)
        with evaluating(model):
            return torch.cat([model(x[i:i + batch_size]).argmax(1) == y[i:i + batch_size]
                              for i in range(0, len(y), batch_size)])

    @torch.inference_mode()
    def correct_sets(self, models: Sequence[nn.Module],
                     sets: Sequence[tuple[torch.Tensor, torch.Tensor]], batch_size: int = 1024
                     ) -> list[list[torch.Tensor]]:
        """:meth:`correct` of every model on every set ``(x, y)``: ``out[model][set]``.

        Models that differ only in their head (:func:`head_only_difference`: FedRep's or FedPer's
        personal models, with the global model) share the body: each batch's features are computed
        once, and each model applies its own head to them. That is each model's own forward
        (``head(features(x))``) on the same batches, so the results are the same bits."""
        if len(models) < 2 or not head_only_difference(models):
            return [[self.correct(m, x, y, batch_size) for x, y in sets] for m in models]
        body = models[0]
        out: list[list[torch.Tensor]] = [[] for _ in models]
        with evaluating(*models):
            for x, y in sets:
                hits: list[list[torch.Tensor]] = [[] for _ in models]
                for i in range(0, len(y), batch_size):
                    features, yb = body.features(x[i:i + batch_size]), y[i:i + batch_size]
                    for h, m in zip(hits, models, strict=True):
                        h.append(m.head(features).argmax(1) == yb)
                for o, h in zip(out, hits, strict=True):
                    o.append(torch.cat(h) if h else torch.zeros(0, dtype=torch.bool, device=y.device))
        return out

    @torch.inference_mode()
    def evaluate(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                 batch_size: int = 1024) -> dict[str, float]:
        loss_sum = torch.zeros((), dtype=torch.float64, device=x.device)  # summed where x lives
        correct = torch.zeros((), dtype=torch.int64, device=x.device)
        with evaluating(model):
            for i in range(0, len(y), batch_size):
                logits = model(x[i:i + batch_size])
                yb = y[i:i + batch_size]
                loss_sum += F.cross_entropy(logits, yb, reduction="sum").double()
                correct += (logits.argmax(1) == yb).sum()
        n = max(len(y), 1)
        return {"loss": float(loss_sum) / n, "accuracy": float(correct) / n, "n": float(len(y))}



@contextmanager
def evaluating(*models: nn.Module) -> Iterator[None]:
    """The models in eval mode for the block, then each back in its root module's mode (as
    ``model.train(was_training)``). A model none of whose modules is training is left alone:
    switching walks the module tree twice through ``nn.Module``'s attribute setter, which cost the
    evaluate stage a tenth of its time when a model was scored on many test sets one by one."""
    switched = [(m, m.training) for m in models if any(s.training for s in m.modules())]
    for m, _ in switched:
        m.eval()
    try:
        yield
    finally:
        for m, was_training in switched:
            m.train(was_training)


def head_only_difference(models: Sequence[nn.Module]) -> bool:
    """Whether the models are :class:`~fedpipe.models.Classifier` s of one class, with the plain
    ``head(features(x))`` forward, whose weights and buffers are equal outside ``head``: then they
    compute the same features on any input and differ only in the head applied to them."""
    first = models[0]
    if not isinstance(first, Classifier) or type(first).forward is not Classifier.forward:
        return False
    ref = {k: v for k, v in first.state_dict().items() if not k.startswith("head.")}
    for m in models[1:]:
        if type(m) is not type(first):
            return False
        own = {k: v for k, v in m.state_dict().items() if not k.startswith("head.")}
        if own.keys() != ref.keys() or not all(
                own[k] is ref[k] or (own[k].shape == ref[k].shape and torch.equal(own[k], ref[k]))
                for k in ref):
            return False
    return True


__all__ = ["Batch", "ClassificationTask", "DiffusionTask", "TASKS", "Task", "evaluating",
           "head_only_difference"]


def __getattr__(name: str) -> Any:
    """``DiffusionTask`` (and ``TASKS``, which names it) load on first use: it imports diffusers
    (seconds), which the classification stages never need."""
    if name in ("DiffusionTask", "TASKS"):
        from fedpipe.tasks.diffusion import DiffusionTask

        if name == "TASKS":
            return {"classification": ClassificationTask, "diffusion": DiffusionTask}
        return DiffusionTask
    raise AttributeError(f"module 'fedpipe.tasks' has no attribute {name!r}")
