"""Sampling: DDIM with k steps against DDPM ancestral sampling with all T steps, on the same warm-up
models, in one process.

Draws ``--samples`` images the way the generate stage does (per client in proportion to its data, from
that client's warm-up model), once per sampler with the same seeds, and prints the time ratio
DDPM / DDIM and the FID of each against the real training set (the cached reference of the
``feature_extractor`` stage). Needs the outputs of ``dvc repro warmup feature_extractor``.

    python benchmarks/sampling.py [--samples 500] [--ddim-steps 50] [--repeats 1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from fedpipe.config import load_params
from fedpipe.data import load_dataset
from fedpipe.io import load_tensors
from fedpipe.pipeline.common import load_partition
from fedpipe.pipeline.diffusion import WARMUP_DIR, diffusion_stage_config, make_task, make_unet
from fedpipe.pipeline.feature_extractor import load_fid_tools
from fedpipe.pipeline.generate import aux_counts
from fedpipe.pipeline.warmup import client_path
from fedpipe.rng import torch_generator


def sample_all(models, counts, task, sampler: str, steps: int, seed: int, batch_size: int
               ) -> tuple[torch.Tensor, float]:
    t0 = time.perf_counter()
    parts = [task.sample(models[cid], n, sampler=sampler, steps=steps, batch_size=batch_size,
                         generator=torch_generator(seed, "benchmark-sampling", cid))
             for cid, n in enumerate(counts) if n > 0]
    return torch.cat(parts), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=500)
    ap.add_argument("--ddim-steps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = diffusion_stage_config(load_params(), "aux_quality")
    if cfg.diffusion.conditional:
        raise SystemExit("error: the benchmark samples unconditionally; set diffusion.conditional=false")
    part = load_partition()
    ds = load_dataset(cfg.dataset)
    device = cfg.device.torch
    task = make_task(cfg.diffusion, cfg.device.accel)
    models = {}
    for cid in range(part.num_clients):
        path = client_path(WARMUP_DIR / "models", cid)
        if not path.is_file():
            raise SystemExit(f"error: missing {path}; run `dvc repro warmup feature_extractor` first")
        m = make_unet(cfg.diffusion, ds.meta, cfg.seed, "warmup-init", cid)
        m.load_state_dict(load_tensors(path))
        models[cid] = m.to(device)
    tools = load_fid_tools(cfg.fid, ds.meta, cfg.seed, device=device)
    sizes = part.sizes()
    counts = aux_counts(sizes, args.samples / sizes.sum()).tolist()
    T = cfg.diffusion.num_train_timesteps
    arms = {"ddpm": T, "ddim": args.ddim_steps}
    times: dict[str, list[float]] = {a: [] for a in arms}
    fids: dict[str, float] = {}
    for _ in range(args.repeats):  # interleaved, so that machine noise hits both arms
        for arm, steps in arms.items():
            x, sec = sample_all(models, counts, task, arm, steps, cfg.seed, cfg.generate.batch_size)
            times[arm].append(sec)
            fids[arm] = tools.fid.score(x, tools.reference, batch_size=cfg.fid.batch_size)
    med = {a: float(np.median(t)) for a, t in times.items()}
    print(f"{sum(counts)} samples from {sum(c > 0 for c in counts)} warm-up models on {device}; "
          f"FID extractor {tools.fid.name}")
    for arm, steps in arms.items():
        print(f"  {arm:5s} {steps:5d} steps: {med[arm]:8.2f} s   FID {fids[arm]:.4f}")
    print(f"time ratio ddpm/ddim = {med['ddpm'] / med['ddim']:.2f} "
          f"(step ratio {T / args.ddim_steps:.2f})")


if __name__ == "__main__":
    main()
