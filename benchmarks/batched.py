"""Batched against serial executor: the same FedAvg rounds on the same clients, once with
``fl.executor: batched`` and once with ``serial``, in one process.

Default: 100 clients of digits (Dirichlet alpha 0.5: unequal sizes, so the padding and the
step-count prefix are exercised), a small classifier (``--model mlp``; ``lenet`` for a CNN), full
participation, ``--steps`` local SGD steps of ``--batch-size`` each. The two arms run interleaved
``--repeats`` times (machine noise hits both) and the medians are compared; the final weights of the
two arms are checked to agree to the executor's documented tolerance.

Prints, on its last line, ``speedup X``: serial time / batched time (how many times faster batched
is; below 1 when it is slower), measured in process CPU time: both arms run on one thread with no
I/O, so on an idle machine CPU time is the wall time, and on a shared one it leaves out the time the
process waited for a core. The wall-clock ratio is printed on the line before.

    python benchmarks/batched.py [--clients 100] [--rounds 3] [--steps 5] [--model mlp]
                                 [--hidden 64] [--diffusion-clients 10] [--device cpu|cuda]

On CUDA (``--device cuda``) models and client data live on the GPU and the synchronised wall time
is compared (process CPU time does not count a GPU's work); bf16 autocast is off in both arms, so
that the final-weights check compares float32 with float32.

The diffusion track's arm (FedAvg on the DDPM loss, ``digits_small`` UNet, Adam, 10 clients) runs
first and prints its own ratio; the last line is the classifier's.

``--quick``: 4 clients, 2 rounds, 1 local step, 1 repeat, 2 diffusion clients, on the CPU: it checks
that the benchmark runs and that the two executors agree; its ratios mean nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from _digits import digits_clients, seeded_model_fn
from torch import nn

from fedpipe.algorithms.fedavg import FedAvg
from fedpipe.config.fl import FLConfig, LocalTrainConfig
from fedpipe.fl import run_federated
from fedpipe.fl.batched import ATOL, RTOL
from fedpipe.tasks import ClassificationTask

UNIT = "CPU"  # what is timed: process CPU time on the CPU, synchronised wall time on a GPU


DEVICE = torch.device("cpu")  # --device


def on_device(model_fn):
    return lambda: model_fn().to(DEVICE)


def setup(model_name: str, num_clients: int, alpha: float, kwargs: dict):
    ds, clients = digits_clients({"scheme": "dirichlet", "num_clients": num_clients, "alpha": alpha})
    return [c.to(DEVICE) for c in clients], on_device(seeded_model_fn(ds, model_name, **kwargs))


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def timed_run(clients, model_fn, local: LocalTrainConfig, rounds: int, executor: str,
              task=None):
    fl = FLConfig(rounds=rounds, participation=1.0, local=local, eval_every=10**6,
                  executor=executor)
    task = task if task is not None else ClassificationTask(bf16_autocast=False)
    strategy = FedAvg(task, model_fn, local, num_clients=len(clients))
    model = model_fn()
    sync()
    t0, c0 = time.perf_counter(), time.process_time()
    res = run_federated(strategy, model, clients, fl, seed=0, progress=False)
    sync()
    return time.perf_counter() - t0, time.process_time() - c0, res.state.weights


def diffusion_arm(args) -> None:
    """The diffusion track: FedAvg on the DDPM loss, ``digits_small`` UNet, Adam, 10 clients."""
    from fedpipe.fl.batched import ADAM_UPDATE_RTOL
    from fedpipe.models.unet import build_unet
    from fedpipe.tasks.diffusion import DiffusionTask

    clients, _ = setup("mlp", args.diffusion_clients, args.alpha, {})

    def unet() -> nn.Module:
        torch.manual_seed(0)
        return build_unet("digits_small", (1, 8, 8)).to(DEVICE)

    task = DiffusionTask(num_train_timesteps=500, bf16_autocast=False)
    local = LocalTrainConfig(steps=args.steps, batch_size=32, lr=1e-3, optimizer="adam")
    for ex in ("batched", "serial"):
        timed_run(clients, unet, local, 1, ex, task)
    cpu: dict[str, list[float]] = {"batched": [], "serial": []}
    out = {}
    for _ in range(args.repeats):
        for ex in ("serial", "batched"):
            t, c, out[ex] = timed_run(clients, unet, local, 2, ex, task)
            cpu[ex].append(t if DEVICE.type == "cuda" else c)  # a GPU's work is not process time
    a, b, w0 = out["serial"], out["batched"], unet().state_dict()
    rel = (sum(float(((a[k] - b[k]) ** 2).sum()) for k in a) ** 0.5
           / sum(float(((a[k] - w0[k]) ** 2).sum()) for k in a) ** 0.5)
    assert rel < ADAM_UPDATE_RTOL, rel
    med = {ex: statistics.median(v) for ex, v in cpu.items()}
    print(f"diffusion track: {args.diffusion_clients} clients, digits_small UNet, Adam, "
          f"{args.steps} steps of batch 32: serial {1000 * med['serial'] / 2:.0f} ms {UNIT}/round, "
          f"batched {1000 * med['batched'] / 2:.0f} ms {UNIT}/round, diffusion speedup "
          f"{med['serial'] / med['batched']:.2f} (update difference {rel:.1e} relative)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--hidden", type=int, default=64,
                    help="the MLP's width (64: a small classifier; the model's own default is 200)")
    ap.add_argument("--diffusion-clients", type=int, default=10,
                    help="the diffusion track's arm (digits_small UNet, Adam); 0 = skip it")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="where models and data live (cuda: wall time, synchronised, is compared)")
    ap.add_argument("--profile", type=Path, default=None,
                    help="also write torch.profiler's table of one batched round here (top 40 ops "
                    "by self time on the device, then on the host)")
    ap.add_argument("--quick", action="store_true",
                    help="a tiny run on the CPU (4 clients, 2 rounds, 1 step, 1 repeat)")
    args = ap.parse_args()
    if args.quick:
        args.clients, args.rounds, args.steps, args.repeats = 4, 2, 1, 1
        args.diffusion_clients = min(args.diffusion_clients, 2)
        if args.device == "cuda":
            print("[quick] on the CPU: --device cuda is for a full run")
        args.device = "cpu"
    global DEVICE, UNIT
    DEVICE, UNIT = torch.device(args.device), "wall" if args.device == "cuda" else "CPU"
    torch.set_num_threads(1)
    kwargs = {"hidden": args.hidden} if args.model == "mlp" else {}
    clients, model_fn = setup(args.model, args.clients, args.alpha, kwargs)
    sizes = sorted(len(c) for c in clients)
    local = LocalTrainConfig(steps=args.steps, batch_size=args.batch_size, lr=0.05)
    print(f"{args.clients} clients of digits (Dirichlet {args.alpha}; sizes {sizes[0]}..{sizes[-1]}), "
          f"{args.model} {kwargs or ''}, {args.steps} local steps of batch {args.batch_size}, "
          f"{args.rounds} rounds, {torch.get_num_threads()} thread, {DEVICE}")
    if args.diffusion_clients:
        diffusion_arm(args)
    for ex in ("batched", "serial"):  # warm-up: lazy imports, first calls, allocator growth
        timed_run(clients, model_fn, local, 1, ex)
    wall: dict[str, list[float]] = {"batched": [], "serial": []}
    cpu: dict[str, list[float]] = {"batched": [], "serial": []}
    worst = 0.0
    for _ in range(args.repeats):
        out = {}
        for ex in ("serial", "batched"):
            t, c, out[ex] = timed_run(clients, model_fn, local, args.rounds, ex)
            wall[ex].append(t)
            cpu[ex].append(c)
        a, b = out["serial"], out["batched"]
        worst = max(worst, max(float((a[k] - b[k]).abs().max()) for k in a))
        assert all(torch.allclose(b[k], a[k], atol=ATOL, rtol=RTOL) for k in a), worst
    med_wall = {ex: statistics.median(v) for ex, v in wall.items()}
    med_cpu = {ex: statistics.median(v) for ex, v in cpu.items()}
    for ex in ("serial", "batched"):
        print(f"{ex:8s} {1000 * med_cpu[ex] / args.rounds:8.1f} ms CPU/round, "
              f"{1000 * med_wall[ex] / args.rounds:8.1f} ms wall/round (medians of {args.repeats})")
    print(f"max |batched - serial| on the final weights: {worst:.2e} (tolerance atol {ATOL}, "
          f"rtol {RTOL})")
    print(f"wall-clock speedup {med_wall['serial'] / med_wall['batched']:.2f} (meaningful on an "
          f"idle machine only)")
    med = med_wall if DEVICE.type == "cuda" else med_cpu  # a GPU's work is not process time
    print(f"speedup {med['serial'] / med['batched']:.2f}")
    if args.profile:
        profile(args.profile, lambda: timed_run(clients, model_fn, local, 1, "batched"))


def profile(path: Path, run) -> None:
    """torch.profiler's key averages of ``run()``: where a batched round's time goes (on a GPU, the
    host's launches against the device's kernels)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE.type == "cuda" else [])
    with torch_profile(activities=acts) as prof:
        run()
    avg = prof.key_averages()
    parts = []
    if DEVICE.type == "cuda":
        parts.append(avg.table(sort_by="self_cuda_time_total", row_limit=40))
    parts.append(avg.table(sort_by="self_cpu_time_total", row_limit=40))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(parts) + "\n")
    print(f"profile of one batched round -> {path}")


if __name__ == "__main__":
    main()
