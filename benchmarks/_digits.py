"""Set-up shared by the benchmarks (not a benchmark itself): the embedded digits split into
federated clients, a model factory that builds the same initial weights on every call, and a timed
FedAvg run."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fedpipe.config import dataset_config, partition_config
from fedpipe.config.fl import FLConfig, LocalTrainConfig
from fedpipe.data import ClientData, client_data, load_dataset, make_partition
from fedpipe.fl import Strategy, run_federated
from fedpipe.models import build_model
from fedpipe.tasks import ClassificationTask


def digits_clients(partition: dict[str, Any], seed: int = 0) -> tuple[Any, list[ClientData]]:
    """The digits dataset and its clients' training data under ``partition`` (a ``partition``
    config mapping, e.g. ``{"scheme": "iid", "num_clients": 20}``), drawn with ``seed``."""
    ds = load_dataset(dataset_config({"name": "digits"}))
    part = make_partition(ds.train.y.numpy(), ds.test.y.numpy(), 10, partition_config(partition), seed)
    return ds, [client_data(ds.train, part, i) for i in range(part.num_clients)]


def seeded_model_fn(ds: Any, name: str = "mlp", **kwargs: Any) -> Callable[[], nn.Module]:
    """``model_fn()`` builds model ``name`` for ``ds`` from torch seed 0: the same weights every call."""
    def model_fn() -> nn.Module:
        torch.manual_seed(0)
        return build_model(name, ds.meta.shape, 10, mean=ds.meta.mean, std=ds.meta.std, **kwargs)

    return model_fn


def timed_fedavg(executor: str, clients: list[ClientData], model_fn: Callable[[], nn.Module],
                 local: LocalTrainConfig, rounds: int, seed: int = 0) -> tuple[float, float, Any]:
    """FedAvg with every client every round on ``executor``: (wall seconds per round in the steady
    state, i.e. from the end of round 1 to the end of the last, over ``rounds - 1``; wall seconds
    until round 1 ended, start-up included; the final weights)."""
    fl = FLConfig(rounds=rounds, participation=1.0, local=local, eval_every=10**6, executor=executor)
    strategy = Strategy(ClassificationTask(), model_fn, local, num_clients=len(clients))
    ends: list[float] = []
    t0 = time.perf_counter()
    res = run_federated(strategy, model_fn(), clients, fl, seed=seed, progress=False,
                        on_round=lambda rec: ends.append(time.perf_counter()))
    return (ends[-1] - ends[0]) / (rounds - 1), ends[0] - t0, res.state.weights
