"""PerAda's evaluation columns (Xie et al. 2024): the trainable share of the parameters (Table 1's
ratio), each client's own model on the whole test set (the Global-test accuracy, mean over clients)
and accuracy on corrupted copies of the test set (``study.corruptions``: CIFAR-10-C, §5), of the global
model and of the clients' own models. docs/papers/perada.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from fedpipe.metrics.runs import RunModels

KEY = "perada"
COLUMNS = [("personal_global_mean", "personal Global-test"), ("corrupt_accuracy", "global corrupted"),
           ("personal_corrupt_mean", "personal corrupted")]
UNSCALED: tuple[str, ...] = ()
LEGEND = ("Personal Global-test: each client's own model on the whole test set (PerAda's "
          "Global-test), mean over clients; corrupted: accuracy on corrupted copies of the test set, "
          "mean over severities then corruptions (study.corruptions), of the global model and (mean "
          "over clients) of the clients' own models.")


def trainable_share(model) -> float:
    """Trainable parameters over the parameters of the model without adapters (PerAda's Table 1
    ratio: 1.41 M of 11.18 M; 1.0 for a method that trains the whole model)."""
    base = sum(p.numel() for n, p in model.named_parameters() if ".adapter" not in n)
    return sum(p.numel() for p in model.parameters() if p.requires_grad) / base


def corrupted_accuracy(models: list, sets: dict[tuple[str, int], object], task) -> np.ndarray:
    """Accuracy of each model on the corrupted test sets ``{(name, severity): Split}``: the mean
    over severities, then over corruption names (one value per model)."""
    return corrupted_mean(list(sets), task.correct_sets(models, [(s.x, s.y) for s in sets.values()]))


def corrupted_mean(keys: list[tuple[str, int]], correct: list[list[torch.Tensor]]) -> np.ndarray:
    """:func:`corrupted_accuracy` from each model's correctness on each set (``correct[model][k]``
    on set ``keys[k]``, as ``task.correct_sets`` gives it)."""
    names = sorted({n for n, _ in keys})
    out = np.zeros(len(correct))
    for i, per_set in enumerate(correct):
        acc = [float(c.double().mean()) for c in per_set]
        out[i] = float(np.mean([np.mean([a for (n, _), a in zip(keys, acc, strict=True) if n == name])
                                for name in names]))
    return out


def run_metrics(run: RunModels) -> dict[str, float]:
    """``trainable_share`` of every run; ``personal_global_mean`` of a run with personal models; with
    corrupted sets, ``corrupt_accuracy`` (the global model, when the method has one) and
    ``personal_corrupt_mean``, every model of the run in one pass over each set."""
    out = {"trainable_share": trainable_share(run.model)}
    if run.personal:  # Global-test: each own model on the whole test set (task.evaluate's accuracy)
        out["personal_global_mean"] = float(np.mean([float(c.sum()) / max(len(c), 1)
                                                     for c in run.personal_test]))
    if run.corrupted and (run.generic is not None or run.personal):
        glob = [run.model] if run.generic is not None else []
        corrupt = corrupted_accuracy(glob + run.personal, run.corrupted, run.task)
        if glob:
            out["corrupt_accuracy"] = float(corrupt[0])
        if run.personal:
            out["personal_corrupt_mean"] = float(np.mean(corrupt[len(glob):]))
    return out


def notes(metrics: dict[str, dict[str, float]]) -> list[str]:
    return []
