"""Per-client accuracy (and loss) on the clients' local test splits, and its distribution summary.

Generic and personalized evaluation share one function, `per_client_accuracy`:

- generic: one model (the global model) on every client's local test split;
- personalized: one model per client, client i's own model on client i's split
  (docs/architecture.md, the round protocol's step 6); a ``None`` entry marks a client without a
  personal model and gives NaN.

Client i's feature skew is applied to its test inputs; noise skew draws from the stream
(seed, "eval-noise", i) whichever model is evaluated, so the generic and the personalized models of a
client see the very same noisy inputs.

Summary (`client_accuracy_summary`), NaN clients skipped:

- worst-10% / best-10%: the mean accuracy of the ceil(10% N) clients with the lowest / highest
  accuracy (at least one client), as in the fairness literature (e.g. q-FFL, Ditto).
- std: population standard deviation across clients (ddof=0).

FedNH's PM(V)/PM(L) on a balanced global test set live in `fedpipe.metrics.personalized`; sigma_acc,
client disagreement and clustering NMI in `fedpipe.metrics.fairness`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fedpipe.data import ClientData, apply_feature_skew
from fedpipe.rng import torch_generator

Models = nn.Module | Sequence[nn.Module | None]


def models_per_client(models: Models, num_clients: int) -> list[nn.Module | None]:
    """One model (or None) per client: a single module is repeated (generic evaluation); a sequence
    (a list, tuple or ``nn.ModuleList``) must hold exactly one entry per client (personalized)."""
    if isinstance(models, nn.Module) and not isinstance(models, nn.ModuleList):
        return [models] * num_clients
    out = list(models)
    if len(out) != num_clients:
        raise ValueError(f"got {len(out)} personalized models for {num_clients} clients; "
                         "pass one model per client (None for a client without one) or a single model")
    return out


def skewed_test_inputs(client: ClientData, client_id: int, seed: int) -> torch.Tensor:
    """Client ``client_id``'s test inputs with its feature skew (noise from (seed, "eval-noise", id))."""
    gen = torch_generator(seed, "eval-noise", client_id)
    return apply_feature_skew(client.x, *client.skew, generator=gen)


def per_client_accuracy(model: Models, clients: Sequence[ClientData], task, seed: int) -> np.ndarray:
    """Accuracy on each client's local test data, with the client's feature skew.

    ``model`` is either one ``nn.Module`` (generic: that model on every client) or a sequence with one
    model per client (personalized: client i's model on client i's data). NaN for a client with no
    local test data or whose entry is ``None``.
    """
    per_client = models_per_client(model, len(clients))
    acc = np.full(len(clients), np.nan)
    for i, (c, m) in enumerate(zip(clients, per_client, strict=True)):
        if len(c) == 0 or m is None:
            continue
        acc[i] = float(task.correct(m, skewed_test_inputs(c, i, seed), c.y).double().mean())
    return acc


def per_client_loss(model: Models, clients: Sequence[ClientData], task, seed: int) -> np.ndarray:
    """Mean test loss on each client's local test data (``task.evaluate``'s ``"loss"``), with the same
    models, skew and noise streams as `per_client_accuracy`; NaN where that gives NaN. These are the
    f_i(w) of Equitable-FL's client disagreement (`fedpipe.metrics.fairness.client_disagreement`)."""
    per_client = models_per_client(model, len(clients))
    loss = np.full(len(clients), np.nan)
    for i, (c, m) in enumerate(zip(clients, per_client, strict=True)):
        if len(c) == 0 or m is None:
            continue
        loss[i] = task.evaluate(m, skewed_test_inputs(c, i, seed), c.y)["loss"]
    return loss


def tail_count(fraction: float, n: int) -> int:
    """ceil(fraction * n), at least 1; rounded first so that float error does not add a client
    (0.07 * 100 is 7.000000000000001 in floating point, whose ceil would be 8)."""
    return max(1, math.ceil(round(fraction * n, 9)))


def client_accuracy_summary(acc: np.ndarray, fraction: float = 0.1) -> dict[str, float]:
    """Mean, std (ddof=0), worst/best ``fraction`` (mean of the ceil(fraction N) lowest/highest), min and
    max of the per-client accuracies, NaN clients skipped. The keys are read by the evaluate stage and
    the report: add new summaries beside this one (`fedpipe.metrics.fairness.fairness_summary`)."""
    a = np.asarray(acc, dtype=np.float64)
    a = np.sort(a[~np.isnan(a)])
    if len(a) == 0:
        raise ValueError("no client has local test data")
    k = tail_count(fraction, len(a))
    return {"client_acc_mean": float(a.mean()), "client_acc_std": float(a.std()),
            "client_acc_worst10": float(a[:k].mean()), "client_acc_best10": float(a[-k:].mean()),
            "client_acc_min": float(a[0]), "client_acc_max": float(a[-1])}
