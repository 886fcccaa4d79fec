"""The auxiliary set's file (written by generate, read by aux_quality, server_data and the diffusion
track's training stages): its keys, its check and reader, the labels a class-conditional model is
asked for, and its image grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedpipe.data import apportion
from fedpipe.io import load_tensors
from fedpipe.pipeline.inputs import check_input

META_KEY = "fedpipe.aux"


AUX_KEYS = ("images", "labels", "client")


@dataclass(frozen=True)
class AuxSet:
    images: torch.Tensor  # (n, C, H, W) float32 in [0, 1]
    labels: torch.Tensor  # (n,) int64; -1 when unconditional
    client: torch.Tensor  # (n,) int64: the client whose model produced the row
    meta: dict

    @property
    def labelled(self) -> bool:
        return bool(len(self.labels)) and bool((self.labels >= 0).all())


def aux_counts(sizes: np.ndarray, ratio: float) -> np.ndarray:
    """|A_i| = ratio * m_i, rounded by largest remainder so that sum |A_i| = round(ratio * sum m_i)."""
    return apportion(int(round(ratio * float(np.sum(sizes)))), sizes)


def requested_labels(n: int, class_counts: np.ndarray) -> torch.Tensor:
    """``n`` labels in proportion to ``class_counts`` (largest remainder), sorted by class."""
    per_class = apportion(n, class_counts)
    return torch.repeat_interleave(torch.arange(len(per_class), device="cpu"), torch.from_numpy(per_class))


def check_aux(path: str | Path, seed: int | None = None) -> None:
    """The auxiliary set at ``path`` is there and readable (InputError naming `dvc repro
    generate@<seed>` otherwise, ``seed`` its replicate); the stages that read it call this before
    any compute."""
    check_input(path, "generate" if seed is None else f"generate@{seed}", AUX_KEYS)


def load_aux(path: str | Path, seed: int | None = None) -> AuxSet:
    from fedpipe.io import read_metadata

    check_aux(path, seed)
    t = load_tensors(path, "generate" if seed is None else f"generate@{seed}")
    return AuxSet(t["images"], t["labels"], t["client"], read_metadata(path, META_KEY) or {})


def plot_grid(images: torch.Tensor, title: str, max_images: int = 64):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from torchvision.utils import make_grid

    grid = make_grid(images[:max_images], nrow=8, padding=1, pad_value=1.0)
    fig, ax = plt.subplots(figsize=(4, 4 * grid.shape[1] / grid.shape[2]))
    ax.imshow(grid.permute(1, 2, 0).squeeze(-1).numpy(), cmap="gray", vmin=0, vmax=1)
    ax.axis("off")
    ax.set_title(title, fontsize=9)
    return fig
