"""Partitioners: split a training set over N clients, deterministically under a seed.

Each partitioner returns per-client training index arrays; :func:`make_partition` adds quantity skew
(log-normal client weights), per-client local test splits drawn from the *official test set* with the
client's training label distribution, and per-client feature-skew transforms, and checks ``min_size``.

Random streams (see ``fedpipe.rng``): ``(seed, "partition")`` for the label split,
``(seed, "quantity-skew")`` for client weights, ``(seed, "local-test", i)`` for client i's test split.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedpipe.config import ConfigError, PartitionConfig
from fedpipe.config.partition import (
    DirichletConfig,
    IIDConfig,
    LabelBlocksConfig,
    PathologicalConfig,
    ShardsConfig,
)
from fedpipe.io import read_tensors, save_tensors
from fedpipe.rng import numpy_rng

FORMAT_VERSION = 1


def apportion(total: int, weights: Sequence[float] | np.ndarray) -> np.ndarray:
    """Largest-remainder rounding: non-negative ints proportional to ``weights`` summing to ``total``.

    Ties in the remainders go to the lower index (stable), so the result is deterministic.
    """
    w = np.asarray(weights, dtype=np.float64)
    if total < 0 or w.ndim != 1 or len(w) == 0 or np.any(w < 0) or not np.isfinite(w).all():
        raise ValueError(f"apportion needs total >= 0 and finite non-negative weights, got {w}")
    if w.sum() <= 0:
        w = np.ones_like(w)
    exact = total * w / w.sum()
    base = np.floor(exact).astype(np.int64)
    rest = total - int(base.sum())
    order = np.argsort(-(exact - base), kind="stable")
    base[order[:rest]] += 1
    return base


def _split(indices: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    return np.split(indices, np.cumsum(counts)[:-1])


def client_weights(cfg: PartitionConfig, seed: int) -> np.ndarray:
    """Quantity skew: w_i = exp(N(0, sigma^2)); all ones when sigma = 0."""
    if cfg.quantity_skew_sigma == 0:
        return np.ones(cfg.num_clients)
    rng = numpy_rng(seed, "quantity-skew")
    return rng.lognormal(0.0, cfg.quantity_skew_sigma, size=cfg.num_clients)


def _class_owners_split(labels: np.ndarray, owners: dict[int, list[int]], n_clients: int,
                        w: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Split every class c over ``owners[c]`` in proportion to their weights."""
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for c in sorted(owners):
        idx_c = rng.permutation(np.flatnonzero(labels == c))
        own = owners[c]
        for client, chunk in zip(own, _split(idx_c, apportion(len(idx_c), w[own])), strict=True):
            parts[client].append(chunk)
    return [np.concatenate(p) if p else np.empty(0, np.int64) for p in parts]


def partition_iid(labels: np.ndarray, num_classes: int, cfg: IIDConfig, w: np.ndarray,
                  rng: np.random.Generator) -> list[np.ndarray]:
    perm = rng.permutation(len(labels))
    return _split(perm, apportion(len(labels), w))


def partition_dirichlet(labels: np.ndarray, num_classes: int, cfg: DirichletConfig,
                        w: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """For each class c: q_c ~ Dir(alpha * 1_N), scaled by the client weights, splits class c."""
    n = cfg.num_clients
    smallest = 0
    for _ in range(cfg.max_retries):
        parts: list[list[np.ndarray]] = [[] for _ in range(n)]
        ok = True
        for c in range(num_classes):
            idx_c = rng.permutation(np.flatnonzero(labels == c))
            q = rng.dirichlet(np.full(n, cfg.alpha)) * w
            if not np.isfinite(q).all():
                ok = False
                break
            for client, chunk in enumerate(_split(idx_c, apportion(len(idx_c), q))):
                parts[client].append(chunk)
        if not ok:
            continue
        out = [np.concatenate(p) for p in parts]
        smallest = min(len(p) for p in out)
        if smallest >= cfg.min_size:
            return out
    raise ConfigError("partition.min_size", cfg.min_size,
                      f"a size every client reaches: {cfg.max_retries} draws of Dir({cfg.alpha}) "
                      f"left a client with {smallest} samples; lower min_size or raise "
                      f"alpha or max_retries")


def partition_shards(labels: np.ndarray, num_classes: int, cfg: ShardsConfig, w: np.ndarray,
                     rng: np.random.Generator) -> list[np.ndarray]:
    """Sort by label (random order within a class), cut into N*s shards, deal s shards per client.

    Shards are equal (largest remainder) without quantity skew; with it, a shard's length is
    proportional to its owner's weight.
    """
    n, s = cfg.num_clients, cfg.shards_per_client
    order = rng.permutation(len(labels))
    order = order[np.argsort(labels[order], kind="stable")]
    deal = rng.permutation(n * s)  # shard deal[k] goes to client k // s
    owner = np.empty(n * s, np.int64)
    owner[deal] = np.arange(n * s) // s
    shards = _split(order, apportion(len(labels), w[owner]))
    parts: list[list[np.ndarray]] = [[] for _ in range(n)]
    for k, shard in enumerate(shards):
        parts[owner[k]].append(shard)
    return [np.concatenate(p) for p in parts]


def pathological_classes(cfg: PathologicalConfig, num_classes: int,
                         rng: np.random.Generator) -> list[list[int]]:
    """Client i owns classes perm[(i*k + j) % C], j < k: distinct, and every class is owned when
    N * k >= C."""
    k = cfg.classes_per_client
    perm = rng.permutation(num_classes)
    return [sorted(int(perm[(i * k + j) % num_classes]) for j in range(k))
            for i in range(cfg.num_clients)]


def partition_pathological(labels: np.ndarray, num_classes: int, cfg: PathologicalConfig,
                           w: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    owned = pathological_classes(cfg, num_classes, rng)
    owners: dict[int, list[int]] = {}
    for client, classes in enumerate(owned):
        for c in classes:
            owners.setdefault(c, []).append(client)
    return _class_owners_split(labels, owners, cfg.num_clients, w, rng)


def label_block_groups(cfg: LabelBlocksConfig) -> tuple[list[int], list[list[int]]]:
    """(group id of each client, classes of each group): consecutive clients, consecutive classes."""
    group_of = [g for g, size in enumerate(cfg.groups) for _ in range(size)]
    starts = np.concatenate([[0], np.cumsum(cfg.blocks)])
    classes = [list(range(int(starts[g]), int(starts[g + 1]))) for g in range(len(cfg.blocks))]
    return group_of, classes


def partition_label_blocks(labels: np.ndarray, num_classes: int, cfg: LabelBlocksConfig,
                           w: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    group_of, classes = label_block_groups(cfg)
    members = [[i for i, g in enumerate(group_of) if g == grp] for grp in range(len(cfg.groups))]
    owners = {c: members[g] for g, cls in enumerate(classes) for c in cls}
    if cfg.per_class_per_client is None:
        return _class_owners_split(labels, owners, cfg.num_clients, w, rng)
    ppc = cfg.per_class_per_client
    parts: list[list[np.ndarray]] = [[] for _ in range(cfg.num_clients)]
    for c in sorted(owners):
        idx_c = rng.permutation(np.flatnonzero(labels == c))
        need = ppc * len(owners[c])
        if need > len(idx_c):
            raise ConfigError("partition.per_class_per_client", ppc,
                              f"at most {len(idx_c) // len(owners[c])}: class {c} has {len(idx_c)} "
                              f"samples for {len(owners[c])} clients")
        for j, client in enumerate(owners[c]):
            parts[client].append(idx_c[j * ppc:(j + 1) * ppc])
    return [np.concatenate(p) if p else np.empty(0, np.int64) for p in parts]


PARTITIONERS: dict[str, Callable[..., list[np.ndarray]]] = {
    "iid": partition_iid,
    "dirichlet": partition_dirichlet,
    "shards": partition_shards,
    "pathological": partition_pathological,
    "label_blocks": partition_label_blocks,
}


def local_test_split(train_labels: np.ndarray, test_labels: np.ndarray, client_train: np.ndarray,
                     num_classes: int, size: int | None, seed: int, client_id: int) -> np.ndarray:
    """Indices into the official test set, with the client's training label distribution.

    ``size`` None means the client's proportional share n_test * m_i / n_train (at least 1). Per-class
    counts are apportioned from the client's class counts and capped at what the test set has.
    """
    counts = np.bincount(train_labels[client_train], minlength=num_classes)
    if counts.sum() == 0:
        return np.empty(0, np.int64)
    if size is None:
        size = max(1, round(len(test_labels) * counts.sum() / len(train_labels)))
    want = apportion(size, counts)
    rng = numpy_rng(seed, "local-test", client_id)
    chosen = []
    for c in np.flatnonzero(want):
        pool = np.flatnonzero(test_labels == c)
        take = min(int(want[c]), len(pool))
        chosen.append(rng.choice(pool, size=take, replace=False))
    return np.sort(np.concatenate(chosen)).astype(np.int64) if chosen else np.empty(0, np.int64)


def class_test_split(train_labels: np.ndarray, test_labels: np.ndarray, client_train: np.ndarray
                     ) -> np.ndarray:
    """Indices of every official test image whose class the client holds (``local_test: classes``)."""
    held = np.unique(train_labels[client_train])
    return np.flatnonzero(np.isin(test_labels, held)).astype(np.int64)


@dataclass
class Partition:
    """Per-client train indices (into the train split), local test indices (into the test split),
    and metadata (scheme, params, seed, dataset, per-client feature skew, planted groups)."""

    train: list[np.ndarray]
    test: list[np.ndarray]
    meta: dict[str, Any]

    @property
    def num_clients(self) -> int:
        return len(self.train)

    def sizes(self) -> np.ndarray:
        return np.array([len(t) for t in self.train], dtype=np.int64)

    def feature_skew(self, client_id: int) -> tuple[str, float]:
        """(kind, value) of client ``client_id``'s feature skew (``("none", 0.0)`` without skew)."""
        kind = self.meta["feature_skew"]["kind"]
        values = self.meta["feature_skew"]["per_client"]
        return kind, float(values[client_id]) if kind != "none" else 0.0

    def save(self, path: str | Path) -> None:
        def cat(parts: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
            offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
            flat = np.concatenate(parts).astype(np.int64) if parts else np.empty(0, np.int64)
            return torch.from_numpy(flat), torch.from_numpy(offsets)

        tr, tr_off = cat(self.train)
        te, te_off = cat(self.test)
        save_tensors(path, {"train_indices": tr, "train_offsets": tr_off,
                            "test_indices": te, "test_offsets": te_off},
                     metadata={"fedpipe.partition": json.dumps(self.meta, sort_keys=True)})

    @classmethod
    def load(cls, path: str | Path, stage: str | None = "partition") -> Partition:
        """The partition file at ``path``, verified against its content hash (an InputError
        naming ``dvc repro <stage>`` otherwise)."""
        tensors, meta = read_tensors(path, stage)
        t = {k: v.numpy() for k, v in tensors.items()}

        def split(flat: np.ndarray, off: np.ndarray) -> list[np.ndarray]:
            return [flat[off[i]:off[i + 1]] for i in range(len(off) - 1)]

        return cls(split(t["train_indices"], t["train_offsets"]),
                   split(t["test_indices"], t["test_offsets"]), meta)


def make_partition(train_labels: np.ndarray, test_labels: np.ndarray, num_classes: int,
                   cfg: PartitionConfig, seed: int, dataset_name: str = "") -> Partition:
    """Partition a training set (labels only) and attach local test splits and metadata."""
    train_labels = np.asarray(train_labels, dtype=np.int64)
    test_labels = np.asarray(test_labels, dtype=np.int64)
    w = client_weights(cfg, seed)
    rng = numpy_rng(seed, "partition")
    parts = PARTITIONERS[cfg.scheme](train_labels, num_classes, cfg, w, rng)
    parts = [np.sort(p).astype(np.int64) for p in parts]
    smallest = min(len(p) for p in parts)
    if smallest < cfg.min_size:
        raise ConfigError("partition.min_size", cfg.min_size,
                          f"a size every client reaches: scheme {cfg.scheme} gave a client "
                          f"{smallest} samples")
    if cfg.local_test == "classes":
        tests = [class_test_split(train_labels, test_labels, p) for p in parts]
    else:
        tests = [local_test_split(train_labels, test_labels, p, num_classes, cfg.local_test_size,
                                  seed, i) for i, p in enumerate(parts)]
    values = cfg.skew_values()
    per_client = [values[i % len(values)] for i in range(cfg.num_clients)] if values else []
    meta: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "dataset": dataset_name,
        "num_classes": int(num_classes),
        "num_train": int(len(train_labels)),
        "num_test": int(len(test_labels)),
        "seed": int(seed),
        "scheme": cfg.scheme,
        "params": asdict(cfg),
        "client_weights": [float(x) for x in w],
        "feature_skew": {"kind": cfg.feature_skew, "per_client": per_client},
    }
    if isinstance(cfg, LabelBlocksConfig):
        meta["groups"] = label_block_groups(cfg)[0]
    return Partition(parts, tests, meta)
