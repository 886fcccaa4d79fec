"""The partition stage's library side: its view of params (validated before any data loads), then
load, partition, compute statistics, write every output atomically. The stage script adds only
MLflow logging."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedpipe.config.core import check_sections, read_seed
from fedpipe.config.dataset import DatasetConfig, dataset_config
from fedpipe.config.partition import PartitionConfig, partition_config
from fedpipe.data.datasets import load_dataset
from fedpipe.data.partition import Partition, make_partition
from fedpipe.data.stats import client_rows, partition_statistics, plot_heatmap, plot_sizes
from fedpipe.io import md5_file, save_figure, write_csv, write_json
from fedpipe.pipeline.inputs import replicate_seed

log = logging.getLogger(__name__)

PARTITION_FILE = "partition.safetensors"


@dataclass(frozen=True)
class PartitionStageConfig:
    seed: int
    """The replicate's seed (``partition@<seed>``)."""
    dataset: DatasetConfig
    partition: PartitionConfig


def partition_stage_config(params: dict[str, Any], seed: int | str | None = None
                           ) -> PartitionStageConfig:
    """Validate everything the ``partition@<seed>`` stage reads (sections dataset, partition, and
    the replicate's ``seed``; by default the root ``seed``, for a script run by hand)."""
    check_sections(params)
    root = read_seed(params)
    seed = root if seed is None else replicate_seed(seed)
    ds = dataset_config(params.get("dataset"))
    part = partition_config(params.get("partition"))
    part.check_against(ds)
    return PartitionStageConfig(seed=seed, dataset=ds, partition=part)


@dataclass(frozen=True)
class PartitionOutputs:
    partition: Partition
    summary: dict
    hashes: dict[str, str]   # path -> md5 of the partition file
    plots: list[Path]


def partition_and_write(cfg: PartitionStageConfig, out_dir: str | Path) -> PartitionOutputs:
    """Run the partition stage into ``out_dir``: partition file, metrics.json, clients.csv and the
    heatmap / size plots."""
    out = Path(out_dir)
    ds = load_dataset(cfg.dataset)
    y_train, y_test = ds.train.y.numpy(), ds.test.y.numpy()
    part = make_partition(y_train, y_test, ds.meta.num_classes, cfg.partition, cfg.seed,
                          cfg.dataset.name)
    stats = partition_statistics(part, y_train, ds.meta.num_classes)
    part_path = out / PARTITION_FILE
    part.save(part_path)
    summary = dict(stats["summary"])
    write_json(out / "metrics.json", summary)
    header, rows = client_rows(stats)
    write_csv(out / "clients.csv", header, rows)
    title = f"{cfg.dataset.name} / {cfg.partition.scheme} / {cfg.partition.num_clients} clients"
    save_figure(out / "heatmap.png", plot_heatmap(stats["counts"], title))
    save_figure(out / "sizes.png", plot_sizes(np.asarray(stats["sizes"]), title,
                                                 np.asarray(stats["emd"])))
    log.info("partition: %d clients, sizes %d..%d, mean EMD %.3f, written to %s",
             part.num_clients, summary["size_min"], summary["size_max"], summary["emd_mean"], out)
    return PartitionOutputs(part, summary, {str(part_path): md5_file(part_path)},
                            [out / "heatmap.png", out / "sizes.png", out / "clients.csv"])
