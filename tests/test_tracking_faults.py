"""Tracking can fail; the pipeline cannot, and no run is lost (fedpipe.tracking.sync, .ui).

- :data:`KILLS`: the replay killed at every MLflow call it makes (before the call reaches the store,
  and after it did), then run again, leaves the database equal to an undisturbed replay: the same
  runs, params, metrics, tags, statuses and artifacts. ``make test`` runs a fixed sample of the
  calls (:data:`SAMPLED`, every kind of call among them); the marker ``exhaustive`` runs the rest.
- :data:`DAMAGES`: a spool file damaged each way is set aside into ``mlspool/failed/`` with one log
  line naming it, never counted as replayed and never deleted, and the files around it are
  replayed; a file cut at a line's end (a killed stage) is replayed as KILLED.
- :data:`NAMES`: DVC experiment names that a filter string cannot hold (``lr'0.04``) replay, replay
  again onto the same runs, and never reach a filter string.
- :data:`STORES`: the sync command and ``make ui`` on a garbage, truncated or read-only
  ``mlflow.db``: one line naming the file and what to do, a non-zero exit, no traceback, the spool
  kept; a stage's sync (the report's) warns in one line and goes on.

The MLflow schema is made once per module (3 s) and copied for each case.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from fedpipe.tracking import stage_run
from fedpipe.tracking.sync import FAILED_DIR, pending, sync_pending

REPO = Path(__file__).resolve().parents[1]


# -- a short pipeline's spool, and databases made from one template ---------------------------------
def write_spool(folder: Path, exp_name: str = "") -> list[Path]:
    """Spool files of three stages, as ``stage_run`` writes them in ``folder`` (the database's):
    a training stage (params, input hashes, rounds, final metrics, a plot; it sets the parent
    FAILED), an evaluation (metrics, a table), and the report (parent metrics and artifact, the
    parent FINISHED). Returns them, oldest first."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        (folder / "params.yaml").write_text("seed: 0\nstudy: {name: faults}\n")
        mp.setenv("FEDPIPE_TRACKING", "on")
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{folder / 'mlflow.db'}")
        mp.setenv("DVC_EXP_NAME", exp_name)
        mp.setenv("FEDPIPE_TRACKING_FOLLOW", "off")
        with stage_run("federate@fedavg-0", {"fl": {"rounds": 3, "local": {"lr": 0.05}}}, 0,
                       inputs={"data/partition.safetensors": "0123abcd"}) as run:
            for r in (1, 2, 3):
                run.log_round({"round": r, "clients": 5, "train_loss": 1.0 / r,
                               "test_accuracy": 0.5 + r / 10})
            run.log_final({"test_accuracy": 0.8})
            (folder / "curve.png").write_bytes(b"png")
            run.log_artifact(folder / "curve.png", "plots")
            run.log_tags({"fid.extractor": "inception"})
            run.finish_parent("FAILED")
        with stage_run("evaluate", {"study": {"seeds": [0]}}, 0) as run:
            run.log_metrics({"fedavg.mean": 0.8, "fedavg.std": 0.0})
            (folder / "table.csv").write_text("algorithm,acc\nfedavg,0.8\n")
            run.log_artifact(folder / "table.csv", "tables")
        with stage_run("report", {"seed": 0}, 0) as run:
            run.log_metrics({"claims/x/held": 1.0})
            (folder / "claims.md").write_text("| claim | held |\n")
            run.log_parent_artifact(folder / "claims.md", "claims")
            run.log_parent_metrics({"claims.held": 1, "claims.claims": 1})
            run.finish_parent()
    return pending(folder / "mlspool")


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A folder holding an empty MLflow database (its schema made) and the pipeline's spool."""
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("template")
    MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}").search_experiments(max_results=1)
    write_spool(root)
    return root


def workspace(template: Path, into: Path) -> str:
    """A copy of the template's database and spool in ``into``; its tracking URI."""
    into.mkdir(parents=True, exist_ok=True)
    shutil.copy2(template / "mlflow.db", into / "mlflow.db")
    shutil.copytree(template / "mlspool", into / "mlspool")
    return f"sqlite:///{into / 'mlflow.db'}"


@pytest.fixture(autouse=True)
def tracking_on(monkeypatch):
    monkeypatch.setenv("FEDPIPE_TRACKING", "on")
    monkeypatch.setenv("FEDPIPE_TRACKING_FOLLOW", "off")


# -- the database's content, comparable across copies ----------------------------------------------
WALL_CLOCK = {"creation_time", "last_update_time"}  # MLflow's own clock, not the spool's times
LOCATIONS = {"run_uuid", "artifact_uri", "artifact_location", "experiment_id"}


def db_state(db: Path) -> dict[str, list]:
    """Every row of MLflow's run tables, runs named by their name instead of their id, the
    database's folder written ``<root>``; and every artifact file by run name and path."""
    con = sqlite3.connect(db)
    try:
        names = dict(con.execute("SELECT run_uuid, name FROM runs").fetchall())

        def norm(v):
            return names.get(v, v).replace(str(db.parent), "<root>") if isinstance(v, str) else v

        state: dict[str, list] = {}
        for table in ("experiments", "experiment_tags", "runs", "params", "tags", "metrics",
                      "latest_metrics"):
            cur = con.execute(f"SELECT * FROM {table}")  # noqa: S608 (constant table names)
            cols = [d[0] for d in cur.description]
            rows = []
            for row in cur.fetchall():
                rec = {c: norm(v) for c, v in zip(cols, row, strict=True)
                       if c not in LOCATIONS | WALL_CLOCK}
                if "run_uuid" in cols:
                    rec["run"] = names[row[cols.index("run_uuid")]]
                rows.append(repr(sorted(rec.items())))
            state[table] = sorted(rows)
    finally:
        con.close()
    state["artifacts"] = sorted("/".join(names.get(p, p) for p in f.relative_to(db.parent).parts)
                                for f in (db.parent / "mlruns").rglob("*") if f.is_file())
    return state


# -- killing the replay at its k-th MLflow call -----------------------------------------------------
class Killed(BaseException):
    """The replay's process killed at an MLflow call (a BaseException, as a kill is: nothing in the
    replay catches it)."""


class FaultyClient:
    """An MlflowClient whose call number ``at`` (0-based, over every method called on it) is killed
    before it reaches the store, or just after it did (``after``); ``calls`` records each call's
    name."""

    def __init__(self, real, at: int, after: bool, calls: list[str]):
        self._real, self._at, self._after, self._calls = real, at, after, calls

    def __getattr__(self, name: str):
        attr = getattr(self._real, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            n = len(self._calls)
            self._calls.append(name)
            if n == self._at and not self._after:
                raise Killed(f"before call {n} ({name})")
            out = attr(*args, **kwargs)
            if n == self._at and self._after:
                raise Killed(f"after call {n} ({name})")
            return out

        return call


def faulty_mlflow(monkeypatch, at: int, after: bool) -> list[str]:
    """Make every MlflowClient the replay creates a :class:`FaultyClient`; returns its call log."""
    import mlflow

    real, calls = mlflow.MlflowClient, []
    monkeypatch.setattr(mlflow, "MlflowClient",
                        lambda *a, **kw: FaultyClient(real(*a, **kw), at, after, calls))
    return calls


@pytest.fixture(scope="module")
def undisturbed(template, tmp_path_factory) -> tuple[dict, list[str]]:
    """The database after one undisturbed replay of the template's spool, and the MLflow calls
    that replay made."""
    folder = tmp_path_factory.mktemp("undisturbed")
    uri = workspace(template, folder)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDPIPE_TRACKING", "on")
        calls = faulty_mlflow(mp, at=-1, after=False)
        assert sync_pending(uri) == 3
    return db_state(folder / "mlflow.db"), calls


CALL_LOG = ["search_experiments", "get_experiment_by_name", "create_experiment", "set_experiment_tag",
            "search_runs", "create_run", "log_batch", "set_terminated",
            "search_runs", "create_run", "log_batch", "log_batch", "log_batch", "log_artifact",
            "log_batch", "set_terminated", "set_terminated",
            "search_runs", "create_run", "log_batch", "log_batch", "log_artifact", "set_terminated",
            "search_runs", "create_run", "log_batch", "log_batch", "log_artifact", "log_batch",
            "set_terminated", "set_terminated"]
"""The MLflow calls of an undisturbed replay of the template's spool, in order (checked below): the
kill table has one case per call, each killed before and after it."""
CALLS = len(CALL_LOG)
EVERY = 4
"""``make test`` kills the replay at a fixed sample of its calls (:data:`SAMPLED`): the first call
of each kind, every :data:`EVERY`-th call and the last, so a failure names the same case every
run; the other cases are marked ``exhaustive`` (``pytest -m exhaustive tests/test_tracking_faults.py``
runs them, ``make test-exhaustive`` with the rest of the suite)."""
SAMPLED = sorted({CALL_LOG.index(name) for name in CALL_LOG} | set(range(0, CALLS, EVERY))
                 | {CALLS - 1})
KILLS = [pytest.param(k, when, id=f"call {k} {when}",
                      marks=() if k in SAMPLED else pytest.mark.exhaustive)
         for k in range(CALLS) for when in ("before", "after")]


def test_the_kill_table_covers_every_call_of_a_replay(undisturbed):
    state, calls = undisturbed
    assert calls == CALL_LOG, f"update CALL_LOG to {calls}"
    runs = [r for r in state["runs"] if "'status', 'FINISHED'" in r]
    assert len(state["runs"]) == len(runs) == 4  # three stage runs and their parent, all ended


def test_the_sampled_kills_reach_every_kind_of_call(undisturbed):
    """Every MLflow method the replay calls is killed, before and after, at one sampled call at
    least, and the sample reaches into each run's calls (each starts with a ``search_runs``)."""
    _, calls = undisturbed
    assert not set(calls) - {calls[k] for k in SAMPLED}
    starts = [i for i, name in enumerate(calls) if name == "search_runs"] + [CALLS]
    assert all(set(range(a, b)) & set(SAMPLED) for a, b in zip(starts, starts[1:], strict=False))
    assert len(SAMPLED) < CALLS  # a sample: the whole sweep is the exhaustive marker's


@pytest.mark.parametrize("k, when", KILLS)
def test_a_replay_killed_at_any_call_and_run_again_equals_an_undisturbed_one(
        k, when, template, undisturbed, tmp_path, monkeypatch):
    want, calls = undisturbed
    uri = workspace(template, tmp_path)
    with monkeypatch.context() as mp:
        killed = faulty_mlflow(mp, at=k, after=when == "after")
        with pytest.raises(Killed):
            sync_pending(uri)
    assert killed == calls[:k + 1]  # the same calls, in the same order, up to the kill
    sync_pending(uri)
    assert db_state(tmp_path / "mlflow.db") == want
    assert pending(tmp_path / "mlspool") == [] and not (tmp_path / "mlspool" / FAILED_DIR).exists()


# -- damaged spool files ----------------------------------------------------------------------------
def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")


def garbled_line(path: Path) -> None:
    rows = lines_of(path)
    rows[1] = rows[1][:20] + b"\xff\x00garbled"
    path.write_bytes(b"\n".join(rows))


def not_an_event(path: Path) -> None:
    rows = lines_of(path)
    rows[1] = b"[1, 2, 3]"
    path.write_bytes(b"\n".join(rows))


def field_of_wrong_type(path: Path) -> None:
    rows = lines_of(path)
    rows[1] = b'{"event": "metrics", "t": 1, "step": 0, "metrics": "0.8"}'
    path.write_bytes(b"\n".join(rows))


def start_not_first(path: Path) -> None:
    rows = lines_of(path)
    rows[0], rows[1] = rows[1], rows[0]
    path.write_bytes(b"\n".join(rows))


def truncated_mid_line(path: Path) -> None:
    data = path.read_bytes()
    cut = data.index(b"\n", len(data) // 2) - 5  # inside a line
    path.write_bytes(data[:cut])


def truncated_in_first_line(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:30])


def empty(path: Path) -> None:
    path.write_bytes(b"")


def binary_garbage(path: Path) -> None:
    import random

    path.write_bytes(random.Random(0).randbytes(300))


def artifact_copy_missing(path: Path) -> None:
    shutil.rmtree(path.with_suffix(".files"))


def cut_at_a_line_end(path: Path) -> None:
    """What a stage killed between two writes leaves: whole lines, no end event."""
    rows = lines_of(path)
    path.write_bytes(b"\n".join(rows[:2]) + b"\n")


def last_newline_missing(path: Path) -> None:
    """A file edited by hand whose last line lost its newline only: whole, replayed."""
    path.write_bytes(path.read_bytes().rstrip(b"\n"))


DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    # name: (damage done to the evaluate stage's file, outcome: "set aside: <reason>" or its status)
    "a garbled line": (garbled_line, "set aside: line 2 is not JSON"),
    "a line that is not an event": (not_an_event, "set aside: line 2 is not an event"),
    "a field of the wrong type": (field_of_wrong_type, "set aside: line 2: the 'metrics' event's "
                                                       "'metrics' is not numbers"),
    "the start event not first": (start_not_first, "set aside: line 1 is a 'metrics' event"),
    "truncated inside a line": (truncated_mid_line, "set aside: truncated: line "),
    "truncated inside its first line": (truncated_in_first_line,
                                        "set aside: truncated: line 1 ends without a newline"),
    "empty": (empty, "set aside: empty"),
    "binary garbage": (binary_garbage, "set aside: line 1 is not JSON"),
    "its artifact copy missing": (artifact_copy_missing, "set aside: line 3: the artifact copy "),
    "cut at a line's end (a killed stage)": (cut_at_a_line_end, "KILLED"),
    "the last newline missing": (last_newline_missing, "FINISHED"),
}


def runs_by_name(uri: str) -> dict:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("fedpipe")
    return {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}


@pytest.mark.parametrize("name", DAMAGES)
def test_a_damaged_spool_file_is_set_aside_and_the_others_replay(name, template, tmp_path,
                                                                 caplog):
    damage, outcome = DAMAGES[name]
    uri = workspace(template, tmp_path)
    spool = tmp_path / "mlspool"
    first, victim, last = pending(spool)
    damage(victim)
    damaged = victim.read_bytes()
    copies = victim.with_suffix(".files").is_dir()
    with caplog.at_level(logging.WARNING, logger="fedpipe.tracking.sync"):
        replayed = sync_pending(uri)
    runs = runs_by_name(uri)
    assert {"federate@fedavg-0 · workspace", "report · workspace", "faults · workspace"} <= set(runs)
    assert pending(spool) == []
    if not outcome.startswith("set aside: "):
        assert replayed == 3 and not caplog.records
        assert runs["evaluate · workspace"].info.status == outcome
        return
    assert replayed == 2  # never counted
    assert "evaluate · workspace" not in runs  # nothing of it replayed
    kept = spool / FAILED_DIR / victim.name
    assert kept.read_bytes() == damaged  # moved, never deleted or changed
    assert kept.with_suffix(".files").is_dir() == copies  # its artifact copies with it
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"tracking: spool file {victim.name} cannot be replayed (")
    assert outcome.removeprefix("set aside: ") in line and "\n" not in line
    assert str(kept) in line and "move it back" in line
    assert sync_pending(uri) == 0  # failed/ is not looked in again
    assert runs_by_name(uri).keys() == runs.keys()


def test_a_set_aside_file_repaired_and_moved_back_replays(template, tmp_path):
    """What the set-aside line says to do works: the file and its copies moved back replay; a file
    of the same name set aside again goes to ``failed/1/``, names kept."""
    uri = workspace(template, tmp_path)
    spool = tmp_path / "mlspool"
    _, victim, _ = pending(spool)
    whole = victim.read_bytes()
    garbled_line(victim)
    assert sync_pending(uri) == 2
    failed = spool / FAILED_DIR
    (failed / victim.name).write_bytes(whole)  # repaired
    for name in (victim.name, victim.with_suffix(".files").name):
        (failed / name).rename(spool / name)
    shutil.copytree(spool / victim.with_suffix(".files").name, tmp_path / "copies")
    assert sync_pending(uri) == 1
    run = runs_by_name(uri)["evaluate · workspace"]
    assert run.info.status == "FINISHED" and run.data.metrics["fedavg.mean"] == 0.8
    for _ in range(2):  # the same file damaged twice
        victim.write_bytes(b"")
        shutil.copytree(tmp_path / "copies", victim.with_suffix(".files"))
        assert sync_pending(uri) == 0
    for where in (failed, failed / "1"):  # the first time, then beside it
        assert (where / victim.name).read_bytes() == b""
        assert (where / victim.with_suffix(".files").name).is_dir()


# -- experiment names that a filter string cannot hold ----------------------------------------------
NAMES = ["lr'0.04", 'say "hi"', "back\\slash", "50%_off", "it's `tick`", "a' OR '1'='1",
         "ünïcode · name", "semi;colon -- comment", ""]


@pytest.mark.parametrize("exp_name", NAMES, ids=[repr(n) for n in NAMES])
def test_any_experiment_name_replays_and_replays_again_onto_the_same_runs(exp_name, template,
                                                                          tmp_path, monkeypatch):
    import mlflow

    spool = write_spool(tmp_path, exp_name)
    keep = tmp_path / "kept"
    shutil.copytree(tmp_path / "mlspool", keep)
    shutil.copy2(template / "mlflow.db", tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    filters: list[str] = []
    real = mlflow.MlflowClient

    class Spy(real):
        def search_runs(self, experiment_ids, filter_string="", *a, **kw):
            filters.append(filter_string)
            return super().search_runs(experiment_ids, filter_string, *a, **kw)

    monkeypatch.setattr(mlflow, "MlflowClient", Spy)
    assert sync_pending(uri) == len(spool)
    first = db_state(tmp_path / "mlflow.db")
    shutil.rmtree(tmp_path / "mlspool")
    shutil.copytree(keep, tmp_path / "mlspool")  # the same files once more: found, not made again
    assert sync_pending(uri) == len(spool)
    assert db_state(tmp_path / "mlflow.db") == first
    assert filters and all(re.fullmatch(r"tags\.`[a-z.]+` LIKE '[A-Za-z0-9._-]*'", f)
                           for f in filters), filters  # the name itself never in a filter
    runs = runs_by_name(uri)
    label = exp_name or "workspace"
    assert set(runs) == {f"{s} · {label}" for s in ("federate@fedavg-0", "evaluate", "report",
                                                      "faults")}
    parent = runs[f"faults · {label}"]
    assert parent.data.tags["dvc.exp_name"] == exp_name and parent.info.status == "FINISHED"
    assert all(r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
               for n, r in runs.items() if r is not parent)


def test_names_alike_but_for_their_odd_characters_get_runs_of_their_own(template, tmp_path):
    """The search pattern makes odd characters wildcards; the exact comparison tells the names
    apart (and SQLite's LIKE ignores case, the comparison does not)."""
    names = ["lr'0.04", "lr_0.04", "LR'0.04", "lr%0.04", "lr'0.04 "]
    shutil.copy2(template / "mlflow.db", tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for name in names:
        write_spool(tmp_path, name)
        sync_pending(uri)
    runs = runs_by_name(uri)
    assert len(runs) == 4 * len(names)
    for name in names:
        parent = runs[f"faults · {name}"]
        assert parent.data.tags["dvc.exp_name"] == name
        assert runs[f"report · {name}"].data.tags["mlflow.parentRunId"] == parent.info.run_id


# -- a database that cannot be read or written ------------------------------------------------------
def garbage_db(db: Path) -> None:
    db.write_bytes(b"this is not an SQLite database, whatever its name says" * 20)


def truncated_db(db: Path) -> None:
    db.write_bytes(db.read_bytes()[:3000])


def read_only_file(db: Path) -> None:
    db.parent.chmod(0o777)
    db.chmod(0o444)


def read_only_folder(db: Path) -> None:
    db.chmod(0o666)
    db.parent.chmod(0o555)


STORES: dict[str, tuple[Callable[[Path], None], str]] = {
    # name: (what is done to mlflow.db, what the line says of it)
    "garbage": (garbage_db, "not a readable MLflow database"),
    "truncated": (truncated_db, "not a readable MLflow database"),
    "read-only file": (read_only_file, "cannot be written (the file is read-only)"),
    "read-only folder": (read_only_folder, "cannot be written (its folder "),
}
COMMANDS = {"sync": ["-m", "fedpipe.tracking.sync"], "make ui": ["-m", "fedpipe.tracking.ui"]}


def as_nobody() -> list[str] | None:
    """The command prefix that runs a process as user nobody when this one is root (root writes
    whatever the permissions say); None where that cannot be done (no ``setpriv``)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"] if setpriv else None


@pytest.fixture
def open_dir(template):
    """A folder any user may read (pytest's own are root's alone), with the template's database
    and spool; removed after."""
    folder = Path(tempfile.mkdtemp(prefix="fedpipe-store-"))
    folder.chmod(0o755)
    workspace(template, folder / "repo")
    for p in [folder / "repo", *(folder / "repo").rglob("*")]:
        p.chmod(0o777 if p.is_dir() else 0o666)
    yield folder / "repo"
    (folder / "repo").chmod(0o755)
    shutil.rmtree(folder)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("store", STORES)
def test_an_unusable_database_is_one_line_and_a_non_zero_exit(store, command, open_dir):
    spoil, said = STORES[store]
    prefix = as_nobody()
    if prefix is None and store.startswith("read-only"):
        pytest.skip("running as root without setpriv: a read-only database is writable to root")
    db = open_dir / "mlflow.db"
    before = sorted(p.name for p in pending(open_dir / "mlspool"))
    spoil(db)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "FEDPIPE_TRACKING": "on",
           "MLFLOW_TRACKING_URI": f"sqlite:///{db}", "HOME": str(open_dir)}
    proc = subprocess.run([*(prefix or []), sys.executable, *COMMANDS[command]], cwd=open_dir, env=env,
                          capture_output=True, text=True, timeout=120)
    open_dir.chmod(0o777)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("error: ") and str(db) in lines[0] and said in lines[0], lines[0]
    assert "FEDPIPE_TRACKING=off" in lines[0]  # and what to do
    assert sorted(p.name for p in pending(open_dir / "mlspool")) == before  # nothing lost


@pytest.mark.parametrize("store", ["garbage", "truncated"])
def test_a_stages_sync_on_an_unusable_database_warns_once_and_goes_on(store, template, tmp_path,
                                                                      caplog):
    """The report stage's sync: the pipeline does not fail for its tracking."""
    uri = workspace(template, tmp_path)
    STORES[store][0](tmp_path / "mlflow.db")
    with caplog.at_level(logging.WARNING, logger="fedpipe.tracking.sync"):
        assert sync_pending(uri) == 0
    (line,) = [r.getMessage() for r in caplog.records]
    assert str(tmp_path / "mlflow.db") in line and "the spooled runs wait in" in line
    assert len(pending(tmp_path / "mlspool")) == 3
