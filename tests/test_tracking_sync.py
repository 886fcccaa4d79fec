"""Spooled tracking (fedpipe.tracking.sync): a stage process never imports MLflow; replaying a spool
file twice changes nothing; two syncs at once replay each file once; a long stage's follower shows
its metrics before the stage ends; a killed stage's run ends KILLED."""

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fedpipe.tracking import _db_lock, spool_dir, stage_run
from fedpipe.tracking.sync import sync_pending

REPO = Path(__file__).resolve().parents[1]


def env_for(uri: str, **extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), "FEDPIPE_TRACKING": "on",
            "MLFLOW_TRACKING_URI": uri, "DVC_EXP_NAME": "", **extra}


def runs_by_name(uri: str) -> dict:
    from mlflow.tracking import MlflowClient

    with _db_lock(uri):  # a follower may be making the schema: never both at once
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name("fedpipe")
    runs = client.search_runs([exp.experiment_id])
    names = [r.info.run_name for r in runs]
    assert len(names) == len(set(names)), f"a run replayed twice: {sorted(names)}"
    return {r.info.run_name: r for r in runs}


def history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    return [(m.step, m.value) for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, key)]


def test_a_stage_process_does_not_import_mlflow(tmp_path):
    """Every stage script's imports, then a whole tracked run (params, rounds, tags, artifact,
    parent metrics): MLflow is never imported; its events wait in the spool."""
    (tmp_path / "params.yaml").write_text("seed: 0\n")
    code = textwrap.dedent(f"""
        import runpy, sys
        from pathlib import Path
        for script in sorted(Path({str(REPO / 'stages')!r}).glob("*.py")):
            runpy.run_path(str(script), run_name="imported")  # its imports, not its main()
        from fedpipe.tracking import stage_run
        with stage_run("federate@fedavg-0", {{"fl": {{"rounds": 2}}}}, 0) as run:
            run.log_round({{"round": 1, "clients": 2, "train_loss": 0.5}})
            run.log_tags({{"a": 1}})
            Path("c.png").write_bytes(b"png")
            run.log_artifact("c.png", "plots")
            run.log_parent_metrics({{"claims.held": 1}})
        print(sorted(m for m in sys.modules if m.split(".")[0] == "mlflow"))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env=env_for(f"sqlite:///{tmp_path / 'mlflow.db'}"), timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert len(list((tmp_path / "mlspool").glob("*.jsonl"))) == 1
    assert not (tmp_path / "mlflow.db").exists()  # nothing touched the database


def test_replaying_a_spool_file_again_changes_nothing(tracked):
    tmp_path, uri = tracked
    with stage_run("federate@fedprox-1", {"seed": 0}, 0) as run:
        for r in (1, 2, 3):
            run.log_round({"round": r, "clients": 5, "train_loss": 1.0 / r})
        run.log_final({"test_accuracy": 0.75})
        (tmp_path / "curve.png").write_bytes(b"png")
        run.log_artifact(tmp_path / "curve.png", "plots")
        run.log_parent_metrics({"claims.held": 2})
    spool = spool_dir()
    keep = tmp_path / "kept"
    shutil.copytree(spool, keep)
    assert sync_pending() == 1
    assert not list(spool.iterdir())  # replayed: the file and its copies removed
    first = runs_by_name(uri)
    fed = first["federate@fedprox-1 · workspace"]
    assert history(uri, fed.info.run_id, "train_loss") == [(1, 1.0), (2, 0.5), (3, 1 / 3)]
    shutil.rmtree(spool)
    shutil.copytree(keep, spool)  # the same file once more (a sync killed after its last write)
    assert sync_pending() == 1
    again = runs_by_name(uri)
    assert set(again) == set(first) == {"federate@fedprox-1 · workspace", "pipeline · workspace"}
    fed2 = again["federate@fedprox-1 · workspace"]
    assert fed2.info.run_id == fed.info.run_id
    assert history(uri, fed.info.run_id, "train_loss") == [(1, 1.0), (2, 0.5), (3, 1 / 3)]
    assert history(uri, fed.info.run_id, "final_test_accuracy") == [(0, 0.75)]
    parent = again["pipeline · workspace"]
    assert history(uri, parent.info.run_id, "claims.held") == [(0, 2.0)]
    from mlflow.tracking import MlflowClient

    arts = MlflowClient(tracking_uri=uri).list_artifacts(fed.info.run_id, "plots")
    assert [a.path for a in arts] == ["plots/curve.png"]
    assert fed2.info.status == "FINISHED" and fed2.data.params == fed.data.params


def test_two_syncs_at_once_replay_each_file_once(tracked):
    tmp_path, uri = tracked
    n = 6
    for i in range(n):
        with stage_run(f"federate@fedavg-{i}", {}, i) as run:
            run.log_round({"round": 1, "train_loss": float(i)})
    procs = [subprocess.Popen([sys.executable, "-m", "fedpipe.tracking.sync"], cwd=tmp_path,
                              env=env_for(uri), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    counts = []
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        counts.append(int(err.split("synced ")[1].split()[0]))
    assert sum(counts) == n, counts  # each file replayed by exactly one of them
    runs = runs_by_name(uri)
    assert len(runs) == n + 1  # the stage runs and their one parent
    for i in range(n):
        run = runs[f"federate@fedavg-{i} · workspace"]
        assert history(uri, run.info.run_id, "train_loss") == [(1, float(i))]
    assert not list(spool_dir().glob("*"))


FOLLOWED = """
import sys, time
from pathlib import Path
from fedpipe.tracking import stage_run
with stage_run("federate@fedavg-0", {}, 0) as run:
    run.log_round({"round": 1, "train_loss": 0.25})
    while not Path("go").exists():  # the test says when the stage may end
        time.sleep(0.2)
    run.log_round({"round": 2, "train_loss": 0.125})
"""


def test_a_long_stages_follower_shows_its_metrics_before_it_ends(tracked):
    tmp_path, uri = tracked
    stage = subprocess.Popen([sys.executable, "-c", FOLLOWED], cwd=tmp_path,
                             env=env_for(uri, FEDPIPE_TRACKING_FOLLOW="0.5"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300  # the follower imports MLflow and makes the database
        while True:
            if (tmp_path / "mlflow.db").exists():
                try:
                    run = runs_by_name(uri).get("federate@fedavg-0 · workspace")
                except AttributeError:  # no experiment yet
                    run = None
                if run is not None and "train_loss" in run.data.metrics:
                    break
            assert stage.poll() is None, stage.communicate()[1]
            assert time.monotonic() < deadline, "no metric shown while the stage ran"
            time.sleep(0.5)
        assert run.info.status == "RUNNING"
        assert history(uri, run.info.run_id, "train_loss") == [(1, 0.25)]
        assert stage.poll() is None  # shown before the stage ended
    finally:
        (tmp_path / "go").write_text("")
        _, err = stage.communicate(timeout=300)
    assert stage.returncode == 0, err
    deadline = time.monotonic() + 120
    while list(spool_dir().glob("*.jsonl")):  # the follower reads on to the end event
        assert time.monotonic() < deadline, "the follower did not finish the file"
        time.sleep(0.5)
    run = runs_by_name(uri)["federate@fedavg-0 · workspace"]
    assert run.info.status == "FINISHED"
    assert history(uri, run.info.run_id, "train_loss") == [(1, 0.25), (2, 0.125)]
    assert sync_pending() == 0  # nothing left for the report


def test_a_killed_stage_is_replayed_as_killed_and_a_live_one_is_left_alone(tracked):
    tmp_path, uri = tracked
    stage = subprocess.Popen([sys.executable, "-c", FOLLOWED], cwd=tmp_path, env=env_for(uri),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while '"train_loss"' not in "".join(p.read_text() for p in spool_dir().glob("*.jsonl")):
            assert stage.poll() is None, stage.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert sync_pending() == 0  # its stage still runs: left to it
    finally:
        stage.kill()
        stage.communicate(timeout=60)
    assert sync_pending() == 1
    run = runs_by_name(uri)["federate@fedavg-0 · workspace"]
    assert run.info.status == "KILLED"
    assert history(uri, run.info.run_id, "train_loss") == [(1, 0.25)]


def test_a_bad_follow_setting_stops_the_stage_naming_it(tracked, monkeypatch):
    from fedpipe.config import ConfigError

    for bad in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv("FEDPIPE_TRACKING_FOLLOW", bad)
        with pytest.raises(ConfigError, match="FEDPIPE_TRACKING_FOLLOW"):
            with stage_run("plan", {}, 0):
                pytest.fail("the stage ran")
    assert not spool_dir().exists() or not list(spool_dir().glob("*.jsonl"))
