"""Ray executor against the serial executor on this machine: seconds per round of each, the Ray
overhead per round, and how the Ray round time changes with the number of CPUs of the local instance.

Same FedAvg run both ways (digits, ``--clients`` iid clients, all of them every round, MLP, local SGD),
so the two give the same weights bit for bit (checked). Per-round time is the steady state: the time
from the end of round 1 to the end of the last round, over ``rounds - 1`` (Ray's worker start-up falls
in round 1, ``ray.init`` before it; both are printed apart). For each CPU count the local Ray instance is
started anew, and the serial and Ray runs alternate (``--repeats``), so machine noise hits both.

Scaling: a round's K clients run on min(K, C) CPUs at once. With per-client compute c (serial time / K)
and a Ray overhead o per client task (measured at 1 CPU: (ray - serial) / K), the round time on C CPUs
is about ceil(K / C) * (c + o); the script prints that estimate for more CPUs.

    python benchmarks/ray_overhead.py [--clients 10] [--rounds 6] [--epochs 2] [--cpus 1 2]

The last line is ``speedup X``: serial time / Ray time per round at the largest CPU count (below 1
when Ray is slower).

``--quick``: the serial arm only (2 clients, 2 rounds of 1 epoch, 1 repeat), Ray imported but not
started (``ray.init`` and its workers' start-up take 10-20 s on a small machine; tests/test_ray_executor.py
runs the Ray executor): it checks that the benchmark's set-up and serial path run.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import torch
from _digits import digits_clients, seeded_model_fn, timed_fedavg

from fedpipe.config.fl import LocalTrainConfig


def setup(num_clients: int, hidden: int):
    ds, clients = digits_clients({"scheme": "iid", "num_clients": num_clients})
    return clients, seeded_model_fn(ds, "mlp", hidden=hidden)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--cpus", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--quick", action="store_true",
                    help="the serial arm only, 2 clients, 2 rounds of 1 epoch, 1 repeat; Ray not started")
    args = ap.parse_args()
    if args.quick:
        args.clients, args.rounds, args.epochs, args.repeats, args.cpus = 2, 2, 1, 1, [1]

    import ray

    from fedpipe.config.fl import RayConfig
    from fedpipe.fl.ray_executor import connect

    torch.set_num_threads(1)  # one thread per client task, as the pipeline's workers
    clients, model_fn = setup(args.clients, args.hidden)
    local = LocalTrainConfig(epochs=args.epochs, batch_size=32, lr=0.05)
    k = len(clients)
    print(f"FedAvg, digits, {k} clients per round, MLP hidden {args.hidden}, {args.epochs} local "
          f"epochs, {args.rounds} rounds; torch threads 1; machine: {os.cpu_count()} CPUs")
    if args.quick:
        s, _, _ = timed_fedavg("serial", clients, model_fn, local, args.rounds)
        print(f"[quick] Ray {ray.__version__} not started (its start-up alone takes 10-20 s; run "
              f"without --quick for the Ray arm): serial {s:.3f} s/round")
        return
    results = {}
    for cpus in args.cpus:
        os.environ["FEDPIPE_WORKERS"] = str(cpus)
        t = time.perf_counter()
        connect(RayConfig(), threads=1)
        init_s = time.perf_counter() - t
        serial, on_ray, first = [], [], []
        for _ in range(args.repeats):
            s, _, w_serial = timed_fedavg("serial", clients, model_fn, local, args.rounds)
            r, r1, w_ray = timed_fedavg("ray", clients, model_fn, local, args.rounds)
            assert all(torch.equal(w_serial[n], w_ray[n]) for n in w_serial), "not bit-identical"
            serial.append(s)
            on_ray.append(r)
            first.append(r1)
        ray.shutdown()
        s, r = statistics.median(serial), statistics.median(on_ray)
        results[cpus] = (s, r)
        print(f"num_cpus={cpus}: ray.init {init_s:.1f} s, Ray round 1 (worker start) "
              f"{first[0]:.2f} s; per round: serial {s:.3f} s, ray {r:.3f} s, overhead "
              f"{r - s:+.3f} s/round ({(r - s) / k * 1000:+.1f} ms per client task); bit-identical")

    # scaling estimate from the 1-CPU measurement (or the smallest measured)
    c1 = min(results)
    s, r = results[c1]
    per_client = s / k
    per_task = max(r / math.ceil(k / c1) - per_client, 0.0)  # at 1 CPU: (ray - serial) / K
    est = {c: math.ceil(k / c) * (per_client + per_task) for c in (2, 4, 8, 16)}
    print(f"per client: compute {per_client * 1000:.1f} ms, Ray overhead {per_task * 1000:.1f} ms; "
          "estimated Ray s/round with C CPUs (ceil(K/C) * (compute + overhead)): "
          + ", ".join(f"C={c}: {v:.3f} s ({s / v:.2f}x serial)" for c, v in est.items()))
    big = max(results)
    s, r = results[big]
    print(f"speedup {s / r:.2f}")


if __name__ == "__main__":
    main()
