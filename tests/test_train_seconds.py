"""The model's whole training time across resumes (fedpipe.fl.engine.SECONDS_FILE).

A run killed and resumed reports, with each round's record to ``on_round`` (the stages' MLflow
runs) and in ``RunResult.train_seconds_total``, the sum of its processes' training seconds, kept
beside the checkpoint (not in its hashed state, not a DVC output); the history, which reaches DVC's
outputs, holds no time. Table :data:`RESUMES`: how the earlier processes' seconds are counted, on a
clock that advances 10 s per reading.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from fakes import digits_clients, tiny_digits_model

import fedpipe.fl.engine as engine
from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.config.fl import FLConfig, LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl import run_federated
from fedpipe.fl.engine import SECONDS_FILE
from fedpipe.tasks import ClassificationTask

ROUNDS, KILLED_IN = 5, 3  # killed at the end of round 3, before its checkpoint: resumes at 2
TICK = 10.0


@pytest.fixture(scope="module")
def clients() -> list[ClientData]:
    return digits_clients(3, 40)


@pytest.fixture(autouse=True)
def clock(monkeypatch):
    """The engine's perf_counter advances TICK seconds per reading (its checkpoint timer stays)."""
    ticks = iter(range(1, 10_000))
    monkeypatch.setattr(engine, "time", SimpleNamespace(
        perf_counter=lambda: next(ticks) * TICK, monotonic=time.monotonic))


class Killed(BaseException):
    pass


def run(clients, ckpt: Path | None, records: list[dict], kill: bool = False,
        fingerprint: str = "f"):
    local = LocalTrainConfig(epochs=1, batch_size=20, lr=0.1)
    fl = FLConfig(rounds=ROUNDS, local=local, checkpoint_every=1)
    strategy = ALGORITHMS["fedavg"](ClassificationTask(), tiny_digits_model, local,
                                    algorithm_config("fedavg", {}), num_clients=len(clients))

    def on_round(record: dict) -> None:
        records.append(record)
        if kill and record["round"] == KILLED_IN:
            raise Killed

    return run_federated(strategy, tiny_digits_model(), clients, fl, 0, progress=False,
                         checkpoint_dir=ckpt, fingerprint=fingerprint, on_round=on_round)


def killed_once(clients, ckpt: Path) -> list[float]:
    """Killed in round 3 after 3 rounds (30 s), resumed at round 2 for 3 rounds (30 s)."""
    with pytest.raises(Killed):
        run(clients, ckpt, [], kill=True)
    return [30.0, 30.0]


def killed_twice(clients, ckpt: Path) -> list[float]:
    killed_once(clients, ckpt)
    (ckpt / "server.safetensors").unlink()  # the resumed process's checkpoint lost: a fresh run
    with pytest.raises(Killed):
        run(clients, ckpt, [], kill=True)
    return [30.0, 30.0]


def side_file_of_another_run(clients, ckpt: Path) -> list[float]:
    killed_once(clients, ckpt)
    data = json.loads((ckpt / SECONDS_FILE).read_text())
    (ckpt / SECONDS_FILE).write_text(json.dumps({**data, "fingerprint": "other"}))
    return [30.0]  # the earlier seconds are not this run's: only the resumed process counts


def side_file_garbled(clients, ckpt: Path) -> list[float]:
    killed_once(clients, ckpt)
    (ckpt / SECONDS_FILE).write_text('{"processes": [30, ')
    return [30.0]


def side_file_missing(clients, ckpt: Path) -> list[float]:
    killed_once(clients, ckpt)
    (ckpt / SECONDS_FILE).unlink()
    return [30.0]


def never_killed(clients, ckpt: Path) -> list[float]:
    return [50.0]


RESUMES: dict[str, Callable[..., list[float]]] = {
    "never killed": never_killed,
    "killed once": killed_once,
    "killed, then its resume lost": killed_twice,
    "side file of another run": side_file_of_another_run,
    "side file garbled": side_file_garbled,
    "side file missing": side_file_missing,
}


@pytest.mark.parametrize("name", RESUMES)
def test_a_resumed_run_reports_its_processes_training_seconds(name, clients, tmp_path):
    ckpt = tmp_path / "ckpt"
    processes = RESUMES[name](clients, ckpt)
    records: list[dict] = []
    result = run(clients, ckpt, records)
    assert result.train_seconds_total == sum(processes)
    assert records[-1]["round"] == ROUNDS
    assert records[-1]["train_seconds_total"] == sum(processes)  # MLflow's last value
    assert json.loads((ckpt / SECONDS_FILE).read_text())["processes"] == processes
    steps = [r["train_seconds_total"] for r in records]
    assert steps == sorted(steps)  # a running total, round by round
    assert all("train_seconds_total" not in h for h in result.history)  # never into DVC's outputs


def test_the_history_is_the_same_with_and_without_resumes(clients, tmp_path):
    """The seconds differ between a resumed and an uninterrupted run; what DVC hashes does not."""
    straight = run(clients, tmp_path / "a", [])
    killed_once(clients, tmp_path / "b")
    resumed = run(clients, tmp_path / "b", [])
    assert resumed.resumed_from == KILLED_IN - 1
    assert resumed.history == straight.history
    assert resumed.train_seconds_total == 60.0 and straight.train_seconds_total == 50.0


def test_without_a_checkpoint_folder_the_seconds_are_the_process_own(clients):
    records: list[dict] = []
    assert run(clients, None, records).train_seconds_total == 50.0
    assert [r["train_seconds_total"] for r in records] == [10.0, 20.0, 30.0, 40.0, 50.0]
