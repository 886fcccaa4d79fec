"""Per-stage views of params: each stage reads only its own sections (and declares them in dvc.yaml)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedpipe.config.core import ConfigError, check
from fedpipe.config.dataset import DatasetConfig, dataset_config
from fedpipe.config.partition import PartitionConfig, partition_config

# Top-level sections of params.yaml; later stages add theirs here.
KNOWN_SECTIONS = ("seed", "dataset", "partition", "model", "fl", "study", "algorithms", "diffusion",
                  "warmup", "generate", "fid", "diffusion_fl", "device", "accel")


def check_sections(params: dict[str, Any]) -> None:
    unknown = sorted(set(params) - set(KNOWN_SECTIONS))
    if unknown:
        raise ConfigError(unknown[0], params[unknown[0]],
                          "top-level sections are " + ", ".join(KNOWN_SECTIONS))
    for name in KNOWN_SECTIONS:  # null would silently stand for the dataclass defaults
        if name not in ("seed", "device") and name in params and params[name] is None:
            raise ConfigError(name, None, "a mapping (the composed section; {} for the defaults)")


def read_seed(params: dict[str, Any]) -> int:
    seed = params.get("seed", 0)
    check(isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0, "seed", seed,
          "an integer >= 0")
    return seed


@dataclass(frozen=True)
class PartitionStageConfig:
    seed: int
    dataset: DatasetConfig
    partition: PartitionConfig


def partition_stage_config(params: dict[str, Any]) -> PartitionStageConfig:
    """Validate everything the partition stage reads (sections seed, dataset, partition)."""
    check_sections(params)
    seed = read_seed(params)
    ds = dataset_config(params.get("dataset"))
    part = partition_config(params.get("partition"))
    part.check_against(ds)
    return PartitionStageConfig(seed=seed, dataset=ds, partition=part)
