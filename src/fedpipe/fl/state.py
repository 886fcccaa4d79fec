"""Server/client state containers and weight arithmetic on state dicts (name -> tensor)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

Weights = dict[str, torch.Tensor]


@dataclass
class ServerState:
    """Global model ``weights`` (a state dict), algorithm tensors ``extra`` (SCAFFOLD's c, FedDyn's
    h, server momentum) and JSON-able ``meta``."""

    weights: Weights
    extra: Weights = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Payload:
    """What the server sends to a client in round ``round`` (0-based)."""

    round: int
    weights: Weights
    extra: Weights = field(default_factory=dict)


@dataclass
class ClientUpdate:
    """What a client returns: its new local ``weights``, its sample count, and algorithm tensors."""

    client_id: int
    num_samples: int
    weights: Weights
    extra: Weights = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def clone(w: Weights) -> Weights:
    return {k: v.detach().clone() for k, v in w.items()}


def zeros_like(w: Weights) -> Weights:
    return {k: torch.zeros_like(v) for k, v in w.items() if v.is_floating_point()}


def is_float(t: torch.Tensor) -> bool:
    return t.is_floating_point()


def weighted_average(items: Sequence[Weights], coeffs: Sequence[float]) -> Weights:
    """sum_i p_i w_i with p_i = coeffs_i / sum(coeffs), computed in the order given.

    Float tensors are averaged; integer buffers (e.g. BatchNorm's ``num_batches_tracked``) take the
    first item's value. With a single item, p = 1.0 exactly and the result equals the item bit for bit.
    """
    total = float(sum(coeffs))
    if not items or total <= 0:
        raise ValueError("weighted_average needs at least one item with a positive weight")
    probs = [float(c) / total for c in coeffs]
    out: Weights = {}
    for k, first in items[0].items():
        if is_float(first):
            acc = first * probs[0]
            for w, p in zip(items[1:], probs[1:], strict=True):
                acc = acc + w[k] * p
            out[k] = acc
        else:
            out[k] = first.clone()
    return out


def aggregation_coeffs(updates: Sequence[ClientUpdate], mode: str) -> list[float]:
    """Client weights: sample counts (``weighted``) or equal (``uniform``)."""
    return [float(u.num_samples) if mode == "weighted" else 1.0 for u in updates]


def delta(a: Weights, b: Weights) -> Weights:
    """a - b on float tensors."""
    return {k: a[k] - b[k] for k in a if is_float(a[k])}


def all_finite(w: Weights) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in w.values() if is_float(v))
