"""The aux_quality stage: how good is the auxiliary set A (FedDDPM Table IV, first row)?

- FID of A against the real training set (the cached reference), with the extractor's name and
  the sample count next to it; beside it, the FID of a real test subset of the same size, because FID
  is biased upwards for small sample counts and this is the floor real data of that size reaches.
- With class conditioning (A labelled): the accuracy of the feature-extractor classifier on A per
  requested class (``per_class.csv``, ``per_class.png``); unlabelled, ``per_class.csv`` has no rows
  and ``per_class.png`` says why.

A separate stage from ``generate`` so that changing FID settings never re-samples A. One per replicate
(``aux_quality@<r>``, scoring ``data/generate/seed_<r>``); the extractor and its reference statistics
are shared by all replicates.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from fedpipe.config.diffusion import check_diffusion_models
from fedpipe.data import load_dataset
from fedpipe.io import md5_file, save_figure, write_csv, write_json
from fedpipe.metrics.personalized import class_counts
from fedpipe.metrics.personalized import per_class_accuracy as metrics_per_class_accuracy
from fedpipe.pipeline.aux import check_aux, load_aux
from fedpipe.pipeline.diffusion import AUX_QUALITY_DIR, FID_DIR, DiffusionStageConfig, aux_file
from fedpipe.pipeline.fid_tools import check_fid_inputs, load_fid_tools
from fedpipe.pipeline.inputs import replicate_dir
from fedpipe.rng import numpy_rng
from fedpipe.tasks import ClassificationTask

log = logging.getLogger(__name__)


def per_class_accuracy(classifier: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
                       num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(accuracy per class, count per class) of ``classifier`` on labelled images (NaN if no row)."""
    device = next(classifier.parameters()).device
    acc = metrics_per_class_accuracy(classifier, images.to(device), labels.to(device), num_classes,
                                     ClassificationTask())
    return acc, class_counts(labels, num_classes)


UNLABELLED = ("no per-class accuracy: the auxiliary set is unlabelled (diffusion.conditional is false), "
              "so no sample has a requested class to check")


def plot_per_class(acc: np.ndarray, class_names: list[str], title: str, labelled: bool = True):
    """Classifier accuracy per requested class; for an unlabelled set, a figure that says why there
    is none (instead of empty bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not labelled:
        fig, ax = plt.subplots(figsize=(6, 1.2))
        ax.axis("off")
        ax.text(0.5, 0.5, UNLABELLED, ha="center", va="center", wrap=True, fontsize=9)
        return fig
    fig, ax = plt.subplots(figsize=(max(4, 0.35 * len(acc)), 3))
    ax.bar(range(len(acc)), np.nan_to_num(acc, nan=0.0))
    ax.set_xticks(range(len(acc)), class_names, rotation=90 if len(acc) > 20 else 0, fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_ylabel("classifier accuracy")
    ax.set_title(title, fontsize=9)
    return fig


def per_class_rows(acc: np.ndarray, counts: np.ndarray, class_names: list[str]) -> list[list]:
    """Rows of ``per_class.csv`` (class, requested, accuracy) for the classes with samples: none for
    an unlabelled set, so no plot draws a flat line of zeros."""
    return [[class_names[c], int(counts[c]), float(acc[c])] for c in range(len(acc))
            if counts[c] > 0 and not np.isnan(acc[c])]


def aux_quality(cfg: DiffusionStageConfig, out_dir: str | Path | None = None,
                aux_path: str | Path | None = None, fid_dir: str | Path = FID_DIR) -> dict:
    """Score replicate ``cfg.seed``'s auxiliary set (by default ``data/generate/seed_<seed>``, into
    ``data/aux_quality/seed_<seed>``) with the shared feature extractor (``data/fid``)."""
    out = Path(out_dir or replicate_dir(AUX_QUALITY_DIR, cfg.seed))
    aux_path = aux_path or aux_file(cfg.seed)
    check_diffusion_models(cfg.dataset, cfg.diffusion, cfg.fid)  # before any data loads
    check_aux(aux_path, cfg.seed)  # every input is readable before any compute
    check_fid_inputs(fid_dir)
    ds = load_dataset(cfg.dataset)
    tools = load_fid_tools(cfg.fid, ds.meta, cfg.seed, fid_dir, cfg.device.torch)
    aux = load_aux(aux_path, cfg.seed)
    n = len(aux.images)
    bs = cfg.fid.batch_size
    metrics: dict = {"extractor": tools.fid.name, "samples": n,
                     "fid_aux": tools.fid.score(aux.images, tools.reference, batch_size=bs)}
    if len(ds.test) >= 2:
        m = min(n, len(ds.test))
        pick = np.sort(numpy_rng(cfg.seed, "aux-quality-real", 0).choice(len(ds.test), m, replace=False))
        metrics["fid_real_test_same_n"] = tools.fid.score(ds.test.x[torch.from_numpy(pick)],
                                                          tools.reference, batch_size=bs)
        metrics["real_test_samples"] = m
    names = list(ds.meta.class_names) or [str(c) for c in range(ds.meta.num_classes)]
    acc = np.full(ds.meta.num_classes, np.nan)
    counts = np.zeros(ds.meta.num_classes, dtype=np.int64)
    if aux.labelled:
        acc, counts = per_class_accuracy(tools.classifier, aux.images, aux.labels, ds.meta.num_classes)
        metrics["class_accuracy"] = float(np.nansum(acc * counts) / max(counts.sum(), 1))
        metrics["worst_class_accuracy"] = float(np.nanmin(acc))
    # Always written (no rows for an unlabelled set) so the DVC outputs exist either way.
    write_csv(out / "per_class.csv", ["class", "requested", "accuracy"],
              per_class_rows(acc, counts, names))
    save_figure(out / "per_class.png", plot_per_class(
        acc, names, "classifier accuracy on generated samples per requested class", aux.labelled))
    write_json(out / "metrics.json", metrics)
    log.info("aux set: FID %.4f on %d samples (%s)", metrics["fid_aux"], n, tools.fid.name)
    return {"metrics": metrics, "inputs": {str(aux_path): md5_file(aux_path)}}
