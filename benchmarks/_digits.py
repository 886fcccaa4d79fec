"""Set-up shared by the benchmarks (not a benchmark itself): the embedded digits split into
federated clients, and a model factory that builds the same initial weights on every call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fedpipe.config import dataset_config, partition_config
from fedpipe.data import ClientData, client_data, load_dataset, make_partition
from fedpipe.models import build_model


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
