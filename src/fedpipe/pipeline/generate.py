"""The generate stage (FedDDPM Sec. III, "auxiliary data generation"): the server samples
|A_i| = ratio * m_i images from client i's warm-up DDPM and pools them into the auxiliary set A.

The per-client counts use largest-remainder rounding of round(ratio * m) over the client sizes, so the
total is exact. With class conditioning, client i's rows are labelled in proportion to its own class
counts (again largest remainder), so A is labelled.

Outputs (all atomic), for replicate r of ``study.seeds`` (the stage ``generate@<r>``: replicate r's partition
and warm-up models, every draw from r) in ``data/generate/seed_<r>/``: ``aux.safetensors`` (``images`` float32
in [0, 1], ``labels`` int64, -1 when unconditional, ``client`` int64 per row), ``sources.json`` (which client
produced which rows), ``grids/client_XXX.png`` (a sample grid per client) and ``metrics.json``."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from fedpipe.config.diffusion import check_diffusion_models
from fedpipe.data import load_dataset
from fedpipe.errors import DivergenceError, InputError
from fedpipe.fl.state import all_finite
from fedpipe.io import load_tensors, md5_file, save_figure, save_tensors, write_json
from fedpipe.pipeline.aux import META_KEY, aux_counts, plot_grid, requested_labels
from fedpipe.pipeline.diffusion import (
    GENERATE_DIR,
    WARMUP_DIR,
    DiffusionStageConfig,
    client_path,
    make_task,
    make_unet,
)
from fedpipe.pipeline.inputs import check_input, load_partition, partition_file, replicate_dir
from fedpipe.pipeline.workers import map_in_processes, one_thread, worker_count
from fedpipe.rng import torch_generator

log = logging.getLogger(__name__)


def _sample_client(job: tuple, device: torch.device | str = "cpu") -> tuple[int, torch.Tensor]:
    """One client's share of the auxiliary set, from its warm-up model and its own seeded stream (in
    a worker process or in the stage's, always with one torch thread on the CPU: the same bits)."""
    cfg, meta, cid, n, y, path = job
    g = cfg.generate
    steps = cfg.diffusion.num_train_timesteps if g.sampler == "ddpm" else g.ddim_steps
    weights = load_tensors(path, f"warmup@{cfg.seed}")
    if not all_finite(weights):
        raise DivergenceError(f"generate: client {cid}'s warm-up model {path} holds non-finite "
                              "weights (its warm-up diverged); nothing is written. Run "
                              f"`dvc repro warmup@{cfg.seed}` with a lower warmup.lr or a warmup.grad_clip")
    model = make_unet(cfg.diffusion, meta, cfg.seed, "warmup-init", cid)
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:  # other shapes: a model of other params
        raise InputError(path, f"not a model of these diffusion params ({str(e).splitlines()[0]})",
                         f"warmup@{cfg.seed}") from None
    model.to(device)
    x = make_task(cfg.diffusion, cfg.device.accel).sample(model, n, labels=y, sampler=g.sampler, steps=steps,
                                        generator=torch_generator(cfg.seed, "generate", cid),
                                        batch_size=g.batch_size)
    if not bool(torch.isfinite(x).all()):  # never a non-finite sample set
        raise DivergenceError(f"generate: client {cid}'s warm-up model gave non-finite samples "
                              f"({g.sampler}, {steps} steps); nothing is written. Its warm-up "
                              f"model is unusable: run `dvc repro warmup@{cfg.seed}` with a lower warmup.lr "
                              "or a warmup.grad_clip")
    return cid, x


def generate(cfg: DiffusionStageConfig, out_dir: str | Path | None = None,
             warmup_dir: str | Path | None = None, partition_path: str | Path | None = None,
             progress: bool = True) -> dict:
    """Sample the auxiliary set from the warm-up models; returns the stage metrics. By default it
    reads and writes replicate ``cfg.seed``'s files (``data/{partition,warmup,generate}/seed_<seed>``)."""
    out = Path(out_dir or replicate_dir(GENERATE_DIR, cfg.seed))
    warmup_dir = warmup_dir or replicate_dir(WARMUP_DIR, cfg.seed)
    partition_path = partition_path or partition_file(cfg.seed)
    check_diffusion_models(cfg.dataset, cfg.diffusion, cfg.fid)  # before any data loads
    part = load_partition(partition_path, cfg.seed)
    g = cfg.generate
    counts = aux_counts(part.sizes(), g.ratio)
    for cid, n in enumerate(counts.tolist()):  # every input is readable before any compute
        if n > 0:
            check_input(client_path(Path(warmup_dir) / "models", cid), f"warmup@{cfg.seed}")
    ds = load_dataset(cfg.dataset)
    device = cfg.device.torch
    steps = cfg.diffusion.num_train_timesteps if g.sampler == "ddpm" else g.ddim_steps
    train_y = ds.train.y.numpy()
    images, labels, owner, sources = [], [], [], {}
    start, t0 = 0, time.perf_counter()
    jobs = []
    for cid, n in enumerate(counts.tolist()):
        if n == 0:
            continue
        path = client_path(Path(warmup_dir) / "models", cid)
        y = None
        if cfg.diffusion.conditional:
            y = requested_labels(n, np.bincount(train_y[part.train[cid]], minlength=ds.meta.num_classes))
        jobs.append((cfg, ds.meta, cid, n, y, path))
    samples: dict[int, torch.Tensor] = {}
    bar = tqdm(total=int(counts.sum()), desc="generate", unit="img", disable=not progress)
    n_workers = min(worker_count(), len(jobs))
    if n_workers <= 1 or device.type != "cpu":
        for job in jobs:
            with one_thread() if device.type == "cpu" else contextlib.nullcontext():
                cid, samples[job[2]] = _sample_client(job, device)
            bar.update(job[3])
    else:
        bar.set_description(f"generate ({n_workers} processes)")
        for cid, x in map_in_processes(_sample_client, jobs, n_workers):
            samples[cid] = x
            bar.update(len(x))
    bar.close()
    for _, _, cid, n, y, _ in jobs:  # in client order, whatever order they finished in
        x = samples[cid]
        images.append(x)
        labels.append(y if y is not None else torch.full((n,), -1, dtype=torch.int64, device="cpu"))
        owner.append(torch.full((n,), cid, dtype=torch.int64, device="cpu"))
        save_figure(out / "grids" / f"client_{cid:03d}.png",
                    plot_grid(x, f"client {cid}: {n} samples ({g.sampler}, {steps} steps)"))
    for cid, n in enumerate(counts.tolist()):
        sources[str(cid)] = {"start": start, "count": n}
        start += n
    seconds = time.perf_counter() - t0
    meta = {"sampler": g.sampler, "steps": steps, "ratio": g.ratio,
            "conditional": cfg.diffusion.conditional, "total": int(counts.sum()),
            "dataset": cfg.dataset.name}
    save_tensors(out / "aux.safetensors",
                 {"images": torch.cat(images), "labels": torch.cat(labels), "client": torch.cat(owner)},
                 {META_KEY: json.dumps(meta, sort_keys=True)})
    write_json(out / "sources.json", sources)
    metrics = {"samples": float(counts.sum()), "model_evaluations": float(counts.sum() * steps),
               "steps": float(steps)}
    write_json(out / "metrics.json", metrics)  # no wall time: DVC hashes this file
    metrics = {**metrics, "seconds": seconds}  # to MLflow (the stage logs what it returns)
    log.info("generate: %d samples from %d clients (%s, %d steps) in %.1f s", counts.sum(),
             int((counts > 0).sum()), g.sampler, steps, seconds)
    return {"metrics": metrics, "inputs": {str(partition_path): md5_file(partition_path)},
            "outputs": {str(out / "aux.safetensors"): md5_file(out / "aux.safetensors")}}
