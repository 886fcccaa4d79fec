"""The skeleton of a training stage (``federate``, ``federate_ddpm``): read the replicate's partition,
check the method against it and every input before any compute, load the data, build the strategy,
run the engine with checkpoints and resume, and write the run (model, personal models, history,
per-client records, ``metrics.json``, ``curves.png``). A track states only what differs
(:class:`Track`, :class:`Setup`): its inputs, task, model, evaluator, server data and extra outputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedpipe.algorithms import ALGORITHMS
from fedpipe.cli import keep_on_interrupt
from fedpipe.config import ConfigError
from fedpipe.data import Partition, load_dataset
from fedpipe.data.datasets import Dataset
from fedpipe.fl import RunResult, ServerData, run_federated
from fedpipe.fl.strategy import Strategy
from fedpipe.io import md5_file, save_figure, write_json
from fedpipe.pipeline.common import clients_of, load_partition
from fedpipe.pipeline.inputs import checkpoint_dir, fingerprint_of, partition_file
from fedpipe.pipeline.outputs import plot_history, run_dir, save_run


@dataclass(frozen=True)
class TrainOutputs:
    """What a training stage hands its script (for MLflow): the run, its folder, ``final`` (the values
    of ``metrics.json``, plus what this process did: ``train_seconds_now``, ``resumed_from``, which
    differ between a fresh and a resumed run and so stay out of every DVC output), the input files
    read and the model written, each with its MD5."""

    result: RunResult
    out_dir: Path
    final: dict[str, Any]
    inputs: dict[str, str]
    outputs: dict[str, str]


@dataclass(frozen=True)
class Setup:
    """A track's parts built once the dataset is loaded (:attr:`Track.setup`)."""

    task: Any
    model_fn: Callable[[], torch.nn.Module]
    """A fresh model on the run's device (the strategy's scratch and client models)."""
    model: torch.nn.Module
    """The model the run starts from."""
    read: dict[str, str]
    """Input files read to build ``model`` ({path: md5}: a backbone), for lineage and the fingerprint."""
    evaluator: Callable[[Strategy], Callable]
    """The engine's ``evaluate(state, personal)`` for the strategy."""
    server_data: Callable[[str], tuple[ServerData, dict[str, str]]]
    """The server data of a kind the method declares, on the device, and the files read."""
    finish: Callable[[Path, RunResult, Strategy], dict[str, Any]]
    """After the run: the track's own outputs and additions to the history (before it is written),
    returning the values of ``metrics.json``."""
    score: Callable | None = None
    """The round's quality score the engine hands the server (``RoundInfo.score``), if any."""


@dataclass(frozen=True)
class Track:
    """What a training stage states beyond the skeleton (:func:`train`)."""

    section: str
    """The params section of the round loop (``fl``, ``diffusion_fl``)."""
    model_meta: dict[str, Any]
    """Written into ``model.safetensors``' header besides the algorithm and the rounds."""
    title: str
    """The title of ``curves.png``."""
    curve: tuple[str, ...]
    """:func:`~fedpipe.pipeline.outputs.plot_history`'s metric, its label (and the loss label)."""
    check_inputs: Callable[[str], None]
    """Given the method's server-data kind, raise on an input that is missing or unreadable (before
    any compute)."""
    setup: Callable[[Dataset, Partition], Setup]


def train(cfg: Any, track: Track, out_root: str | Path, partition_path: str | Path | None = None,
          stop_after: int | None = None, on_round: Callable[[dict[str, float]], None] | None = None,
          progress: bool = True) -> TrainOutputs:
    """Train ``cfg.algorithm`` in replicate ``cfg.seed`` (a config with ``seed``, ``dataset``, ``fl``,
    ``algorithm``, ``algo_cfg``, ``params_read``, ``device``) into ``<out_root>/<algorithm>/seed_<seed>``
    on the replicate's partition (default ``data/partition/seed_<seed>``), resuming from its
    checkpoint (:func:`~fedpipe.pipeline.inputs.checkpoint_dir`) when one matches."""
    out = run_dir(out_root, cfg.algorithm, cfg.seed)
    partition_path = partition_path or partition_file(cfg.seed)
    part = load_partition(partition_path, cfg.seed)
    method = ALGORITHMS[cfg.algorithm]
    if method.needs_client_groups and "groups" not in part.meta:
        raise ConfigError("partition.scheme", part.meta["scheme"],
                          f"label_blocks ({cfg.algorithm} needs each client's planted group)")
    method.check_clients(cfg.algo_cfg, part.num_clients, cfg.fl.clients_per_round(part.num_clients))
    kind = method.server_data_kind(cfg.algo_cfg)
    track.check_inputs(kind)  # every input is readable before any compute
    ds = load_dataset(cfg.dataset)
    device = cfg.device.torch  # everything below lives there (on the CPU: as it always did)
    clients = [c.to(device) for c in clients_of(ds, part)]  # batches drawn where they train
    setup = track.setup(ds, part)
    strategy = method(setup.task, setup.model_fn, cfg.fl.local, cfg.algo_cfg,
                      aggregation=cfg.fl.aggregation, num_clients=part.num_clients,
                      client_groups=part.meta.get("groups"))  # label_blocks' groups: GIFAIR, NMI
    inputs = {str(partition_path): md5_file(partition_path)} | setup.read
    server_data = None
    if kind != "none":
        server_data, read = setup.server_data(kind)
        inputs |= read
    ckpt = checkpoint_dir(out_root, cfg.algorithm, f"seed_{cfg.seed}")
    keep_on_interrupt(f"checkpoint (every {track.section}.checkpoint_every rounds) kept in {ckpt}")
    t0 = time.perf_counter()
    result = run_federated(strategy, setup.model, clients, cfg.fl, cfg.seed,
                           evaluate=setup.evaluator(strategy), checkpoint_dir=ckpt,
                           fingerprint=fingerprint_of(cfg.params_read, *inputs),  # resume on a match
                           stop_after=stop_after, server_data=server_data, score=setup.score,
                           on_round=on_round, progress=progress, section=track.section)
    seconds = time.perf_counter() - t0
    final = setup.finish(out, result, strategy)
    save_run(out, result, {"algorithm": cfg.algorithm, **track.model_meta})
    write_json(out / "metrics.json", final)
    save_figure(out / "curves.png", plot_history(result.history, track.title, *track.curve))
    model = out / "model.safetensors"
    return TrainOutputs(result, out, {**final, "train_seconds_now": seconds,
                                      "resumed_from": result.resumed_from},
                        inputs, {str(model): md5_file(model)})
