"""Equitable-FL's server clustering cost against the round's training time, in one process.

The smoke study's setting (digits, label_blocks groups 3 + 7, MLP 64-200-200-10, r = 4 clients per
round, E = 2 epochs, batch 32): for each round, the time of the round's client work (FedProx local
training plus the activation vector, serial), of the activation vectors alone, and of the server's
clustering (S = A A^T, eigh, K-Means with n_init = 10) and equitable average. Prints medians and the
ratio clustering / training. A paper-scale row times the clustering alone on r = 4 (18) vectors of
width 512 (FEMNIST: r = 18, C = 5), which does not depend on the model.

    python benchmarks/equitable_cluster_cost.py [--rounds 20] [--repeats 10]

``--quick``: 2 rounds, 2 repeats of the paper-scale rows: it checks that the benchmark runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.algorithms.equitable_fl import activation_vector, equitable_weights, spectral_clusters
from fedpipe.config import dataset_config, partition_config
from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import client_data, load_dataset, make_partition
from fedpipe.fl import Payload, RoundInfo
from fedpipe.models import build_model
from fedpipe.rng import numpy_rng, torch_generator
from fedpipe.tasks import ClassificationTask


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=10, help="timings of each clustering-alone row")
    ap.add_argument("--quick", action="store_true", help="2 rounds, 2 repeats")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.repeats = 2, 2
    ds = load_dataset(dataset_config({"name": "digits"}))
    pcfg = partition_config({"scheme": "label_blocks", "num_clients": 10, "groups": [3, 7],
                             "blocks": [3, 7]})
    part = make_partition(ds.train.y.numpy(), ds.test.y.numpy(), 10, pcfg, 0, "digits")
    clients = [client_data(ds.train, part, i) for i in range(10)]

    def model_fn():
        torch.manual_seed(0)
        return build_model("mlp", ds.meta.shape, 10)

    local = LocalTrainConfig(epochs=2, batch_size=32, lr=0.05)
    s = ALGORITHMS["equitable_fl"](ClassificationTask(), model_fn, local,
                                   algorithm_config("equitable_fl", {"mu": 0.01}), num_clients=10)
    s.client_groups = tuple(part.meta["groups"])
    state = s.init_server(model_fn())
    train_t, act_t, clus_t = [], [], []
    for r in range(args.rounds):
        sel = sorted(numpy_rng(0, "client-sampling", r).choice(10, 4, replace=False).tolist())
        t0 = time.perf_counter()
        ups = [s.client_update(Payload(r, state.weights, client_id=c), {}, clients[c],
                               torch_generator(0, "client-update", r, c), c)[0] for c in sel]
        t1 = time.perf_counter()
        for c in sel:  # the activation vectors alone (already inside the client work above)
            activation_vector(s._scratch, clients[c], torch.Generator())
        t2 = time.perf_counter()
        state = s.aggregate(state, RoundInfo(r, args.rounds, 0, tuple(ups), selected=tuple(sel)))
        t3 = time.perf_counter()
        train_t.append(t1 - t0)
        act_t.append(t2 - t1)
        clus_t.append(t3 - t2)
    med = {k: statistics.median(v) for k, v in (("train", train_t), ("activation", act_t),
                                                 ("cluster", clus_t))}
    print(f"smoke setting, median over {args.rounds} rounds (shared machine: read the ratios):")
    print(f"  round's client work (4 clients, FedProx + activation): {1e3 * med['train']:.1f} ms")
    print(f"  activation vectors alone:                              {1e3 * med['activation']:.1f} ms"
          f"  ({med['activation'] / med['train']:.1%} of the client work)")
    print(f"  server clustering + equitable average:                 {1e3 * med['cluster']:.1f} ms"
          f"  ({med['cluster'] / med['train']:.1%} of the client work)")
    for r_, d, c in ((4, 512, 3), (18, 512, 5)):
        a = -np.abs(np.random.default_rng(0).normal(size=(r_, d))) - 5
        ts = []
        for i in range(args.repeats):
            t = time.perf_counter()
            labels = spectral_clusters(a, c, np.random.default_rng(i))
            equitable_weights(labels, c)
            ts.append(time.perf_counter() - t)
        print(f"  clustering alone, r = {r_}, d = {d}, C = {c}: {1e3 * statistics.median(ts):.1f} ms")


if __name__ == "__main__":
    main()
