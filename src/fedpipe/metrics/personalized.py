"""FedNH's evaluation of personalized models on one balanced global test set: PM(V) and PM(L).

Dai et al., "Tackling Data Heterogeneity in Federated Learning with Class Prototypes" (FedNH, AAAI
2023), §4.1 "Evaluation Metrics" and §4.2 (PM(V), PM(L)), following FedROD. Every
personalized model is tested on the same (balanced) official test set D^test, and the local test
distribution of client i is emulated by a weight alpha_i(y) per class:

    acc_i = sum_{(x_j, y_j) in D^test} alpha_i(y_j) 1(y_j = yhat_j) / sum_{(x_j, y_j) in D^test} alpha_i(y_j)

- PM(L) (FedNH code key ``labeldist``): alpha_i(c) = P_i(y = c), client i's *training* label
  distribution;
- PM(V) (code key ``validclass``): alpha_i(c) = 1 if class c appears in client i's training data, else
  0, i.e. equal weight on every class the client owns;
- GM: the global model with uniform weights, plain top-1 accuracy on the whole test set (`task.evaluate`).

Grouped by class, acc_i = sum_c alpha_i(c) corr_c / sum_c alpha_i(c) n_c with corr_c and n_c the correct
and total test samples of class c. On a balanced test set (n_c equal) this is the class-weighted mean
of the per-class accuracies, sum_c w_c acc_c with w = alpha normalised to sum 1 (`class_weights`); on
a test set that is not exactly balanced (MNIST's is not) the two differ slightly, and `pm_accuracy`
follows the paper's per-sample formula by default (``sample_weighted=True``).

Absent classes. A class that the client weights but that has no test sample has no accuracy (NaN in
`per_class_accuracy`); it drops out and the remaining weights are renormalised, which is exactly what
the per-sample formula does (that class contributes nothing to either sum). If none of the client's
classes is in the test set, or the client has no training data, its accuracy is NaN. A class with
zero weight never contributes, whether or not it has test samples.

Which model counts as personalized (the latest local model, a personal head, Ditto's model, ...) is
the strategy's business (FedNH §4.1); this module only evaluates the models it is given.
No feature skew is applied: FedNH's protocol has label skew only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fedpipe.metrics.accuracy import Models, models_per_client

PM_MODES = ("V", "L")


def per_class_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, task
                       ) -> np.ndarray:
    """Accuracy of ``model`` on the test samples of each class c = 0..num_classes-1 (float64 array),
    NaN for a class with no sample in ``y``. Predictions are the task's own (``task.correct``, eval
    mode, batched). Written by hand rather than with torchmetrics' ``MulticlassAccuracy(average=None)``,
    which reports 0, not "undefined", for a class without test samples."""
    return class_accuracy(task.correct(model, x, y), y, num_classes)


def class_accuracy(correct: torch.Tensor, y: torch.Tensor, num_classes: int) -> np.ndarray:
    """Per-class accuracy (:func:`per_class_accuracy`) from the boolean vector ``correct``: is
    sample i of ``y`` classified correctly (``task.correct``)."""
    counts = class_counts(y, num_classes)
    hits = np.bincount(y.cpu()[correct.cpu()].numpy(), minlength=num_classes).astype(np.float64)
    acc = np.full(num_classes, np.nan)
    present = counts > 0
    acc[present] = hits[present] / counts[present]
    return acc


def class_counts(y: torch.Tensor | np.ndarray, num_classes: int) -> np.ndarray:
    """Number of samples of each class 0..num_classes-1 (int64); labels outside that range are an error."""
    labels = y.cpu().numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got range "
                         f"[{labels.min()}, {labels.max()}]")
    return np.bincount(labels.astype(np.int64).ravel(), minlength=num_classes)


def class_weights(train_counts: np.ndarray, mode: str) -> np.ndarray:
    """FedNH's per-client class weights alpha_i(c) (§4.1), normalised to sum to 1 along the last axis.

    ``train_counts``: the client's training samples per class, shape (C,), or (clients, C) for many
    clients at once. ``mode``: ``"V"`` (PM(V): 1/|C_i| on each class the client owns, i.e. has at least
    one training sample of, 0 elsewhere) or ``"L"`` (PM(L): the training label distribution
    n_{i,c} / n_i). A client without training data gets a row of NaN.
    """
    if mode not in PM_MODES:
        raise ValueError(f"mode must be one of {PM_MODES} (PM(V) or PM(L)), got {mode!r}")
    counts = np.asarray(train_counts, dtype=np.float64)
    if counts.ndim not in (1, 2):
        raise ValueError(f"train_counts must have shape (classes,) or (clients, classes), got {counts.shape}")
    if np.any(counts < 0) or not np.all(np.isfinite(counts)):
        raise ValueError("train_counts must be finite and non-negative")
    alpha = (counts > 0).astype(np.float64) if mode == "V" else counts
    total = alpha.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, alpha / total, np.nan)


def weighted_client_accuracy(per_class_acc: np.ndarray, weights: np.ndarray,
                             test_counts: np.ndarray | None = None) -> float:
    """A client's accuracy as the weighted mean of per-class accuracies (FedNH §4.1, acc_i).

    Without ``test_counts``: sum_c w_c acc_c / sum_c w_c over the classes with a weight w_c > 0 and a
    defined accuracy (the balanced-test-set form). With ``test_counts`` n_c: each class weighs
    w_c n_c, which is the paper's per-sample formula sum_j alpha(y_j) 1(y_j = yhat_j) / sum_j alpha(y_j)
    on any test set. Classes with NaN accuracy (absent from the test set) drop out and the rest is
    renormalised; NaN if no weighted class is left.
    """
    acc = np.asarray(per_class_acc, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if acc.shape != w.shape or acc.ndim != 1:
        raise ValueError(f"per_class_acc {acc.shape} and weights {w.shape} must be 1-D of the same length")
    if test_counts is not None:
        n = np.asarray(test_counts, dtype=np.float64)
        if n.shape != w.shape:
            raise ValueError(f"test_counts {n.shape} must match weights {w.shape}")
        w = w * n
    if np.any(w < 0):
        raise ValueError("class weights must be non-negative")
    used = (w > 0) & ~np.isnan(acc)
    if not used.any():
        return float("nan")
    return float(np.sum(w[used] * acc[used]) / np.sum(w[used]))


def pm_accuracy(models: Models, test_x: torch.Tensor, test_y: torch.Tensor, train_counts: np.ndarray,
                mode: str, task, sample_weighted: bool = True) -> np.ndarray:
    """FedNH's PM(V) (``mode="V"``) or PM(L) (``mode="L"``) accuracy of each client (FedNH §4.1-§4.2):
    client i's model on the shared test set (``test_x``, ``test_y``), weighted by its class
    weights from ``train_counts`` (shape (clients, C), training samples per client and class).

    ``models``: one model per client (None -> NaN), or one model for all (e.g. the global model seen
    through each client's class weights). The same model object is evaluated once. With
    ``sample_weighted`` (default) the paper's per-sample formula is used; otherwise the
    balanced-test-set form sum_c w_c acc_c (equal on a balanced test set). The reported PM is the mean
    over clients (e.g. `client_accuracy_summary`).
    """
    counts = np.asarray(train_counts)
    if counts.ndim != 2:
        raise ValueError(f"train_counts must have shape (clients, classes), got {counts.shape}")
    cache: dict[int, torch.Tensor] = {}
    correct = []
    for m in models_per_client(models, counts.shape[0]):
        if m is not None and id(m) not in cache:
            cache[id(m)] = task.correct(m, test_x, test_y)
        correct.append(None if m is None else cache[id(m)])
    return pm_accuracy_of(correct, test_y, counts, mode, sample_weighted)


def pm_accuracy_of(correct: Sequence[torch.Tensor | None], test_y: torch.Tensor,
                   train_counts: np.ndarray, mode: str, sample_weighted: bool = True) -> np.ndarray:
    """:func:`pm_accuracy` from each client's model's predictions on the shared test set:
    ``correct[i]`` the boolean vector ``task.correct(model_i, test_x, test_y)`` (None -> NaN), so
    that PM(V), PM(L) and any other score of the same predictions share one pass of each model."""
    counts = np.asarray(train_counts)
    if counts.ndim != 2 or counts.shape[0] != len(correct):
        raise ValueError(f"train_counts must have shape (clients, classes) with one row per "
                         f"client's predictions ({len(correct)}), got {counts.shape}")
    num_classes = counts.shape[1]
    weights = class_weights(counts, mode)
    test_n = class_counts(test_y, num_classes) if sample_weighted else None
    cache: dict[int, np.ndarray] = {}
    out = np.full(len(correct), np.nan)
    for i, c in enumerate(correct):
        if c is None:
            continue
        if id(c) not in cache:
            cache[id(c)] = class_accuracy(c, test_y, num_classes)
        out[i] = weighted_client_accuracy(cache[id(c)], weights[i], test_n)
    return out


def train_class_counts(labels: Sequence[torch.Tensor | np.ndarray], num_classes: int) -> np.ndarray:
    """(clients, C) training samples per client and class, from each client's training labels."""
    return np.stack([class_counts(y, num_classes) for y in labels]) if len(labels) else \
        np.zeros((0, num_classes), dtype=np.int64)
