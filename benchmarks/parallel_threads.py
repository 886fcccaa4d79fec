"""Warm-up speed when two experiments run side by side (`dvc queue start -j 2`), before and after the
thread setting.

Each "experiment" is one process doing what the warm-up stage does for its clients: train a client's
DDPM (the study's ``diffusion`` and ``warmup`` params from params.yaml, client 0 of a Dirichlet-free
equal split of the digits training set) for ``--steps`` optimizer steps through the warm-up's own
``train_client_ddpm``. Arms, each measured in this one run:

- ``alone``: one experiment, the warm-up as it runs now (one torch thread per client job, as many
  client jobs at once as there are cores, ``FEDPIPE_WORKERS``'s default);
- ``before``: two experiments at once, each as the warm-up ran before the thread setting: its
  clients one after the other in one process with torch's default thread count (one per core);
- ``after``: two experiments at once, each as it runs now (one thread per client job, one job per
  core), so 2 x cores single-thread jobs share the cores.

For each arm it prints the steps per second of one client job and the total steps per second of the
machine (all jobs together). The last line is ``speedup X``: the machine's total warm-up steps per
second of ``after`` over ``before``.

    python benchmarks/parallel_threads.py [--steps 150] [--cores N]
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import time

import torch

from fedpipe.config import load_params
from fedpipe.pipeline.diffusion import diffusion_stage_config


def _job(args: tuple) -> tuple[float, int]:
    """Train ``steps`` steps of one client's warm-up DDPM with ``threads`` torch threads once
    ``barrier`` releases; returns the seconds taken."""
    steps, threads, barrier = args
    torch.set_num_threads(threads)
    from fedpipe.data import load_dataset
    from fedpipe.data.skew import ClientData
    from fedpipe.pipeline.diffusion import make_task, make_unet
    from fedpipe.pipeline.warmup import train_client_ddpm
    from fedpipe.rng import torch_generator

    cfg = diffusion_stage_config(load_params(), "warmup")
    ds = load_dataset(cfg.dataset)
    batch = cfg.warmup.batch_size
    data = ClientData(ds.train.x[: steps * batch], ds.train.y[: steps * batch])
    n = len(data)
    epochs = max(1, -(-steps * batch // n))
    warm = dataclasses.replace(cfg.warmup, epochs=epochs)
    model = make_unet(cfg.diffusion, ds.meta, 0, "bench", 0)
    task = make_task(cfg.diffusion)
    barrier.wait()
    t0 = time.perf_counter()
    train_client_ddpm(model, data, task, warm, torch_generator(0, "bench"))
    return time.perf_counter() - t0, epochs * -(-n // batch)


def run_arm(jobs: int, threads: int, steps: int) -> tuple[float, float]:
    """``jobs`` processes at once, ``threads`` torch threads each: (steps/s of one job, steps/s of
    all jobs together)."""
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(jobs)
        with ctx.Pool(jobs) as pool:
            results = pool.map(_job, [(steps, threads, barrier)] * jobs)
    per_job = [n / s for s, n in results]
    return sum(per_job) / len(per_job), sum(per_job)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150, help="optimizer steps per client job")
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    args = ap.parse_args()
    c = args.cores
    arms = {f"alone (1 experiment, {c} jobs x 1 thread)": (c, 1),
            f"before (2 experiments, 1 job x {c} threads each)": (2, c),
            f"after (2 experiments, {c} jobs x 1 thread each)": (2 * c, 1)}
    total = {}
    for name, (jobs, threads) in arms.items():
        one, all_ = run_arm(jobs, threads, args.steps)
        total[name.split()[0]] = all_
        print(f"{name:50s} {one:7.2f} steps/s per job, {all_:7.2f} steps/s in all")
    print(f"speedup {total['after'] / total['before']:.2f}")


if __name__ == "__main__":
    main()
