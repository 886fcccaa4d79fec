"""How a pipeline execution ended, as MLflow shows it (fedpipe.tracking, .sync, fedpipe.cli.run_stage).

- :data:`ENDINGS`: a stage that ends each way, after a stage that logged results made the
  pipeline's parent run: the next replay leaves the parent (and the stage's run) with the status
  of how it ended: FAILED for an error inside its run, before its run opened (its params or inputs
  refused) or after its run ended well; KILLED for Ctrl-C and for ``kill -9`` (no handler ran: the
  replay finds its run without an end); FINISHED only when the report ended well. Never RUNNING.
- :data:`QUIET`: no empty parent run: a stage that logged nothing but its params and tags (``plan``,
  which every ``dvc repro`` runs; ``server_data``) is recorded only under a parent run that a stage
  with results made, now or before; alone, it is removed with one log line; while a stage of its
  execution runs, it waits.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import fedpipe.tracking as tracking
from fedpipe.cli import run_stage
from fedpipe.config import ConfigError
from fedpipe.errors import InputError
from fedpipe.tracking import _db_lock, spool_dir, stage_run
from fedpipe.tracking.sync import sync_pending

REPO = Path(__file__).resolve().parents[1]
PARENT = "pipeline · workspace"


@pytest.fixture(autouse=True)
def one_stage_process(monkeypatch):
    """Each test is one stage process as far as tracking knows (the outcomes of its runs)."""
    monkeypatch.setattr(tracking, "_OUTCOME", [], raising=False)
    monkeypatch.delenv("DVC_STAGE", raising=False)


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory) -> Path:
    """An MLflow database with its schema made (3 s), copied for each test."""
    from mlflow import MlflowClient

    db = tmp_path_factory.mktemp("schema") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments(max_results=1)
    return db


@pytest.fixture
def tracked(tracked, empty_db):
    shutil.copy2(empty_db, tracked[0] / "mlflow.db")
    return tracked


def all_runs(uri: str) -> list:
    from mlflow.tracking import MlflowClient

    with _db_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name("fedpipe")
    return [] if exp is None else client.search_runs([exp.experiment_id])


def runs(uri: str) -> dict:
    found = all_runs(uri)
    names = [r.info.run_name for r in found]
    assert len(names) == len(set(names)), f"a run recorded twice: {sorted(names)}"
    return {r.info.run_name: r for r in found}


def trained(name: str = "partition@0") -> None:
    """A stage that logged results (it makes the parent run)."""
    with stage_run(name, {}, 0) as run:
        run.log_metrics({"clients": 5})


def planned() -> None:
    """``plan``: its params and tags only."""
    with stage_run("plan", {"study": {"name": "x"}}, 0) as run:
        run.log_tags({"plan.diffusion": "false"})


# -- how a stage ended ------------------------------------------------------------------------------
def as_stage(main: Callable[[], None], monkeypatch, stage: str = "federate@fedavg-0") -> int:
    """``main`` run as DVC runs a stage script (fedpipe.cli.run_stage, DVC_STAGE set); its exit code."""
    monkeypatch.setenv("DVC_STAGE", stage)
    with pytest.raises(SystemExit) as exit_:
        run_stage(main)
    return exit_.value.code


def input_error(tmp: Path, monkeypatch, *, in_its_run: bool) -> None:
    """A stage that logged a round, then an InputError: in its run (an input found truncated) or
    after its run ended well (an output it cannot write)."""
    def main():
        with stage_run("federate@fedavg-0", {}, 0) as run:
            run.log_round({"round": 1, "train_loss": 0.5})
            if in_its_run:
                raise InputError(tmp / "x.safetensors", "truncated", None)
        raise InputError(tmp / "out.json", "cannot be written", None)

    assert as_stage(main, monkeypatch) == 2


failed_in_its_run = functools.partial(input_error, in_its_run=True)
failed_after_its_run = functools.partial(input_error, in_its_run=False)


def failed_before_its_run(tmp: Path, monkeypatch) -> None:
    def main():  # the stage's config check, before it opens its run
        raise ConfigError("fl.rounds", "abc", "an integer >= 1")

    assert as_stage(main, monkeypatch) == 2


def crashed_before_its_run(tmp: Path, monkeypatch) -> None:
    def main():  # a bug: a traceback, but the parent still shows it
        raise ZeroDivisionError("division by zero")

    monkeypatch.setenv("DVC_STAGE", "federate@fedavg-0")
    with pytest.raises(ZeroDivisionError):
        run_stage(main)


def ctrl_c_before_its_run(tmp: Path, monkeypatch) -> None:
    def main():
        raise KeyboardInterrupt

    assert as_stage(main, monkeypatch) == 130


KILLED_STAGE = """
import sys, time
from fedpipe.tracking import stage_run
with stage_run("federate@fedavg-0", {}, 0) as run:
    run.log_round({"round": 1, "train_loss": 0.25})
    print("trained", flush=True)
    time.sleep(600)
"""


def killed_by_sigkill(tmp: Path, monkeypatch) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_STAGE], cwd=tmp, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == "trained", proc.stderr.read()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def ended_well(tmp: Path, monkeypatch) -> None:
    def main():
        with stage_run("federate@fedavg-0", {}, 0) as run:
            run.log_round({"round": 1, "train_loss": 0.5})
        with stage_run("report", {}, 0) as run:
            run.log_metrics({"claims.held": 1})
            run.finish_parent()

    monkeypatch.setenv("DVC_STAGE", "report")
    run_stage(main)


ENDINGS = {  # name: (the stage's ending, its run's status, the parent's)
    "failed in its run": (failed_in_its_run, "FAILED", "FAILED"),
    "failed before its run (config check)": (failed_before_its_run, "FAILED", "FAILED"),
    "failed after its run ended well": (failed_after_its_run, "FAILED", "FAILED"),
    "crashed before its run (a bug)": (crashed_before_its_run, "FAILED", "FAILED"),
    "Ctrl-C before its run": (ctrl_c_before_its_run, "KILLED", "KILLED"),
    "kill -9 in its run": (killed_by_sigkill, "KILLED", "KILLED"),
    "ended well, then the report": (ended_well, "FINISHED", "FINISHED"),
}


@pytest.mark.parametrize("name", ENDINGS)
def test_the_parent_run_ends_as_the_pipeline_did_however_a_stage_ended(name, tracked, monkeypatch):
    tmp, uri = tracked
    ending, stage_status, parent_status = ENDINGS[name]
    trained()
    assert sync_pending() == 1
    assert runs(uri)[PARENT].info.status == "FINISHED"  # made by a stage with results
    ending(tmp, monkeypatch)
    sync_pending()  # the next replay (a report's, make ui's)
    every = all_runs(uri)
    found = {r.info.run_name: r for r in every}
    stage_runs = [r for r in every if r.info.run_name.startswith("federate@fedavg-0")]
    statuses = sorted(r.info.status for r in stage_runs)
    if name == "failed after its run ended well":  # its run, and the failure after it
        assert statuses == ["FAILED", "FINISHED"]
        failure = next(r for r in stage_runs if r.info.status == "FAILED")
        assert failure.data.tags["fedpipe.error"].startswith("InputError: ")
    else:
        assert statuses == [stage_status], statuses
    if name.startswith(("failed before", "crashed")):  # the run made for the failure says why
        assert stage_runs[0].data.tags["fedpipe.error"].startswith(
            ("ConfigError: ", "ZeroDivisionError: "))
        assert stage_runs[0].data.tags["mlflow.parentRunId"] == found[PARENT].info.run_id
    assert found[PARENT].info.status == parent_status
    assert "RUNNING" not in {r.info.status for r in every}
    assert not list(spool_dir().glob("*.jsonl"))


def test_a_killed_stages_run_ends_when_it_was_last_heard_of(tracked):
    tmp, uri = tracked
    killed_by_sigkill(tmp, None)
    time.sleep(1.5)  # the replay happens later than the stage's last event
    before = int(time.time() * 1000)
    assert sync_pending() == 1
    run = runs(uri)["federate@fedavg-0 · workspace"]
    assert run.info.status == "KILLED" and run.info.end_time < before


def test_a_stage_failure_is_recorded_once_and_never_with_tracking_off(tracked, monkeypatch):
    tmp, uri = tracked
    failed_in_its_run(tmp, monkeypatch)  # its run recorded the failure: no second run for it
    assert [r.info.status for n, r in runs(uri).items() if n != PARENT] == ["FAILED"]
    monkeypatch.setattr(tracking, "_OUTCOME", [], raising=False)
    monkeypatch.setenv("FEDPIPE_TRACKING", "off")
    failed_before_its_run(tmp, monkeypatch)
    assert len(runs(uri)) == 2 and not list(spool_dir().glob("*.jsonl"))


# -- no empty parent runs ---------------------------------------------------------------------------
def plan_alone(tmp: Path) -> None:
    planned()


def plan_and_server_data(tmp: Path) -> None:
    planned()
    with stage_run("server_data@0", {}, 0, inputs={"data/aux.safetensors": "abc"}) as run:
        run.log_tags({"server_data.aux": "fedptr"})


def plan_then_training(tmp: Path) -> None:
    planned()
    trained("federate@fedavg-0")


def plan_after_a_sync_made_the_parent(tmp: Path) -> None:
    trained("federate@fedavg-0")
    assert sync_pending() == 1
    planned()


def plan_that_failed(tmp: Path) -> None:
    with pytest.raises(ConfigError):
        with stage_run("plan", {}, 0):
            raise ConfigError("study", "x", "a study")


QUIET = {  # name: (the stages, the runs recorded; the parent's status if any)
    "plan alone": (plan_alone, set(), None),
    "plan and server data (tags only)": (plan_and_server_data, set(), None),
    "plan, then a training stage": (plan_then_training,
                                    {"plan · workspace", "federate@fedavg-0 · workspace"},
                                    "FINISHED"),
    "plan after a sync made the parent": (plan_after_a_sync_made_the_parent,
                                          {"plan · workspace", "federate@fedavg-0 · workspace"},
                                          "FINISHED"),
    "plan that failed": (plan_that_failed, {"plan · workspace"}, "FAILED"),
}


@pytest.mark.parametrize("name", QUIET)
def test_no_parent_run_for_an_execution_that_logged_nothing(name, tracked, caplog):
    tmp, uri = tracked
    stages, want, parent = QUIET[name]
    stages(tmp)
    with caplog.at_level(logging.INFO, logger="fedpipe.tracking.sync"):
        sync_pending()
    found = runs(uri)
    assert set(found) - {PARENT} == want
    if parent is None:
        assert PARENT not in found
        dropped = [r.getMessage() for r in caplog.records if "not recorded" in r.getMessage()]
        assert len(dropped) == len([n for n in ("plan", "server_data") if n in name.replace(" ", "_")
                                    or n == "plan"])
        assert "plan · workspace logged nothing but its params and tags" in dropped[0]
    else:
        assert found[PARENT].info.status == parent
        for r in found.values():
            if r.info.run_name != PARENT:
                assert r.data.tags["mlflow.parentRunId"] == found[PARENT].info.run_id
    assert not list(spool_dir().glob("*.jsonl"))  # recorded or removed, none left behind


LIVE_STAGE = """
import time
from pathlib import Path
from fedpipe.tracking import stage_run
with stage_run("federate@fedavg-0", {}, 0) as run:
    print("started", flush=True)
    while not Path("go").exists():
        time.sleep(0.1)
    run.log_round({"round": 1, "train_loss": 0.25})
"""


def test_a_quiet_stage_waits_while_a_stage_of_its_execution_runs(tracked):
    tmp, uri = tracked
    planned()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen([sys.executable, "-c", LIVE_STAGE], cwd=tmp, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == "started", proc.stderr.read()
        assert sync_pending() == 0  # the plan waits: its execution may still log results
        assert len(list(spool_dir().glob("*.jsonl"))) == 2
        (tmp / "go").touch()
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
    assert sync_pending() == 2
    assert set(runs(uri)) == {PARENT, "plan · workspace", "federate@fedavg-0 · workspace"}
