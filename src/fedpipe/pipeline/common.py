"""Shared set-up of the training stages: validated configs, datasets, client data, models."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedpipe.algorithms import ALGORITHMS, algorithm_config, check_algorithms, init_config
from fedpipe.config import ConfigError, DatasetConfig, dataset_config
from fedpipe.config.core import build, check_sections, read_seed
from fedpipe.config.dataset import check_server_data_source
from fedpipe.config.device import DeviceConfig, device_config, device_params
from fedpipe.config.fl import FLConfig, InitConfig, ModelConfig, StudyConfig, fl_config, model_config
from fedpipe.config.models import (
    _build_problem,
    check_model,  # noqa: F401  (re-exported)
)
from fedpipe.data import Dataset
from fedpipe.models import build_model
from fedpipe.pipeline.inputs import (  # noqa: F401  (re-exported: the training stages' inputs)
    PARTITION_DIR,
    clients_of,
    code_version,
    fingerprint_of,
    load_partition,
    partition_file,
    replicate_seed,
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
    """Validate every section the federate stage of ``algorithm`` reads (before loading data): of
    ``algorithms``, its own section only (the plan stage validated them all, once, before any
    training stage ran; a training stage loads only the method it runs). ``run_seed`` (default: the
    root ``seed``) seeds the federated run."""
    check_sections(params)
    seed = read_seed(params)
    ds = dataset_config(params.get("dataset"))
    model = model_config(params.get("model"))
    check_model(model, "model", ds.in_shape(), ds.num_classes())
    fl = fl_config(params.get("fl"))
    study = build(StudyConfig, params.get("study"), "study")
    check_algorithms(study.algorithms, "study.algorithms")
    algos = algorithm_sections(params)
    algo_cfg = algorithm_config(algorithm, algos.get(algorithm))
    check_method_setting(algorithm, algo_cfg, model, ds, fl)
    init = init_config(algorithm, algos.get(algorithm))
    run = seed if run_seed is None else parse_run_seed(run_seed)
    read = {"seed": seed, "run_seed": run, "dataset": params.get("dataset"),
            "model": params.get("model"), "fl": params.get("fl"),
            f"algorithms.{algorithm}": algos.get(algorithm) or {}}
    device = device_config(params)
    read |= device_params(params, device)
    return TrainConfig(run, ds, model, fl, study, algorithm, algo_cfg, read, device, init)


def algorithm_sections(params: dict) -> dict[str, Any]:
    """The ``algorithms`` section as a mapping (its sections are validated where they are read)."""
    algos = params.get("algorithms") or {}
    if not isinstance(algos, dict):
        raise ConfigError("algorithms", algos, "a mapping of algorithm name to its settings")
    return algos


def check_method_setting(algorithm: str, algo_cfg: Any, model: ModelConfig, ds: DatasetConfig,
                         fl: FLConfig) -> None:
    """What ``algorithm`` needs of the other settings, checked from params before any data loads
    (a ConfigError naming the key otherwise): a model it can adapt and split into shared and
    personal parts (PerAda's residual blocks, FedBN's norm layers, FedSim's part), server data that
    the dataset can give (a holdout, a public set), and, for the Ray executor, GPUs when it reserves
    them on this machine."""
    key = json.dumps([algorithm, repr(algo_cfg), model.name, model.kwargs, ds.in_shape(),
                      ds.num_classes()], sort_keys=True, default=str)
    if key not in _FITS:  # the evaluate stage checks every run: each pair is built once
        _check_method_model(algorithm, algo_cfg, model, ds, fl)
        _FITS.add(key)
    kind = ALGORITHMS[algorithm].server_data_kind(algo_cfg)
    check_server_data_source({kind: [algorithm]}, ds)
    if fl.executor == "ray" and fl.ray.gpus_per_client > 0 and fl.ray.address is None \
            and not torch.cuda.is_available():
        raise ConfigError("fl.ray.gpus_per_client", fl.ray.gpus_per_client,
                          "0 on a machine without a GPU (a local Ray instance would wait for one "
                          "forever), or fl.ray.address of a cluster with GPUs")


_FITS: set[str] = set()  # (method, model) pairs already checked in this process


def _check_method_model(algorithm: str, algo_cfg: Any, model: ModelConfig, ds: DatasetConfig,
                        fl: FLConfig) -> None:
    """Build the model as ``algorithm`` trains it (CPU, no data) and ask it for its personal part;
    a refusal is a ConfigError naming model.name."""
    cls = ALGORITHMS[algorithm]

    def build(kwargs: dict) -> torch.nn.Module:
        net = cls.adapt_model(build_model(model.name, ds.in_shape(), ds.num_classes(), **kwargs),
                              algo_cfg)
        cls(None, lambda: net, fl.local, algo_cfg).personal_keys(net)
        return net

    problem = _build_problem(build, model.kwargs, meta=False)
    if problem is not None:
        raise ConfigError("model.name", model.name, f"a model that {algorithm} can use "
                          f"(algorithms.{algorithm}: {problem})")


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
