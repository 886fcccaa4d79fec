"""The federate_ddpm stage: federated training of the DDPM noise predictor with one algorithm of
``study.diffusion_algorithms`` (FedAvg, FedProx, SCAFFOLD, MoFedSAM unchanged: the engine and the
algorithms are task-agnostic; FedDDPM and FedDDPM+ add the server calibration on the auxiliary set).

Round loop and local training come from the ``diffusion_fl`` section (same schema as ``fl``; the
paper's aggregation is the unweighted mean of eq. 9, ``aggregation: uniform``). Every
``diffusion_fl.eval_every`` rounds the global model is scored: the epsilon-MSE on the real test set and
an FID on ``fid.curve_samples`` images generated with ``fid.curve_sampler`` (the FID-per-round curve;
DDIM by default, a fraction of the cost of all T steps; the same sampling noise at every point, so the
curve shows the model's change, not the sampler's). At the end: the FID on ``fid.num_samples`` images
drawn with ``fid.sampler``, a sample grid, and for FedDDPM(+) the server cost.

A method that declares server data (FedDDPM, FedDDPM+: ``server_data: aux``) gets the auxiliary set
as :class:`~fedpipe.fl.ServerData`; every method gets the FID of ``n`` samples as the round's
``score`` (FedDDPM+'s QuickTest). The pipeline never names a method.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedpipe.algorithms import algorithm_config, check_algorithms
from fedpipe.config import dataset_config
from fedpipe.config.core import build, check_sections, read_seed
from fedpipe.config.device import DeviceConfig, device_config, device_params
from fedpipe.config.diffusion import (
    DiffusionConfig,
    FIDConfig,
    check_diffusion_models,
    check_diffusion_track,
    diffusion_config,
    fid_config,
)
from fedpipe.config.fl import FLConfig, StudyConfig, fl_config
from fedpipe.data import ClientData
from fedpipe.fl import RunResult, ServerData
from fedpipe.io import md5_file, save_figure, write_json
from fedpipe.pipeline.aux import check_aux, load_aux, plot_grid, requested_labels
from fedpipe.pipeline.common import algorithm_sections, parse_run_seed
from fedpipe.pipeline.diffusion import FID_DIR, aux_file, make_task, make_unet
from fedpipe.pipeline.fid_tools import FIDTools, check_fid_inputs, load_fid_tools
from fedpipe.pipeline.training import Setup, Track, TrainOutputs, train
from fedpipe.rng import torch_generator
from fedpipe.tasks.diffusion import DiffusionTask

log = logging.getLogger(__name__)

FEDERATE_DDPM_DIR = Path("data/federate_ddpm")


@dataclass(frozen=True)
class DDPMTrainConfig:
    seed: int
    dataset: Any
    diffusion: DiffusionConfig
    fl: FLConfig
    fid: FIDConfig
    study: StudyConfig
    algorithm: str
    algo_cfg: Any
    params_read: dict
    device: DeviceConfig = DeviceConfig()


def ddpm_train_config(params: dict, algorithm: str, run_seed: int | str = 0) -> DDPMTrainConfig:
    """Validate every section the federate_ddpm stage of ``algorithm`` reads (before loading data).

    ``run_seed`` (one of ``study.seeds``) is the run's replicate: it seeds the federated run (model
    init, sampling, local training, FID samples), which reads that replicate's partition and auxiliary
    set (``data/partition/seed_<run_seed>``, ``data/generate/seed_<run_seed>``); only the FID
    extractor (``data/fid``, from the root ``seed``) is shared by all replicates.
    """
    check_sections(params)
    read_seed(params)
    seed = parse_run_seed(run_seed)
    ds = dataset_config(params.get("dataset"))
    diff = diffusion_config(params.get("diffusion"))
    fl = fl_config(params.get("diffusion_fl"), "diffusion_fl")
    fid = fid_config(params.get("fid"))
    check_diffusion_track(ds, diff, fid)
    check_diffusion_models(ds, diff, fid)
    study = build(StudyConfig, params.get("study"), "study")
    check_algorithms(study.diffusion_algorithms, "study.diffusion_algorithms")
    algos = algorithm_sections(params)  # its own section validated here; all of them by plan
    algo_cfg = algorithm_config(algorithm, algos.get(algorithm))
    read = {"seed": params.get("seed", 0), "run_seed": seed, "dataset": params.get("dataset"),
            "diffusion": params.get("diffusion"),
            "diffusion_fl": params.get("diffusion_fl"), "fid": params.get("fid"),
            f"algorithms.{algorithm}": algos.get(algorithm) or {}}
    device = device_config(params)
    read |= device_params(params, device)
    return DDPMTrainConfig(seed, ds, diff, fl, fid, study, algorithm, algo_cfg, read, device)


def sample_images(task: DiffusionTask, model: torch.nn.Module, n: int, cfg: DDPMTrainConfig,
                  class_counts: np.ndarray, gen: torch.Generator, sampler: str | None = None,
                  progress: str | None = None) -> torch.Tensor:
    """``n`` images from ``model`` with ``sampler`` (default ``fid.sampler``; labels in proportion to
    the training set's class counts when the model is class-conditional). ``progress``: the name of a
    progress bar over the sampling steps (None: no bar)."""
    sampler = sampler or cfg.fid.sampler
    labels = requested_labels(n, class_counts) if cfg.diffusion.conditional else None
    T = cfg.diffusion.num_train_timesteps
    steps = T if sampler == "ddpm" else min(cfg.fid.ddim_steps, T)  # DDIM takes at most T steps
    return task.sample(model, n, labels=labels, sampler=sampler, steps=steps, generator=gen,
                       batch_size=cfg.fid.batch_size, progress=progress is not None,
                       desc=f"{progress}: {n} samples, {sampler}" if progress else None)


def fid_of(task: DiffusionTask, tools: FIDTools, cfg: DDPMTrainConfig, class_counts: np.ndarray,
           sampler: str | None = None, progress: str | None = None
           ) -> Callable[[torch.nn.Module, int, torch.Generator], float]:
    """FID of ``n`` samples of a model drawn with ``sampler`` (default ``fid.sampler``), with a
    progress bar named ``progress`` over the sampling (None: none)."""
    def score(model: torch.nn.Module, n: int, gen: torch.Generator) -> float:
        x = sample_images(task, model, n, cfg, class_counts, gen, sampler, progress)
        return tools.fid.score(x, tools.reference, batch_size=cfg.fid.batch_size)
    return score


def federate_ddpm(cfg: DDPMTrainConfig, out_root: str | Path = FEDERATE_DDPM_DIR,
                  partition_path: str | Path | None = None, aux_path: str | Path | None = None,
                  fid_dir: str | Path = FID_DIR, stop_after: int | None = None,
                  on_round: Callable[[dict[str, float]], None] | None = None,
                  progress: bool = True) -> TrainOutputs:
    """Run the federate_ddpm stage for ``cfg.algorithm`` in replicate ``cfg.seed`` (by default on its
    partition and auxiliary set; the skeleton: :func:`~fedpipe.pipeline.training.train`)."""
    aux_path = aux_path or aux_file(cfg.seed)

    def check_inputs(kind: str) -> None:
        check_fid_inputs(fid_dir)
        if kind != "none":
            check_aux(aux_path, cfg.seed)

    def setup(ds, part) -> Setup:
        device = cfg.device.torch
        test_x, test_y = ds.test.x.to(device), ds.test.y.to(device)
        task = make_task(cfg.diffusion, cfg.device.accel)
        tools = load_fid_tools(cfg.fid, ds.meta, cfg.seed, fid_dir, device)
        class_counts = np.bincount(ds.train.y.numpy(), minlength=ds.meta.num_classes)

        def model_fn() -> torch.nn.Module:
            return make_unet(cfg.diffusion, ds.meta, cfg.seed, "ddpm-global-init").to(device)

        score = fid_of(task, tools, cfg, class_counts,  # the round's score (FedDDPM+'s QuickTest)
                       progress="round score FID" if progress else None)
        curve_score = fid_of(task, tools, cfg, class_counts, cfg.fid.curve_sampler,
                             progress="FID curve" if progress else None)

        def evaluator(strategy) -> Callable:
            def evaluate(state, personal=None) -> dict[str, float]:
                model = strategy.global_model(state).to(device)
                res = task.evaluate(model, test_x, test_y)
                fid = curve_score(model, cfg.fid.curve_samples, torch_generator(cfg.seed, "fid-curve"))
                return {"loss": res["loss"], "fid": fid}
            return evaluate

        def server_data(kind: str) -> tuple[ServerData, dict[str, str]]:
            aux = load_aux(aux_path, cfg.seed)
            labels = aux.labels if kind == "aux" else torch.full_like(aux.labels, -1)
            data = ServerData(kind, ClientData(aux.images, labels).to(device),
                              bool((labels >= 0).all()), str(aux_path))
            return data, {str(aux_path): md5_file(aux_path)}

        def finish(out: Path, result: RunResult, strategy) -> dict[str, Any]:
            model = strategy.global_model(result.state).to(device)
            x = sample_images(task, model, cfg.fid.num_samples, cfg, class_counts,
                              torch_generator(cfg.seed, "fid-final"),
                              progress="final FID" if progress else None)
            final_fid = tools.fid.score(x, tools.reference, batch_size=cfg.fid.batch_size)
            meta = result.state.meta
            write_json(out / "quicktest.json", {"trace": meta.get("quicktest", []),
                                                "stopped_at": meta.get("stopped_at")})
            save_figure(out / "samples.png",
                        plot_grid(x, f"{title}: FID {final_fid:.3f} ({len(x)} samples)"))
            log.info("%s: %d rounds, FID %.4f on %d samples (%s)", cfg.algorithm, result.rounds_done,
                     final_fid, len(x), tools.fid.name)
            stopped_at = meta.get("stopped_at") or result.rounds_done
            return {"fid": final_fid, "fid_samples": cfg.fid.num_samples, "extractor": tools.fid.name,
                    "sampler": cfg.fid.sampler, "curve_sampler": cfg.fid.curve_sampler,
                    "curve_samples": cfg.fid.curve_samples, "rounds": result.rounds_done,
                    "stopped_at": stopped_at,
                    # the stop round as a share of diffusion_fl.rounds (FedDDPM+'s early-stop claim)
                    "stop_fraction": stopped_at / cfg.fl.rounds,
                    "corrected_at": meta.get("corrected_at"),  # a server correction's round (FedDDPM+)
                    "server_steps": meta.get("server_steps", 0),
                    "final_train_loss": result.history[-1].get("train_loss"),  # None: no client trains
                    "test_loss": [h for h in result.history if "test_loss" in h][-1]["test_loss"]}

        return Setup(task, model_fn, model_fn(), {}, evaluator, server_data, finish, score)

    title = f"{cfg.algorithm} DDPM on {cfg.dataset.name}"
    return train(cfg, Track("diffusion_fl", {"unet": cfg.diffusion.unet}, title,
                            ("test_fid", "FID", "epsilon-MSE"), check_inputs, setup),
                 out_root, partition_path, stop_after, on_round, progress)
