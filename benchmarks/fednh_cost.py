"""FedNH's cost per round against FedAvg's: the same clients, model, rounds and local schedule, in
one process, the two runs interleaved so that machine noise hits both; CPU time of the process
(``time.process_time``), which a loaded machine inflates less than wall time.

Prints, per model width: FedAvg's and FedNH's CPU seconds per round (median over repeats), their
ratio, and the share of FedNH's round spent in the prototype step (the client's no-grad pass for
its class sums, Eq. 3, and the server's Eq. 4). The paper (App. A.6) says this step is FedNH's only
extra cost; the rest of the difference is the prototype head's forward/backward (normalise, scale),
which matters only on very small models.

    python benchmarks/fednh_cost.py [--rounds 5] [--repeats 3] [--clients 20] [--epochs 5]

Measured on the shared 2-core CPU, heavily loaded, niced, one thread (--rounds 3 --repeats 2; digits,
20 clients, Dir(0.3), participation 0.5, 5 local epochs): smoke width FedAvg 0.289, FedNH 0.356
CPU s/round (x1.23), prototype step 5.7% of FedNH's round; paper width FedAvg 0.832, FedNH 0.886
(x1.065), prototype step 6.2%.

``--quick``: 4 clients, 1 round of 1 local epoch, 1 repeat, no warm-up: it checks that the benchmark runs; its
ratios mean nothing at that size.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _digits import digits_clients
from torch import nn

import fedpipe.algorithms.fednh as fednh_module
from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.config.fl import FLConfig, LocalTrainConfig
from fedpipe.fl import run_federated
from fedpipe.models import build_model
from fedpipe.tasks import ClassificationTask

WIDTHS = {"smoke (16 ch, 96/48)": {"channels": 16, "hidden": (96, 48)},
          "paper (64 ch, 384/192)": {"channels": 64, "hidden": (384, 192)}}


class PrototypeClock:
    """CPU time spent in FedNH's prototype step (class sums on clients, Eq. 4 on the server)."""

    def __init__(self):
        self.seconds = 0.0
        self.sums, self.update = fednh_module.class_sums, fednh_module.FedNH.server_update
        clock = self

        def sums(*a, **k):
            t = time.process_time()
            out = clock.sums(*a, **k)
            clock.seconds += time.process_time() - t
            return out

        def update(strategy, *a, **k):
            t = time.process_time()
            out = clock.update(strategy, *a, **k)
            clock.seconds += time.process_time() - t
            return out

        fednh_module.class_sums = sums
        fednh_module.FedNH.server_update = update


def setup(num_clients: int):
    return digits_clients({"scheme": "dirichlet", "alpha": 0.3, "num_clients": num_clients,
                           "min_size": 10})


def run(name: str, ds, clients, kwargs: dict, local: LocalTrainConfig, rounds: int) -> float:
    cls = ALGORITHMS[name]
    cfg = algorithm_config(name, None)

    def model_fn() -> nn.Module:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            m = build_model("cnn_fednh", ds.meta.shape, 10, mean=ds.meta.mean, std=ds.meta.std,
                            **kwargs)
            return cls.adapt_model(m, cfg)

    fl = FLConfig(rounds=rounds, participation=0.5, local=local, aggregation="uniform",
                  eval_every=10**6)
    strategy = cls(ClassificationTask(), model_fn, local, cfg, aggregation="uniform",
                   num_clients=len(clients))
    model = model_fn()
    t0 = time.process_time()
    run_federated(strategy, model, clients, fl, seed=0, progress=False)
    return (time.process_time() - t0) / rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="4 clients, 1 round of 1 epoch, 1 repeat")
    args = ap.parse_args()
    if args.quick:
        args.clients, args.rounds, args.epochs, args.repeats = 4, 1, 1, 1
    torch.set_num_threads(1)
    ds, clients = setup(args.clients)
    local = LocalTrainConfig(epochs=args.epochs, batch_size=32, lr=0.05, momentum=0.9,
                             weight_decay=1e-5, grad_clip=10.0, lr_decay=0.99)
    clock = PrototypeClock()
    for title, kwargs in WIDTHS.items():
        for name in ("fedavg", "fednh") if not args.quick else ():  # warm-up, untimed
            run(name, ds, clients, kwargs, local, 1)  # (lazy imports, first calls)
        avg, nh, proto = [], [], []
        for _ in range(args.repeats):
            avg.append(run("fedavg", ds, clients, kwargs, local, args.rounds))
            clock.seconds = 0.0
            nh.append(run("fednh", ds, clients, kwargs, local, args.rounds))
            proto.append(clock.seconds / args.rounds)
        a, n, p = statistics.median(avg), statistics.median(nh), statistics.median(proto)
        print(f"{title}: FedAvg {a:.3f} s/round, FedNH {n:.3f} s/round (CPU), ratio {n / a:.3f}; "
              f"prototype step {p:.4f} s/round = {100 * p / n:.1f}% of FedNH's round")


if __name__ == "__main__":
    main()
