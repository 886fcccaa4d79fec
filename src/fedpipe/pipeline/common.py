"""Shared set-up of the training stages: validated configs, datasets, client data, models."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedpipe.algorithms import (
    ALGORITHMS,
    algorithm_config,
    check_algorithm_sections,
    check_algorithms,
    init_config,
)
from fedpipe.config import DatasetConfig, dataset_config
from fedpipe.config.core import build
from fedpipe.config.device import DeviceConfig, device_config, device_params
from fedpipe.config.fl import FLConfig, InitConfig, ModelConfig, StudyConfig, fl_config, model_config
from fedpipe.config.models import check_model  # noqa: F401  (re-exported)
from fedpipe.config.stages import check_sections, read_seed, replicate_seed
from fedpipe.data import Dataset
from fedpipe.models import build_model
from fedpipe.pipeline.inputs import (  # noqa: F401  (re-exported: the training stages' inputs)
    PARTITION_DIR,
    clients_of,
    code_version,
    fingerprint_of,
    load_partition,
    partition_file,
)
from fedpipe.rng import torch_seed

FEDERATE_DIR = "data/federate"


@dataclass(frozen=True)
class TrainConfig:
    """What a federate run reads. ``seed`` is the run's replicate (one of ``study.seeds``): it draws
    the model init, client selection and local training, and the run reads the replicate's own
    partition (``data/partition/seed_<seed>``), server data and backbone. The root ``seed``
    (``params_read["seed"]``) seeds only what replicates share (docs/replicates.md)."""

    seed: int
    dataset: DatasetConfig
    model: ModelConfig
    fl: FLConfig
    study: StudyConfig
    algorithm: str
    algo_cfg: Any
    params_read: dict
    device: DeviceConfig = DeviceConfig()
    """Where the run computes (top-level ``device`` and ``accel``)."""
    init: InitConfig = InitConfig()
    """Where the model starts (``algorithms.<algorithm>.backbone``, ``pretrain_rounds``)."""


parse_run_seed = replicate_seed  # a stage's seed argument (one of ``study.seeds``)


def train_config(params: dict, algorithm: str, run_seed: int | str | None = None) -> TrainConfig:
    """Validate every section the federate stage of ``algorithm`` reads (before loading data).
    ``run_seed`` (default: the root ``seed``) seeds the federated run."""
    check_sections(params)
    seed = read_seed(params)
    ds = dataset_config(params.get("dataset"))
    model = model_config(params.get("model"))
    check_model(model, "model", ds.in_shape(), ds.num_classes())
    fl = fl_config(params.get("fl"))
    study = build(StudyConfig, params.get("study"), "study")
    check_algorithms(study.algorithms, "study.algorithms")
    algos = check_algorithm_sections(params.get("algorithms"))
    algo_cfg = algorithm_config(algorithm, algos.get(algorithm))
    init = init_config(algorithm, algos.get(algorithm))
    run = seed if run_seed is None else parse_run_seed(run_seed)
    read = {"seed": seed, "run_seed": run, "dataset": params.get("dataset"),
            "model": params.get("model"), "fl": params.get("fl"),
            f"algorithms.{algorithm}": algos.get(algorithm) or {}}
    device = device_config(params)
    read |= device_params(params, device)
    return TrainConfig(run, ds, model, fl, study, algorithm, algo_cfg, read, device, init)


def make_model(cfg: TrainConfig, ds: Dataset) -> torch.nn.Module:
    """The model of ``cfg`` with weights drawn from the stream (seed, "model-init"), as the
    algorithm trains it (``Strategy.adapt_model``: FedNH's prototype head, say).

    torch's initialisers draw from the global RNG; ``fork_rng`` confines the seeding to this call
    and restores the global state after it.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(torch_seed(cfg.seed, "model-init"))
        model = build_model(cfg.model.name, ds.meta.shape, ds.meta.num_classes,
                            mean=ds.meta.mean, std=ds.meta.std, **cfg.model.kwargs)
        return ALGORITHMS[cfg.algorithm].adapt_model(model, cfg.algo_cfg)


def fingerprint(cfg: TrainConfig, part_path: str | Path | None = None) -> str:
    """Identifies a federate run: its params, its partition (by default its replicate's) and the code
    version."""
    return fingerprint_of(cfg.params_read, part_path or partition_file(cfg.seed))
