"""fedpipe's client updates and server steps against numbers produced by reference implementations
(FL-bench, PFLlib, the FedDyn/FedDC authors' code, FL-Simulator, the FedSim/FedAlt authors' code,
the pFedMe authors' code, Flower, the MTT authors' code) on the same inputs.

Each fixture in tests/fixtures/equivalence/<method>.safetensors holds the inputs (initial weights
``w0.*``, client data ``data<i>.x/y``, algorithm state) and the reference's outputs (``out.*``); its
metadata names the reference (repository, commit, file, function) and how it was run; the scripts
that produced them are described in tests/fixtures/equivalence/README_flbench.md. No reference code
runs here.

Every run is float64 on the CPU with full-batch SGD, so the order in which a method visits its
samples cannot matter; the tolerance ``ATOL`` = 1e-12 allows for the summation-order rounding of a
few float64 steps (unit roundoff 1.1e-16, weights of order 1) and nothing more.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn

from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl import Payload, RoundInfo, ServerState
from fedpipe.tasks import ClassificationTask

DT = torch.float64
ATOL = 1e-12
FIXTURES = Path(__file__).parent / "fixtures" / "equivalence"


class Tiny(nn.Module):
    """The fixtures' model: body = Linear(4, 3) [+ BatchNorm1d(3)] + Tanh, head = Linear(3, 3)."""

    def __init__(self, bn: bool = False):
        super().__init__()
        layers: list[tuple[str, nn.Module]] = [("fc", nn.Linear(4, 3))]
        if bn:
            layers.append(("bn", nn.BatchNorm1d(3)))
        layers.append(("act", nn.Tanh()))
        self.body = nn.Sequential(OrderedDict(layers))
        self.head = nn.Linear(3, 3)

    def forward(self, x):
        return self.head(self.body(x))


class Fixture:
    def __init__(self, method: str):
        path = FIXTURES / f"{method}.safetensors"
        with safe_open(str(path), "pt") as f:
            self.t = {k: f.get_tensor(k) for k in f.keys()}
            self.info = json.loads(f.metadata()["info"])
        self.hyper = self.info["hyper"]

    def group(self, prefix: str) -> dict[str, torch.Tensor]:
        p = prefix + "."
        return {k[len(p):]: v for k, v in self.t.items() if k.startswith(p)}

    @property
    def w0(self) -> dict[str, torch.Tensor]:
        return self.group("w0")

    def data(self, i: int) -> ClientData:
        return ClientData(self.t[f"data{i}.x"], self.t[f"data{i}.y"])

    @property
    def num_clients(self) -> int:
        return sum(1 for k in self.t if k.startswith("data") and k.endswith(".x"))


def strategy(name: str, cfg: dict | None, fx: Fixture, *, bn: bool = False, aggregation="weighted",
             num_clients: int = 2, lr: float | None = None, steps: int | None = None):
    h = fx.hyper
    local = LocalTrainConfig(steps=steps or h["local_steps"], batch_size=1000, optimizer="sgd",
                             lr=lr or h["lr"])
    return ALGORITHMS[name](ClassificationTask(), lambda: Tiny(bn).to(DT), local,
                            algorithm_config(name, cfg), aggregation=aggregation,
                            num_clients=num_clients)


def run_client(s, payload, client_state, data, client_id):
    return s.client_update(payload, client_state, data, torch.Generator().manual_seed(0), client_id)


def rnd(updates, index: int = 0) -> RoundInfo:
    return RoundInfo(index=index, total=10, seed=0, updates=tuple(updates))


def max_diff(ours: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    """Max abs difference over the reference's entries (all of them must be ours)."""
    assert ref, "empty reference group"
    assert set(ref) <= set(ours), sorted(set(ref) - set(ours))
    return max(float((ours[k].to(DT) - ref[k].to(DT)).abs().max()) for k in ref)


def assert_matches(ours, ref, atol: float = ATOL) -> float:
    d = max_diff(ours, ref)
    assert d <= atol, f"max abs difference {d:.3e} > {atol:.0e}"
    return d


def moved(ours: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> float:
    """How far a result is from where it started: shows the compared step is not a no-op."""
    return max(float((ours[k] - start[k]).abs().max()) for k in start if start[k].is_floating_point())


def test_fixtures_name_their_reference():
    files = sorted(FIXTURES.glob("*.safetensors"))
    assert files
    for path in files:
        info = Fixture(path.stem).info
        refs = info["reference"]
        assert refs and all(len(r["commit"]) == 40 and r["repository"] and r["file"] and r["function"]
                            for r in refs), path.name
        assert info["how"] and info["hyper"], path.name


# -- FedProx (FL-bench client, Flower aggregation) ---------------------------------------------
def test_fedprox_client_and_flower_aggregation():
    fx = Fixture("fedprox")
    s = strategy("fedprox", {"mu": fx.hyper["mu"]}, fx)
    updates = []
    for i in range(fx.num_clients):
        up, _, _ = run_client(s, Payload(0, fx.w0), {}, fx.data(i), i)
        assert_matches(up.weights, fx.group(f"out.client{i}"))
        assert moved(up.weights, fx.w0) > 1e-3
        updates.append(up)
    state = s.aggregate(ServerState(weights=fx.w0), rnd(updates))
    assert_matches(state.weights, fx.group("out.server"))
