"""One evaluated run as the papers' metrics see it (:class:`RunModels`): its final models, the generic
metrics the evaluate stage computed, and the passes over the test sets, each made once however many
metrics read its predictions."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class RunModels:
    """One run (algorithm, seed) for :data:`fedpipe.metrics.papers.PAPERS`' ``run_metrics``."""

    task: Any
    """The classification task (``correct_sets``, ``evaluate``)."""
    test: tuple[torch.Tensor, torch.Tensor]
    """The global test set (x, y)."""
    train_counts: np.ndarray
    """Each client's training class counts, (clients, classes)."""
    history: list[dict[str, float]]
    """The run's evaluated rounds (``history.csv``)."""
    model: nn.Module
    """The final global model in eval mode (also for a method without one: its untrained server model)."""
    personal: list[nn.Module]
    """Each client's own model in eval mode, by client id (empty: the method has none)."""
    generic: np.ndarray | None
    """The global model's accuracy on each client's local test split; None without a global model."""
    metrics: dict[str, float]
    """The generic metrics of the run (``test_accuracy``, ``client_acc_*``, ``personal_acc_*``, ...)."""
    corrupted: dict | None
    """The corrupted copies of the test set, ``{(name, severity): Split}`` (``study.corruptions``)."""

    @cached_property
    def personal_test(self) -> list[torch.Tensor]:
        """Each own model's correctness on the global test set: one pass of each model (shared by
        the models that differ only in their head), read by every score of those predictions."""
        return [c[0] for c in self.task.correct_sets(self.personal, [self.test])]
