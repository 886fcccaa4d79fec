"""Per-client accuracy and its distribution summary.

- worst-10% / best-10%: the mean accuracy of the ceil(10% N) clients with the lowest / highest
  accuracy (at least one client), as in the fairness literature (e.g. q-FFL, Ditto).
- std: population standard deviation across clients (ddof=0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from torch import nn

from fedpipe.data import ClientData, apply_feature_skew
from fedpipe.rng import torch_generator


def per_client_accuracy(model: nn.Module, clients: Sequence[ClientData], task, seed: int
                        ) -> np.ndarray:
    """Accuracy of ``model`` on each client's local test data (with the client's feature skew;
    noise skew draws from the stream (seed, "eval-noise", client))."""
    acc = np.full(len(clients), np.nan)
    for i, c in enumerate(clients):
        if len(c) == 0:
            continue
        x = apply_feature_skew(c.x, *c.skew, generator=torch_generator(seed, "eval-noise", i))
        acc[i] = float(task.correct(model, x, c.y).double().mean())
    return acc


def client_accuracy_summary(acc: np.ndarray, fraction: float = 0.1) -> dict[str, float]:
    a = np.sort(np.asarray(acc, dtype=np.float64)[~np.isnan(acc)])
    if len(a) == 0:
        raise ValueError("no client has local test data")
    k = max(1, math.ceil(fraction * len(a)))
    return {"client_acc_mean": float(a.mean()), "client_acc_std": float(a.std()),
            "client_acc_worst10": float(a[:k].mean()), "client_acc_best10": float(a[-k:].mean()),
            "client_acc_min": float(a[0]), "client_acc_max": float(a[-1])}


