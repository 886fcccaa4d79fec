"""Divergence is a failure (``fl.divergence_factor``, :func:`fedpipe.fl.engine.guard_growth`): a run
whose local loss grows past the factor times its initial loss (the initial model's, on round 1's
clients) stops with one line naming the round, the client and the settings, as a non-finite loss
does, with the serial and the batched executor alike, and after a resume at the same round; a
healthy run never comes near the bound; a bad factor is a ConfigError naming the key.

Tables: :data:`RUNS` (whole runs on digits), :data:`GUARD` (the guard on hand-made losses),
:data:`FIRST` (the fallback scale) and :data:`FACTORS` (the setting's values).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import pytest
import torch

from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.config import ConfigError, dataset_config, partition_config
from fedpipe.config.fl import FLConfig, LocalTrainConfig, fl_config
from fedpipe.data import ClientData, load_dataset, make_partition
from fedpipe.errors import DivergenceError
from fedpipe.fl import run_federated
from fedpipe.fl.engine import Scale, first_loss, guard_growth
from fedpipe.fl.state import ClientUpdate
from fedpipe.models import build_model
from fedpipe.tasks import ClassificationTask

NUM_CLIENTS = 6


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset(dataset_config({"name": "digits"}))
    part = make_partition(ds.train.y.numpy(), ds.test.y.numpy(), 10,
                          partition_config({"scheme": "shards", "num_clients": NUM_CLIENTS,
                                            "shards_per_client": 2}), 0)
    return ds, [ClientData(ds.train.x[torch.from_numpy(i)], ds.train.y[torch.from_numpy(i)])
                for i in part.train]


def mlp(ds):
    """The default study's model (an MLP with 200 hidden units), the same weights every call."""
    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        return build_model("mlp", tuple(ds.train.x.shape[1:]), 10, hidden=200)
    return make


@dataclass(frozen=True)
class RunCase:
    """FedAvg on digits (6 shard clients, half of them per round, 2 local epochs of SGD)."""

    lr: float
    executor: str
    want_round: int | None  # the round named by the divergence, None: the run ends well
    factor: float = 1.0e4
    rounds: int = 3


RUNS = {
    # the example, SGD lr 3: from 2.3 to ~1e8 within round 1 and ~7e9 in round 2, then
    # chance (a 4-client federation falls back to 1.4 after round 1: only the initial loss tells)
    "lr 3, serial": RunCase(3.0, "serial", want_round=1),
    "lr 3, batched": RunCase(3.0, "batched", want_round=1),
    "lr 0.05 (the default), serial": RunCase(0.05, "serial", want_round=None),
    "lr 0.05 (the default), batched": RunCase(0.05, "batched", want_round=None),
    # the bound is the setting's: at lr 2 the largest local loss is 37 times the initial loss in
    # round 1 and 165 times in round 2, under the default bound and past a bound of 100
    "lr 2, default factor": RunCase(2.0, "serial", want_round=None),
    "lr 2, factor 100, serial": RunCase(2.0, "serial", want_round=2, factor=100.0),
    "lr 2, factor 100, batched": RunCase(2.0, "batched", want_round=2, factor=100.0),
}


def run_case(case: RunCase, digits, **kw):
    ds, clients = digits
    local = LocalTrainConfig(epochs=2, batch_size=32, lr=case.lr)
    fl = FLConfig(rounds=case.rounds, participation=0.5, local=local, executor=case.executor,
                  divergence_factor=case.factor)
    strategy = ALGORITHMS["fedavg"](ClassificationTask(), mlp(ds), local,
                                    algorithm_config("fedavg", {}), num_clients=NUM_CLIENTS)
    return run_federated(strategy, mlp(ds)(), clients, fl, 0, progress=False, **kw)


@pytest.mark.parametrize("name", RUNS)
def test_a_run_past_the_bound_stops_naming_round_client_and_settings(name, digits, caplog):
    case = RUNS[name]
    with caplog.at_level(logging.WARNING, logger="fedpipe.fl.batched"):
        if case.want_round is None:
            res = run_case(case, digits)
            assert res.rounds_done == case.rounds
        else:
            with pytest.raises(DivergenceError) as info:
                run_case(case, digits)
    assert not caplog.records  # the batched executor batched (no fallback to serial)
    if case.want_round is None:
        return
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"diverged: round {case.want_round}, client ")
    assert (f"fl.divergence_factor={case.factor:g} times the initial model's loss on round 1's "
            "clients (2.3") in msg
    assert f"fl.local.lr={case.lr}" in msg and "algorithms.fedavg" in msg


def test_a_resumed_run_stops_at_the_same_round_with_the_same_line(digits, tmp_path):
    """The scale is kept in the checkpoint, so a run resumed after round 1 stops where the
    uninterrupted one does (round 2), with the same line."""
    case = RUNS["lr 2, factor 100, serial"]
    with pytest.raises(DivergenceError) as whole:
        run_case(case, digits)
    first = run_case(case, digits, checkpoint_dir=tmp_path, fingerprint="f", stop_after=1)
    assert first.rounds_done == 1
    with pytest.raises(DivergenceError) as resumed:
        run_case(case, digits, checkpoint_dir=tmp_path, fingerprint="f")
    assert str(resumed.value) == str(whole.value)


# -- the guard on hand-made losses ------------------------------------------------------------------
def updates(*losses: float) -> tuple[ClientUpdate, ...]:
    return tuple(ClientUpdate(client_id=c, num_samples=1, weights={}, metrics={"loss": v})
                 for c, v in enumerate(losses))


GUARD = {  # name: (scale, the clients' losses, factor, client named or None)
    "within the bound": (2.0, (1.0, 19_999.0), 1e4, None),
    "at the bound exactly": (2.0, (20_000.0,), 1e4, None),
    "past it: the largest loss is named": (2.0, (3.0, 20_001.0, 5e4), 1e4, 2),
    "a negative loss grown in magnitude": (0.5, (-6000.0, 0.1), 1e4, 0),
    "a negative scale": (-0.5, (0.1, 6000.0), 1e4, 1),
    "no scale (nothing measured)": (None, (1e30,), 1e4, None),
    "no client trained (a server-only round)": (2.0, (), 1e4, None),
}


@pytest.mark.parametrize("name", GUARD)
def test_the_guard_compares_each_clients_loss_with_the_bound(name):
    loss, losses, factor, culprit = GUARD[name]
    scale = None if loss is None else Scale(loss, "the initial model's loss")
    if culprit is None:
        guard_growth(updates(*losses), 4, scale, factor, "settings in play: x=1", "diffusion_fl")
        return
    with pytest.raises(DivergenceError) as info:
        guard_growth(updates(*losses), 4, scale, factor, "settings in play: x=1", "diffusion_fl")
    msg = str(info.value)
    assert msg.startswith(f"diverged: round 5, client {culprit}: local loss ")
    assert f"diffusion_fl.divergence_factor={factor:g} times the initial model's loss" in msg
    assert msg.endswith("x=1")


FIRST = {  # name: (history, the fallback scale where no initial loss was kept)
    "round 1": ([{"round": 1.0, "train_loss": 2.5}, {"round": 2.0, "train_loss": 9.0}],
                Scale(2.5, "the first training loss, round 1")),
    "after rounds without clients": ([{"round": 1.0}, {"round": 2.0, "train_loss": 3.0}],
                                     Scale(3.0, "the first training loss, round 2")),
    "a zero loss is no scale": ([{"round": 1.0, "train_loss": 0.0},
                                 {"round": 2.0, "train_loss": 1.0}],
                                Scale(1.0, "the first training loss, round 2")),
    "none yet": ([], None),
}


@pytest.mark.parametrize("name", FIRST)
def test_the_fallback_scale_is_the_first_recorded_loss(name):
    history, want = FIRST[name]
    assert first_loss(history) == want


def test_the_scale_is_the_initial_loss_measured_on_one_batch_per_client(digits):
    """Round 1's clients each report the initial model's loss on their first ``batch_size``
    samples: ln(10) for a model that starts near uniform, whatever the data size."""
    from fedpipe.fl.engine import initial_scale
    from fedpipe.fl.executors import SerialExecutor

    ds, clients = digits
    local = LocalTrainConfig(batch_size=16, lr=0.05)
    strategy = ALGORITHMS["fedavg"](ClassificationTask(), mlp(ds), local,
                                    algorithm_config("fedavg", {}), num_clients=NUM_CLIENTS)
    state = strategy.init_server(mlp(ds)())
    jobs = [(c, {}, clients[c]) for c in (1, 4)]
    seen = []

    class Spy(SerialExecutor):
        def probe(self, strategy, payloads, jobs, seed):
            seen.extend(len(d) for _, _, d in jobs)
            return super().probe(strategy, payloads, jobs, seed)

    scale = initial_scale(strategy, Spy(), {c: strategy.payload(state, 0, c) for c, _, _ in jobs},
                          jobs, 0)
    assert seen == [16, 16]
    assert scale.loss == pytest.approx(math.log(10), rel=0.05)
    assert initial_scale(strategy, Spy(), {}, [], 0) is None


# -- the setting ------------------------------------------------------------------------------------
FACTORS = [  # (value, accepted): a list, since 1, 1.0 and True are one key of a dict
    (1.0e4, True), (2, True), (1.5, True), (1e300, True),
    (1, False), (1.0, False), (0.5, False), (0, False), (-10.0, False), (math.inf, False),
    (math.nan, False), ("1e4", False), (True, False), (None, False),
]


@pytest.mark.parametrize("value, accepted", FACTORS, ids=[repr(v) for v, _ in FACTORS])
@pytest.mark.parametrize("section", ["fl", "diffusion_fl"])
def test_a_bad_factor_is_one_config_error_naming_the_key(value, accepted, section):
    if accepted:
        assert fl_config({"divergence_factor": value}, section).divergence_factor == float(value)
        return
    with pytest.raises(ConfigError) as info:
        fl_config({"divergence_factor": value}, section)
    assert info.value.key == f"{section}.divergence_factor"
    assert "\n" not in str(info.value)


def test_the_default_is_the_documented_one_and_conf_states_it(repo_root):
    import yaml

    conf = yaml.safe_load((repo_root / "conf" / "fl" / "default.yaml").read_text())
    assert fl_config(conf).divergence_factor == FLConfig().divergence_factor == 1.0e4
