"""Server/client state containers and weight arithmetic on state dicts (name -> tensor)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

Weights = dict[str, torch.Tensor]
Groups = dict[str, Weights]
"""Named groups of tensors: ``{"c": {param name: tensor}, "h": {...}}`` (SCAFFOLD's control variate,
FedDyn's h, a client's personal model). Algorithm state is always grouped by name, never by string
prefixes in one flat dict."""

ClientState = Groups
"""Per-client persistent state (SCAFFOLD's c_i, Ditto's personal model, FedPer's head): named groups
of tensors, stored per client by the engine (a file per client) and resumed bit for bit."""


@dataclass
class ServerState:
    """Global model ``weights`` (a state dict), algorithm tensors ``extra`` (named groups: SCAFFOLD's
    c, FedDyn's h, server momentum) and JSON-able ``meta``."""

    weights: Weights
    extra: Groups = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Payload:
    """What the server sends to client ``client_id`` in round ``round`` (0-based): per client, so a
    strategy may send each client something of its own (a projected model, a cluster's model)."""

    round: int
    weights: Weights
    extra: Groups = field(default_factory=dict)
    client_id: int = 0


@dataclass
class ClientUpdate:
    """What a client returns: its new local ``weights`` (only the shared ones for a method with
    personal parameters), its sample count, and algorithm tensors as named groups."""

    client_id: int
    num_samples: int
    weights: Weights
    extra: Groups = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def clone(w: Weights) -> Weights:
    """Detached copies of every tensor (one fused foreach op)."""
    if not w:
        return {}
    tensors = [v.detach() for v in w.values()]
    return dict(zip(w.keys(), torch._foreach_mul(tensors, 1), strict=True))


@torch.no_grad()
def load_weights(slots: Weights, weights: Weights) -> Weights:
    """Give a model's tensors ``slots`` (``model.state_dict(keep_vars=True)``) new copies of
    ``weights`` as their data; returns the model's tensors by name (sharing its storage, detached).

    The values of ``load_state_dict`` (strict: the key sets must match; cast to the model's dtype and
    device), copied by one fused ``_foreach_copy_`` instead of a per-module traversal: this runs
    once per client per round. The model then computes with, and trains in place in, the returned
    tensors, so its trained weights need no copy out, and since each call gives the model new
    storage, tensors returned by an earlier call never change again. A tensor held under several
    names (tied weights) ends with its last name's copy, as successive copies into it would.
    """
    if slots.keys() != weights.keys():
        missing = sorted(set(slots) ^ set(weights))
        raise KeyError(f"weights do not match the model: {missing[:5]}")
    tensors = list(slots.values())
    copies = [torch.empty_like(t) for t in tensors]
    torch._foreach_copy_(copies, [weights[k] for k in slots])
    for t, copy in zip(tensors, copies, strict=True):
        t.data = copy
    return {k: t.data for k, t in slots.items()}


def repeated_names(w: Weights) -> list[str]:
    """The names whose tensor is the same object as under an earlier name (tied weights)."""
    seen: set[int] = set()
    repeated = []
    for k, t in w.items():
        if id(t) in seen:
            repeated.append(k)
        seen.add(id(t))
    return repeated


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
    keys = [k for k, v in items[0].items() if is_float(v)]
    acc = torch._foreach_mul([items[0][k] for k in keys], probs[0])
    for w, p in zip(items[1:], probs[1:], strict=True):
        torch._foreach_add_(acc, [w[k] for k in keys], alpha=p)  # acc += p * w, fused over tensors
    out = dict(zip(keys, acc, strict=True))
    for k, v in items[0].items():
        if not is_float(v):
            out[k] = v.clone()
    return {k: out[k] for k in items[0]}


def aggregation_coeffs(updates: Sequence[ClientUpdate], mode: str) -> list[float]:
    """Client weights: sample counts (``weighted``) or equal (``uniform``)."""
    return [float(u.num_samples) if mode == "weighted" else 1.0 for u in updates]


def all_finite(w: Weights) -> bool:
    """Whether every float tensor of ``w`` is finite, with one host sync: a tensor's norm is finite
    only if all its elements are (one fused ``_foreach_norm``). Only when a norm is not finite (a
    non-finite element, or a norm too large for the dtype) are the elements checked one by one."""
    floats = [v for v in w.values() if is_float(v)]
    if not floats or bool(torch.isfinite(torch.stack(torch._foreach_norm(floats))).all()):
        return True
    return all(bool(torch.isfinite(v).all()) for v in floats)


# -- named tensor groups ----------------------------------------------------------------
def trainable(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters that local training updates, by state-dict name."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def read(group: Weights | None, like: dict[str, torch.Tensor]) -> Weights:
    """``group[name]`` for each name of ``like``; a missing group or entry is zero (a client's
    control variate before its first round, say)."""
    group = group or {}
    return {n: group[n] if n in group else torch.zeros_like(t.detach()) for n, t in like.items()}


def sum_of(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """t_1 + t_2 + ... in the order given (clients arrive sorted by id: deterministic)."""
    acc = tensors[0].clone()
    for t in tensors[1:]:
        acc = acc + t
    return acc


def sum_over_clients(updates: Sequence[ClientUpdate], group: str) -> Weights:
    """sum_i u_i.extra[group][name] over the updates, by name."""
    names = updates[0].extra[group]
    return {n: sum_of([u.extra[group][n] for u in updates]) for n in names}


def flatten_groups(groups: Groups, prefix: str = "") -> Weights:
    """``{"<prefix><group>/<name>": tensor}``: groups as one flat dict for a safetensors file
    (``/`` never occurs in a state-dict name)."""
    return {f"{prefix}{g}/{n}": t for g, tensors in groups.items() for n, t in tensors.items()}


def unflatten_groups(flat: Weights, prefix: str = "") -> Groups:
    """The inverse of :func:`flatten_groups` for the keys that start with ``prefix``."""
    groups: Groups = {}
    for k, t in flat.items():
        if k.startswith(prefix):
            g, n = k[len(prefix):].split("/", 1)
            groups.setdefault(g, {})[n] = t
    return groups
