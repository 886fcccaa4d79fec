"""Per-stage views of params: each stage reads only its own sections (and declares them in dvc.yaml)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
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
    """The root ``seed``: it seeds only what every replicate shares (the FID feature extractor, the
    corrupted test sets); replicate r of ``study.seeds`` draws everything else from r
    (docs/replicates.md)."""
    seed = params.get("seed", 0)
    check(isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0, "seed", seed,
          "an integer >= 0")
    return seed


def replicate_seed(value: int | str) -> int:
    """A per-replicate stage's seed argument (one of ``study.seeds``: ``partition@<seed>``, ...)."""
    if isinstance(value, str):
        check(value.isdigit(), "seed argument", value, "an integer >= 0 (one of study.seeds)")
        value = int(value)
    check(isinstance(value, int) and not isinstance(value, bool) and value >= 0, "seed argument",
          value, "an integer >= 0 (one of study.seeds)")
    return value


def replicate_dir(root: str | Path, seed: int) -> Path:
    """The folder of replicate ``seed`` (one of ``study.seeds``) of a per-replicate stage's outputs:
    ``<root>/seed_<seed>`` (``data/partition/seed_0``, ``data/warmup/seed_2``, ...). Each replicate
    of the whole experiment draws its partition, warm-up DDPMs, auxiliary set, server data and
    training streams from its own seed (docs/replicates.md)."""
    return Path(root) / f"seed_{seed}"


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
