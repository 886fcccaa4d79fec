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

Before the arms, a stage on a shared machine (``fedpipe.cli.DEFAULT_THREADS``): one job of the same
steps, alone and beside a process that spins on one core (another user's job), at torch's own thread
count (one per core: the stages' default before) and at one thread (their default now). It prints
each one's time beside the spinner over its time alone: a stage should stay within about 2x.

    python benchmarks/parallel_threads.py [--steps 150] [--cores N]

The jobs of all arms run in one pool of 2 x cores spawned processes (started before any arm; a
barrier per arm starts that arm's jobs together, so each arm's jobs run at once on distinct
processes).

``--quick``: 2 steps per job, as if the machine had one core (3 arms of 1, 2 and 2 jobs), the worker
processes forked (where the platform can) from this one after it imported what a job imports,
rather than spawned (each spawned process imports torch and the pipeline anew: seconds): it checks
that the benchmark runs; its ratios mean nothing.
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

_BARRIERS: dict = {}  # in a worker: jobs of an arm -> the barrier its jobs wait at


def _init_worker(barriers: dict) -> None:
    _BARRIERS.update(barriers)


def _job(args: tuple) -> tuple[float, int]:
    """Train ``steps`` steps of one client's warm-up DDPM with ``threads`` torch threads once all
    ``jobs`` jobs of the arm are ready; returns the seconds taken and the steps trained."""
    steps, threads, jobs = args
    barrier = _BARRIERS[jobs]
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


def _spin() -> None:
    while True:
        pass


def contended(pool, ctx, threads: int, steps: int) -> tuple[float, float]:
    """Seconds of one job at ``threads`` threads alone, and beside a process spinning on a core."""
    alone = pool.apply(_job, ((steps, threads, 1),))[0]
    spinner = ctx.Process(target=_spin, daemon=True)
    spinner.start()
    try:
        time.sleep(0.2)
        shared = pool.apply(_job, ((steps, threads, 1),))[0]
    finally:
        spinner.terminate()
        spinner.join()
    return alone, shared


def run_arm(pool, jobs: int, threads: int, steps: int) -> tuple[float, float]:
    """``jobs`` processes of ``pool`` at once, ``threads`` torch threads each: (steps/s of one job,
    steps/s of all jobs together). A job blocks its process until all are ready, so the ``jobs``
    jobs (one task each) run on ``jobs`` distinct processes."""
    results = pool.map(_job, [(steps, threads, jobs)] * jobs, chunksize=1)
    per_job = [n / s for s, n in results]
    return sum(per_job) / len(per_job), sum(per_job)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150, help="optimizer steps per client job")
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--quick", action="store_true", help="2 steps per job, as on one core")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.cores = 2, 1
    c = args.cores
    arms = {f"alone (1 experiment, {c} jobs x 1 thread)": (c, 1),
            f"before (2 experiments, 1 job x {c} threads each)": (2, c),
            f"after (2 experiments, {c} jobs x 1 thread each)": (2 * c, 1)}
    ctx = mp.get_context("spawn")
    if args.quick and "fork" in mp.get_all_start_methods():
        import fedpipe.pipeline.warmup  # noqa: F401  (what _job imports, inherited by the forks)

        ctx = mp.get_context("fork")
        print("[quick] 2 steps per job, as on 1 core; worker processes forked, not spawned")
    barriers = {jobs: ctx.Barrier(jobs) for jobs in {1, *(jobs for jobs, _ in arms.values())}}
    total = {}
    with ctx.Pool(max(jobs for jobs, _ in arms.values()), _init_worker, (barriers,)) as pool:
        torch_default = pool.apply(torch.get_num_threads)
        for label, threads in ((f"torch's default ({torch_default} threads)", torch_default),
                               ("one thread (the stages' default)", 1)):
            alone, shared = contended(pool, ctx, threads, args.steps)
            print(f"a stage at {label:35s} alone {alone:6.2f} s, beside a busy core {shared:6.2f} s:"
                  f" x{shared / alone:.2f}", flush=True)
        for name, (jobs, threads) in arms.items():
            one, all_ = run_arm(pool, jobs, threads, args.steps)
            total[name.split()[0]] = all_
            print(f"{name:50s} {one:7.2f} steps/s per job, {all_:7.2f} steps/s in all", flush=True)
    print(f"speedup {total['after'] / total['before']:.2f}")


if __name__ == "__main__":
    main()
