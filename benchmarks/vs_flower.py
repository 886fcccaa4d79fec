"""fedpipe FedAvg against Flower's simulation (``flwr`` with its Ray backend) on one partition, one
model, one optimizer, the same rounds: seconds per round and final accuracy of each.

Both sides run the very same client computation: Flower's client (a ``NumPyClient`` in Flower's Ray
actors) calls fedpipe's ``Strategy.client_update`` with the round's weights and the client's seeded
stream ``(seed, "client-update", round, client)``, so the two differ only in the framework around it:
fedpipe's round loop with the serial executor against Flower's server, its Ray virtual-client engine
and message passing, and Flower's FedAvg aggregation (numpy, weighted by sample count, as fedpipe's
``fl.aggregation: weighted``). Same initial weights (``initial_parameters``), all clients every round.

Per-round time is the steady state: from the end of round 1 to the end of the last round, over
``rounds - 1`` (Flower's ``ray.init`` and actor start-up fall before round 1 ends; the start-up is
printed apart). Accuracy: the final global model on the digits test set, computed outside the clock.
fedpipe is timed before and after Flower (the slower of the two counts), against machine noise. A
third arm runs fedpipe with its own Ray executor (``fl.executor: ray``) on the same CPUs: Flower's
backend, fedpipe's round loop.

Flower is a benchmark extra (``pip install -e .[bench]``), not a runtime dependency. Its pins (an
older ray among them) may clash with the project's environment; then install it into a virtual
environment of its own and run this script with that interpreter, the project's ``src`` on
``PYTHONPATH`` (and torch importable).

    python benchmarks/vs_flower.py [--clients 10] [--rounds 20] [--cpus 2]

The last line is ``speedup X``: Flower's seconds per round / fedpipe's.

``--quick``: fedpipe's serial arm only (2 clients, 2 rounds, MLP hidden 16); Flower's simulation and
the Ray arm are skipped (both start a Ray instance: 10-20 s on a small machine), and Flower is not
needed: it checks that the benchmark's set-up and fedpipe's arm run.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import time
import warnings

import numpy as np
import torch
from _digits import digits_clients, seeded_model_fn, timed_fedavg

from fedpipe.config.fl import LocalTrainConfig
from fedpipe.fl import Strategy
from fedpipe.fl.state import ServerState
from fedpipe.rng import torch_generator
from fedpipe.tasks import ClassificationTask

SEED = 0


def setup(num_clients: int, hidden: int, alpha: float):
    ds, clients = digits_clients({"scheme": "dirichlet", "num_clients": num_clients, "alpha": alpha},
                                 SEED)
    return ds, clients, seeded_model_fn(ds, "mlp", hidden=hidden)


def accuracy(model_fn, weights, ds) -> float:
    m = model_fn()
    m.load_state_dict(weights)
    return ClassificationTask().evaluate(m, ds.test.x, ds.test.y)["accuracy"]


def run_fedpipe(ds, clients, model_fn, local, rounds, executor="serial"):
    per_round, first, weights = timed_fedavg(executor, clients, model_fn, local, rounds, seed=SEED)
    return per_round, first, accuracy(model_fn, weights, ds)


def run_flower(ds, clients, model_fn, local, rounds, cpus):
    import flwr
    from flwr.client import NumPyClient
    from flwr.common import ndarrays_to_parameters
    from flwr.server import ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import start_simulation

    logging.getLogger("flwr").setLevel(logging.ERROR)  # its deprecation notice for start_simulation
    names = list(model_fn().state_dict())
    init = [v.numpy() for v in model_fn().state_dict().values()]
    n = len(clients)

    class Client(NumPyClient):
        def __init__(self, cid: int):
            self.cid = cid

        def fit(self, parameters, config):
            strategy = Strategy(ClassificationTask(), model_fn, local, num_clients=n)
            r = int(config["round"]) - 1  # fedpipe's rounds are 0-based
            state = ServerState({k: torch.from_numpy(np.asarray(v)) for k, v
                                 in zip(names, parameters, strict=True)})
            update, _, _ = strategy.client_update(
                strategy.payload(state, r, self.cid), {}, clients[self.cid],
                torch_generator(SEED, "client-update", r, self.cid), self.cid)
            return [update.weights[k].numpy() for k in names], update.num_samples, {}

    def client_fn(context):
        torch.set_num_threads(1)
        return Client(int(context.node_config["partition-id"])).to_client()

    marks: dict[int, float] = {}
    final: dict[str, list] = {}

    def evaluate_fn(server_round, parameters, config):
        marks[server_round] = time.perf_counter()
        if server_round == rounds:
            final["weights"] = [np.array(p) for p in parameters]
        return None

    strategy = FedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=n,
                      min_available_clients=n, evaluate_fn=evaluate_fn,
                      on_fit_config_fn=lambda r: {"round": r},
                      initial_parameters=ndarrays_to_parameters(init))
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start_simulation(client_fn=client_fn, num_clients=n, config=ServerConfig(num_rounds=rounds),
                         strategy=strategy, client_resources={"num_cpus": 1, "num_gpus": 0.0},
                         ray_init_args={"num_cpus": cpus, "include_dashboard": False,
                                        "logging_level": logging.WARNING})
    per_round = (marks[rounds] - marks[1]) / (rounds - 1)
    weights = {k: torch.from_numpy(v) for k, v in zip(names, final["weights"], strict=True)}
    return per_round, marks[1] - t0, accuracy(model_fn, weights, ds), flwr.__version__


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=200)
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of Flower's Ray instance")
    ap.add_argument("--no-ray-arm", dest="ray_arm", action="store_false",
                    help="skip the third arm, fedpipe with its Ray executor")
    ap.add_argument("--quick", action="store_true",
                    help="fedpipe's serial arm only, 2 clients, 2 rounds; Flower and Ray skipped")
    args = ap.parse_args()
    if args.quick:
        args.clients, args.rounds, args.hidden = 2, 2, 16
    elif importlib.util.find_spec("flwr") is None:
        raise SystemExit("error: Flower is not installed (a benchmark extra: pip install -e .[bench], "
                         "best into a virtual environment of its own; see this script's docstring)")

    torch.set_num_threads(1)
    ds, clients, model_fn = setup(args.clients, args.hidden, args.alpha)
    local = LocalTrainConfig(epochs=args.epochs, batch_size=32, lr=0.05)
    print(f"FedAvg, digits, dirichlet alpha {args.alpha}, {args.clients} clients (all every round), "
          f"MLP hidden {args.hidden}, SGD lr 0.05 batch 32, {args.epochs} local epoch(s), "
          f"{args.rounds} rounds; torch threads 1; machine: {os.cpu_count()} CPUs")
    if args.quick:
        fp_round, _, fp_acc = run_fedpipe(ds, clients, model_fn, local, args.rounds)
        print(f"[quick] Flower's simulation and the Ray arm skipped (each starts a Ray instance; "
              f"Flower {'installed' if importlib.util.find_spec('flwr') else 'not installed'})")
        print(f"fedpipe (serial executor): {fp_round:.4f} s/round, final accuracy {fp_acc:.4f}")
        return
    before, _, fp_acc = run_fedpipe(ds, clients, model_fn, local, args.rounds)
    fl_round, fl_first, fl_acc, version = run_flower(ds, clients, model_fn, local, args.rounds,
                                                     args.cpus)
    print(f"Flower {version} simulation (Ray, {args.cpus} CPUs, 1 per client): {fl_round:.4f} "
          f"s/round (start-up to end of round 1: {fl_first:.2f} s), final accuracy {fl_acc:.4f}")
    after, _, _ = run_fedpipe(ds, clients, model_fn, local, args.rounds)
    fp_round = max(before, after)  # measured before and after Flower; the slower is taken
    print(f"fedpipe (serial executor): {fp_round:.4f} s/round (before Flower {before:.4f}, after "
          f"{after:.4f}), final accuracy {fp_acc:.4f}")
    if args.ray_arm:
        from fedpipe.config.fl import RayConfig
        from fedpipe.fl.ray_executor import connect

        os.environ["FEDPIPE_WORKERS"] = str(args.cpus)
        connect(RayConfig(), threads=1)
        ray_round, _, ray_acc = run_fedpipe(ds, clients, model_fn, local, args.rounds, "ray")
        print(f"fedpipe (Ray executor, {args.cpus} CPUs): {ray_round:.4f} s/round, final accuracy "
              f"{ray_acc:.4f} (Flower / fedpipe-Ray: {fl_round / ray_round:.2f}x)")
    print(f"accuracy difference (Flower - fedpipe) {fl_acc - fp_acc:+.4f}")
    print(f"speedup {fl_round / fp_round:.2f}")


if __name__ == "__main__":
    main()
