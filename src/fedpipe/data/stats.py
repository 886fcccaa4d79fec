"""Partition statistics: sizes, class counts, label-distribution distance to the global one,
effective number of classes, size Gini; and their plots.

Definitions (documented here since papers differ):
- EMD of client i: ``sum_c |p_i(c) - p(c)|`` with p the global training label distribution
  (Zhao et al. 2018, "Federated Learning with Non-IID Data"; equals twice the total-variation distance,
  the earth mover's distance under the 0/1 ground metric between classes). Range [0, 2].
- Effective number of classes: ``exp(H(p_i))`` (Hill number of order 1), H in nats.
- Size Gini: ``sum_i sum_j |m_i - m_j| / (2 N^2 mean(m))``; 0 = equal sizes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedpipe.data.partition import Partition


def class_counts(partition: Partition, train_labels: np.ndarray, num_classes: int) -> np.ndarray:
    """(N, C) matrix of per-client class counts."""
    return np.stack([np.bincount(train_labels[idx], minlength=num_classes)
                     for idx in partition.train]).astype(np.int64)


def emd_to_global(counts: np.ndarray, global_counts: np.ndarray) -> np.ndarray:
    p = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    q = global_counts / global_counts.sum()
    return np.abs(p - q).sum(axis=1)


def effective_classes(counts: np.ndarray) -> np.ndarray:
    p = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(p > 0, p * np.log(p), 0.0).sum(axis=1)
    return np.exp(h)


def gini(sizes: np.ndarray) -> float:
    x = np.asarray(sizes, dtype=np.float64)
    if len(x) == 0 or x.mean() == 0:
        return 0.0
    return float(np.abs(x[:, None] - x[None, :]).sum() / (2 * len(x) ** 2 * x.mean()))


def partition_statistics(partition: Partition, train_labels: np.ndarray, num_classes: int
                         ) -> dict[str, Any]:
    """Per-client and summary statistics (summary = DVC metrics; per-client = plots/CSV)."""
    counts = class_counts(partition, train_labels, num_classes)
    global_counts = np.bincount(train_labels, minlength=num_classes)
    sizes = counts.sum(axis=1)
    emd = emd_to_global(counts, global_counts)
    eff = effective_classes(counts)
    test_sizes = np.array([len(t) for t in partition.test])
    summary = {
        "num_clients": int(partition.num_clients),
        "samples_assigned": int(sizes.sum()),
        "size_min": int(sizes.min()),
        "size_max": int(sizes.max()),
        "size_mean": float(sizes.mean()),
        "size_gini": gini(sizes),
        "emd_mean": float(emd.mean()),
        "emd_max": float(emd.max()),
        "effective_classes_mean": float(eff.mean()),
        "classes_per_client_mean": float((counts > 0).sum(axis=1).mean()),
        "local_test_size_mean": float(test_sizes.mean()),
    }
    return {"summary": summary, "counts": counts, "sizes": sizes, "emd": emd,
            "effective_classes": eff, "test_sizes": test_sizes}


def client_rows(stats: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    header = ["client", "size", "test_size", "emd", "effective_classes", "num_classes"]
    rows = [[i, int(stats["sizes"][i]), int(stats["test_sizes"][i]), float(stats["emd"][i]),
             float(stats["effective_classes"][i]), int((stats["counts"][i] > 0).sum())]
            for i in range(len(stats["sizes"]))]
    return header, rows


def plot_heatmap(counts: np.ndarray, title: str):
    """Clients x classes heatmap of sample counts (a matplotlib Figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n, c = counts.shape
    fig, ax = plt.subplots(figsize=(min(2 + 0.35 * c, 16), min(1.5 + 0.3 * n, 14)))
    im = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(title)
    if c <= 20:
        ax.set_xticks(range(c))
    if n <= 30:
        ax.set_yticks(range(n))
        if c <= 20:
            for i in range(n):
                for j in range(c):
                    if counts[i, j]:
                        ax.text(j, i, str(counts[i, j]), ha="center", va="center",
                                fontsize=6, color="w")
    fig.colorbar(im, ax=ax, label="samples")
    return fig


def plot_sizes(sizes: np.ndarray, title: str, emd: np.ndarray | None = None):
    """Bar chart of client sizes and, with ``emd``, of each client's label skew (EMD of its label
    distribution to the global one) below it (a matplotlib Figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = 1 if emd is None else 2
    fig, axes = plt.subplots(rows, 1, figsize=(min(3 + 0.3 * len(sizes), 16), 3.5 * rows),
                             squeeze=False)
    ax = axes[0, 0]
    ax.bar(np.arange(len(sizes)), sizes, color="tab:blue")
    ax.axhline(sizes.mean(), color="k", lw=1, ls="--", label=f"mean {sizes.mean():.1f}")
    ax.set_xlabel("client")
    ax.set_ylabel("training samples")
    ax.set_title(title)
    ax.legend()
    if emd is not None:
        ax = axes[1, 0]
        ax.bar(np.arange(len(emd)), emd, color="tab:orange")
        ax.set_xlabel("client")
        ax.set_ylabel("label skew (EMD to global)")
    for ax in axes[:, 0]:  # client ids: every one up to 30 clients, else integer steps
        if len(sizes) <= 30:
            ax.set_xticks(range(len(sizes)))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(-0.6, len(sizes) - 0.4)
    fig.tight_layout()
    return fig
