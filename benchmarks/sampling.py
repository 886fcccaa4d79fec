"""Sampling: DDIM with k steps against DDPM ancestral sampling with all T steps, on the same warm-up
models, in one process.

Draws ``--samples`` images the way the generate stage does (per client in proportion to its data, from
that client's warm-up model), once per sampler with the same seeds, and prints the time ratio
DDPM / DDIM and the FID of each against the real training set (the cached reference of the
``feature_extractor`` stage). Needs the outputs of ``dvc repro warmup@<seed> feature_extractor``
(replicate ``--seed``, default the root ``seed`` of params.yaml).

    python benchmarks/sampling.py [--samples 500] [--ddim-steps 50] [--repeats 1] [--seed S]

``--quick``: a tiny run in a temporary directory that first builds its own inputs (4 clients, T = 10,
one warm-up epoch, a one-epoch FID classifier) through the stages' functions, then samples 20 images
with 2 DDIM steps: it checks that the benchmark runs, its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

import numpy as np
import torch

from fedpipe.config import load_params
from fedpipe.data import load_dataset
from fedpipe.errors import InputError
from fedpipe.io import load_tensors
from fedpipe.pipeline.aux import aux_counts
from fedpipe.pipeline.diffusion import WARMUP_DIR, client_path, diffusion_stage_config, make_task, make_unet
from fedpipe.pipeline.fid_tools import load_fid_tools
from fedpipe.pipeline.inputs import load_partition, partition_file, replicate_dir
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
    ap.add_argument("--seed", type=int, default=None,
                    help="the replicate whose warm-up models sample (default: the root seed)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny inputs built in a temporary directory, 20 samples, 2 DDIM steps")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.samples, args.ddim_steps, args.repeats = 20, 2, 1
    with quick_inputs() if args.quick else contextlib.nullcontext():
        try:
            measure(args)
        except InputError as e:  # a stage output missing: its message names the stage to run
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None


@contextlib.contextmanager
def quick_inputs():
    """A temporary working directory with tiny stage outputs: partition, warm-up, FID extractor."""
    from _quick import note, tiny_workdir, write_partition

    from fedpipe.pipeline.feature_extractor import feature_extractor
    from fedpipe.pipeline.warmup import warmup

    with tiny_workdir({"device": "cpu"}) as params:
        part_path = write_partition(params)
        cfg = diffusion_stage_config(params, "aux_quality")
        warmup(cfg, partition_path=part_path, progress=False, workers=1)
        feature_extractor(cfg, progress=False)
        note("inputs built in a temporary directory: 4 clients, T = 10, 1 warm-up epoch, "
             "a 1-epoch FID classifier; CPU")
        yield


def measure(args) -> None:
    cfg = diffusion_stage_config(load_params(), "aux_quality", args.seed)
    if cfg.diffusion.conditional:
        raise SystemExit("error: the benchmark samples unconditionally; set diffusion.conditional=false")
    part = load_partition(partition_file(cfg.seed), cfg.seed)
    ds = load_dataset(cfg.dataset)
    device = cfg.device.torch
    task = make_task(cfg.diffusion, cfg.device.accel)
    models = {}
    models_dir = replicate_dir(WARMUP_DIR, cfg.seed) / "models"
    for cid in range(part.num_clients):
        path = client_path(models_dir, cid)
        if not path.is_file():
            raise SystemExit(f"error: missing {path}; run `dvc repro warmup@{cfg.seed} "
                             "feature_extractor` first")
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
