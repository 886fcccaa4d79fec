"""FedPTR-S's cost against FedAvg's, in one process: the smoke study's setting (digits, Dirichlet(0.01),
10 clients, full participation, ConvNet width 32, batch 32, lr 0.05 momentum 0.5, 1 local epoch;
FedPTR-S with ipc 2, H = 5, R = 10, K = 5, projection lr 0.05), the runs interleaved so that machine
noise hits all of them; CPU time of the process (``time.process_time``, one thread), which a loaded
machine inflates less than wall time.

Measures, over the same ``--rounds`` rounds (median over ``--repeats``):

- FedAvg's CPU seconds per round;
- one MTT update (Algorithm 1: H outer iterations through R unrolled second-order student steps), timed
  inside the FedPTR-S run, and its ratio to one FedAvg round;
- the K-step projection per round (it runs every round t > m, whatever F);
- FedPTR-S's total CPU time against FedAvg's with MTT every round (F = 1), every 10 rounds (F = 10)
  and once (one-shot), with the number of MTT updates each made.

``--paper-shape`` adds one row with the paper's MTT shape instead of the smoke's (ConvNet width 128,
ipc 10, H = 20, R = 10 on the same digits data): one MTT update against one FedAvg round of the same
width-128 model (two rounds of each). A rough FLOP count (ours, not the paper's: one MTT update
of H = 20, R = 10 on 100 images costs about one FedAvg round) puts FedPTR-S at about 2x FedAvg at
F = 1 and 1.1x at F = 10 on CIFAR10, where a FedAvg round is an epoch over 50,000 32x32 images; digits
has 1,347 8x8 images, so the ratios here are not the paper's.

    python benchmarks/fedptr_cost.py [--rounds 20] [--repeats 2] [--paper-shape]

Ratios against FedAvg measured in the same run are the meaningful output; absolute seconds depend on
the machine and its load.

Measured on the shared 2-core CPU, heavily loaded, niced, one thread (--rounds 20 --repeats 1
--paper-shape; CPU time): one MTT update = 2.9 FedAvg rounds, the projection 0.10 FedAvg rounds per
round; whole run against FedAvg's: F = 1 (19 MTT updates) x3.73, F = 10 (2 updates) x1.14, one-shot
x1.12. Paper MTT shape on digits: one MTT update = 47 FedAvg rounds of the width-128 model (a digits
round is an epoch over 1,347 8x8 images: not the CIFAR ratio).

``--quick``: 2 rounds, 1 repeat, MTT with H = 1 outer iteration of R = 2 student steps (the paper
shape's row, if asked for, with H = 1), no warm-up: it checks that the benchmark runs; its ratios
mean nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _digits import digits_clients
from torch import nn

import fedpipe.algorithms.fedptr as fedptr_module
from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.config.fl import FLConfig, LocalTrainConfig
from fedpipe.fl import run_federated
from fedpipe.models import build_model
from fedpipe.tasks import ClassificationTask

SMOKE = {"ipc": 2, "mtt_iterations": 5, "proj_lr": 0.05}  # conf/study/fedptr_smoke.yaml
PAPER = {"ipc": 10, "mtt_iterations": 20, "proj_lr": 0.05}  # the paper's MTT shape (--paper-shape)
LOCAL = LocalTrainConfig(epochs=1, batch_size=32, lr=0.05, momentum=0.5)


class Clock:
    """CPU time and calls of ``mtt_update`` and ``project`` as FedPTR-S calls them (a context
    manager: the module's functions are wrapped inside it and restored on exit)."""

    NAMES = {"mtt": "mtt_update", "project": "project"}

    def __init__(self) -> None:
        self.reset()

    def __enter__(self) -> Clock:
        self.saved = {attr: getattr(fedptr_module, attr) for attr in self.NAMES.values()}
        for key, attr in self.NAMES.items():
            setattr(fedptr_module, attr, self.wrap(key, self.saved[attr]))
        return self

    def __exit__(self, *exc) -> None:
        for attr, fn in self.saved.items():
            setattr(fedptr_module, attr, fn)

    def wrap(self, key, fn):
        def timed(*a, **k):
            t = time.process_time()
            out = fn(*a, **k)
            self.seconds[key] += time.process_time() - t
            self.calls[key] += 1
            return out
        return timed

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.NAMES, 0.0)
        self.calls = dict.fromkeys(self.NAMES, 0)


def setup():
    return digits_clients({"scheme": "dirichlet", "alpha": 0.01, "num_clients": 10, "min_size": 10})


def run(name: str, ds, clients, width: int, cfg: dict | None, rounds: int) -> float:
    """CPU seconds of a whole run of ``rounds`` rounds (model construction outside the clock)."""
    def model_fn() -> nn.Module:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            return build_model("convnet", ds.meta.shape, 10, width=width, mean=ds.meta.mean,
                               std=ds.meta.std)

    fl = FLConfig(rounds=rounds, participation=1.0, local=LOCAL, eval_every=10**6)
    strategy = ALGORITHMS[name](ClassificationTask(), model_fn, LOCAL, algorithm_config(name, cfg),
                                num_clients=len(clients))
    model = model_fn()
    t0 = time.process_time()
    run_federated(strategy, model, clients, fl, seed=0, progress=False)
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--paper-shape", action="store_true")
    ap.add_argument("--quick", action="store_true", help="2 rounds, 1 repeat, MTT H = 1, R = 2")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.repeats = 2, 1
        SMOKE.update(mtt_iterations=1, syn_steps=2)
        PAPER.update(mtt_iterations=1)
    torch.set_num_threads(1)
    ds, clients = setup()
    with Clock() as clock:
        measure(args, ds, clients, clock)


def measure(args, ds, clients, clock: Clock) -> None:
    arms = {"F = 1": ("fedptr_s", {**SMOKE, "mtt_every": 1}),
            "F = 10": ("fedptr_s", {**SMOKE, "mtt_every": 10}),
            "one-shot": ("fedptr_s_once", SMOKE)}
    avg: list[float] = []
    total: dict[str, list[float]] = {k: [] for k in arms}
    mtt: list[float] = []
    proj: list[float] = []
    updates: dict[str, int] = {}
    if not args.quick:  # warm-up, untimed: lazy imports and first calls
        run("fedavg", ds, clients, 32, None, 1)
        run("fedptr_s", ds, clients, 32, {**SMOKE, "mtt_every": 1}, 2)  # round 2 > m: one MTT update
    for rep in range(args.repeats):
        avg.append(run("fedavg", ds, clients, 32, None, args.rounds))
        for key, (name, cfg) in arms.items():
            clock.reset()
            total[key].append(run(name, ds, clients, 32, cfg, args.rounds))
            updates[key] = clock.calls["mtt"]
            if key == "F = 1":
                mtt.append(clock.seconds["mtt"] / clock.calls["mtt"])
                proj.append(clock.seconds["project"] / clock.calls["project"])
        a = statistics.median(avg)
        r, m1, p1 = a / args.rounds, statistics.median(mtt), statistics.median(proj)
        print(f"smoke setting, {args.rounds} rounds, median of {rep + 1} repeat(s) (CPU s, one "
              f"thread):\n  FedAvg round {r:.3f} s; one MTT update (H = {SMOKE['mtt_iterations']}, "
              f"R = {SMOKE.get('syn_steps', 10)}, {10 * SMOKE['ipc']} images) "
              f"{m1:.3f} s = {m1 / r:.2f} FedAvg rounds; projection (K = 5) {p1:.4f} s/round = "
              f"{p1 / r:.3f} FedAvg rounds", flush=True)
        for key in arms:
            t = statistics.median(total[key])
            print(f"  FedPTR-S {key}: {updates[key]} MTT updates, total {t:.2f} s vs FedAvg "
                  f"{a:.2f} s: x{t / a:.2f}", flush=True)
    if args.paper_shape:  # two rounds each: the MTT update of round t = 2 > m alone counts
        pa = run("fedavg", ds, clients, 128, None, 2) / 2
        clock.reset()
        run("fedptr_s", ds, clients, 128, PAPER, 2)
        p = clock.seconds["mtt"] / clock.calls["mtt"]
        print(f"  paper MTT shape (width 128, ipc 10, H = {PAPER['mtt_iterations']}, R = 10), one run: "
              f"FedAvg round "
              f"(width 128) {pa:.3f} s; one MTT update {p:.2f} s = {p / pa:.1f} FedAvg rounds")


if __name__ == "__main__":
    main()
