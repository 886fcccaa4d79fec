"""MLflow lineage for stage runs, spooled: a stage never imports MLflow.

:func:`stage_run` appends the run's events (start: stage, params, tags and the pipeline's parent
run; metrics per round and final; tags; artifacts, copied; the end status) to an append-only JSONL
spool file, one per stage execution, in ``mlspool/`` beside the tracking database;
:mod:`fedpipe.tracking.sync` replays them into MLflow. Why: importing MLflow and setting up its SQL
store costs a stage about 3 s (docs/architecture.md, "Tracking"), more than a smoke stage computes,
and a study has about a hundred stages; spooled, one process per study pays it (the ``report``
stage syncs everything pending at its end). A stage that fails syncs on its way out, so its run and
its parent's FAILED status show; a stage that runs longer than ``FEDPIPE_TRACKING_FOLLOW`` seconds
(default 20) starts one detached follower that replays its file live; ``make ui`` syncs what is
pending before it opens the UI.

The database is embedded by default (``mlflow.db`` in the repo root, also for a queued ``dvc exp``
that runs in a temporary copy of the repo, whose spool is the project's too; first writes to a new
database are serialised by a file lock, so syncs started together do not race on its schema);
``MLFLOW_TRACKING_URI`` points at a team server instead; ``FEDPIPE_TRACKING=off`` disables logging
(tests use a temporary URI instead). Each run records: git commit and dirty flag, DVC stage name,
DVC experiment name and baseline (when run by ``dvc exp run``), the hashes of its input and output
files, the resolved params and the seed, and the torch thread count and worker processes it ran
with (results are bit-identical only for the same thread count).

In the UI: the experiment is marked as model training (``mlflow.experimentKind``), so it opens on the
runs table. A run is named ``<stage> · <experiment>`` (``federate@fedprox-0 · workspace``, or the DVC
experiment's name) and has ``algorithm`` and ``run_seed`` params where the stage has them, so the
compare view can group by them. The runs of one pipeline execution (same commit, same params.yaml,
same DVC experiment) hang under one parent run named ``<study> · <experiment>``. Per-round records
use the round as MLflow's step.

Artifacts of a local database live beside it, in ``mlruns/``; the stored locations follow the
repository when it is moved or copied (:mod:`fedpipe.tracking.locations`): they are rewritten to the
current root before a sync replays and before the UI starts (``python -m fedpipe.tracking.ui``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

EXPERIMENT = "fedpipe"
STEP_KEYS = ("round", "clients")  # the step of a per-round record, never a metric of its own
PIPELINE_TAG = "fedpipe.pipeline"


def repo_root(cwd: str | Path = ".") -> Path:
    """The project's root for ``cwd``: a queued DVC experiment runs in a temporary copy under
    ``<root>/.dvc/tmp/exps/``, and its runs belong in the project's database, not the copy's."""
    path = Path(cwd).resolve()
    parts = path.parts
    for i in range(len(parts) - 2):
        if parts[i:i + 3] == (".dvc", "tmp", "exps"):
            return Path(*parts[:i])
    return path


def experiment_name() -> str:
    """The MLflow experiment the runs go to: ``FEDPIPE_EXPERIMENT`` if set, else ``fedpipe``."""
    return os.environ.get("FEDPIPE_EXPERIMENT", EXPERIMENT)


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the project's ``mlflow.db`` (absolute, so that a queued
    experiment's temporary workspace logs there too)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    return uri if uri else f"sqlite:///{repo_root() / 'mlflow.db'}"


def sqlite_db(uri: str) -> Path:
    """The database file of a ``sqlite:///`` URI."""
    from fedpipe.tracking.locations import sqlite_path

    db = sqlite_path(uri)
    if db is None:
        raise ValueError(f"not a local SQLite tracking URI: {uri}")
    return db


@contextlib.contextmanager
def _db_lock(uri: str) -> Iterator[None]:
    """Serialise the first writes to a local SQLite database: two stages starting together on a new
    database race on MLflow's schema creation (``duplicate column name``)."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    from filelock import FileLock

    with FileLock(str(sqlite_db(uri)) + ".lock", timeout=600):
        yield


def check_db(uri: str) -> None:
    """An existing ``sqlite:///`` tracking database that SQLite cannot read (garbage, truncated) is
    an InputError naming the file, before MLflow's long SQLAlchemy traceback could."""
    import sqlite3

    if not uri.startswith("sqlite:///") or not sqlite_db(uri).is_file():
        return
    try:
        with contextlib.closing(sqlite3.connect(f"file:{sqlite_db(uri)}?mode=ro", uri=True)) as db:
            verdict = db.execute("PRAGMA quick_check(1)").fetchone()[0]
    except sqlite3.DatabaseError as e:
        verdict = str(e)
    if verdict != "ok":
        from fedpipe.errors import InputError

        raise InputError(sqlite_db(uri), f"not a readable MLflow database ({verdict}); move it "
                         "aside (a new one is made) or set FEDPIPE_TRACKING=off", None)


def check_writable(uri: str) -> None:
    """A ``sqlite:///`` tracking database (or, before it exists, its folder) that this process may
    not write (a read-only file, folder or file system) is an InputError naming it and what to do,
    before MLflow's ``attempt to write a readonly database`` traceback could."""
    from fedpipe.tracking.locations import sqlite_path

    db = sqlite_path(uri)
    if db is None or not db.parent.is_dir():
        return
    kw = {"effective_ids": True} if os.access in os.supports_effective_ids else {}
    if db.exists() and not os.access(db, os.W_OK, **kw):
        where = "the file is read-only"
    elif not os.access(db.parent, os.W_OK, **kw):  # SQLite writes its journal and lock beside it
        where = f"its folder {db.parent} is read-only"
    else:
        return
    from fedpipe.errors import InputError

    raise InputError(db, f"the tracking database cannot be written ({where}); make it writable "
                     "(chmod u+w), point MLFLOW_TRACKING_URI at a writable one, or set "
                     "FEDPIPE_TRACKING=off", None)


def tracking_enabled() -> bool:
    return os.environ.get("FEDPIPE_TRACKING", "on").lower() not in ("off", "0", "false", "no")


def git_state(cwd: str | Path = ".") -> tuple[str, bool]:
    """(commit sha or 'unknown', dirty flag) of the repository at ``cwd``."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                    cwd=cwd, capture_output=True, text=True,
                                    check=True).stdout.strip())
        return sha, dirty
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists become their string form."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


SPOOL_DIR = "mlspool"  # beside the tracking database: one <id>.jsonl (+ <id>.files/) per stage execution
FOLLOW_ENV = "FEDPIPE_TRACKING_FOLLOW"  # seconds a stage runs before a follower syncs it live
FOLLOW_AFTER = 20.0  # default: a smoke stage (seconds) never starts one, a real training run does


def spool_dir(uri: str | None = None) -> Path:
    """Where stages spool their runs for ``uri``: ``mlspool/`` beside a local database (for a queued
    experiment too: its database is the project's), else beside the project (a team server)."""
    from fedpipe.tracking.locations import sqlite_path

    uri = tracking_uri() if uri is None else uri
    db = sqlite_path(uri)
    return (db.resolve().parent if db is not None else repo_root()) / SPOOL_DIR


def follow_after() -> float | None:
    """``FEDPIPE_TRACKING_FOLLOW``: seconds (>= 0) after which a running stage starts its follower
    (default 20); ``off``: never. Anything else is a ConfigError naming the variable."""
    raw = os.environ.get(FOLLOW_ENV, "").strip().lower()
    if not raw:
        return FOLLOW_AFTER
    if raw in ("off", "never"):
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        from fedpipe.config.core import ConfigError

        raise ConfigError(FOLLOW_ENV, raw, "seconds >= 0 after which a stage's runs sync live, "
                          "or off")
    return value


def _now_ms() -> int:
    return int(time.time() * 1000)


class StageRun:
    """Handle passed to a stage: log metrics, files and tags (no-ops when tracking is off).

    Nothing here talks to MLflow: each call appends one event to the stage's spool file
    (``<spool>/<id>.jsonl``; files logged are copied into ``<id>.files/``), which
    :mod:`fedpipe.tracking.sync` replays into MLflow."""

    def __init__(self, active: bool, path: Path | None = None):
        self.active = active and path is not None
        self.path = path  # the spool file (None: tracking off)
        self._file = None
        self._artifacts = 0
        if self.active:
            import fcntl

            new = path.with_name(path.name + ".new")  # not a spool file until it is locked
            self._file = open(new, "a", encoding="utf-8")  # noqa: SIM115 (held for the stage's life)
            fcntl.flock(self._file, fcntl.LOCK_EX)  # held while the stage runs: a sync sees it live
            os.rename(new, path)

    def _write(self, event: str, **fields: Any) -> None:
        if not self.active:
            return
        line = json.dumps({"event": event, "t": _now_ms(), **fields}, allow_nan=True)
        self._file.write(line + "\n")  # one write per whole line: a reader never sees half of one
        self._file.flush()

    def close(self) -> None:
        """Release the spool file (the stage's end event written); later calls are no-ops."""
        if self._file is not None:
            self._file.close()  # also drops the lock
            self._file = None
        self.active = False

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        if clean:
            self._write("metrics", metrics=clean, step=0 if step is None else int(step))

    def log_round(self, record: Mapping[str, float]) -> None:
        """One round's record, with the round as the step (``round``/``clients`` are not metrics)."""
        self.log_metrics({k: v for k, v in record.items() if k not in STEP_KEYS},
                         step=int(record["round"]))

    def log_per_client(self, name: str, values: Mapping[int, float]) -> None:
        """One value per client as one metric with the client's id as the step (the compare view
        draws it as a curve over clients, not as a metric per client)."""
        for cid, value in sorted(values.items()):
            self.log_metrics({name: value}, step=int(cid))

    def log_final(self, metrics: Mapping[str, Any]) -> None:
        """A run's final numbers, each prefixed ``final_`` once."""
        self.log_metrics({k if k.startswith("final_") else f"final_{k}": v for k, v in metrics.items()})

    def log_artifact(self, path: str | Path, artifact_path: str | None = None,
                     parent: bool = False) -> None:
        """A copy of the file as it is now goes into the spool (the stage's outputs may move)."""
        if not self.active:
            return
        import shutil

        self._artifacts += 1
        dest = self.path.with_suffix(".files") / str(self._artifacts) / Path(path).name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
        self._write("artifact", file=dest.relative_to(self.path.parent).as_posix(),
                    artifact_path=artifact_path, parent=parent)

    def log_parent_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """A file of the study as a whole (the claims table) on the pipeline's parent run, where the
        runs of one execution hang; on this run when there is no parent."""
        self.log_artifact(path, artifact_path, parent=True)

    def log_parent_metrics(self, metrics: Mapping[str, float]) -> None:
        """The study's own numbers (the claims summary) on the pipeline's parent run, so that the
        runs table compares studies and experiments by them; on this run when there is no parent."""
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        if clean:
            self._write("parent_metrics", metrics=clean)

    def finish_parent(self, status: str = "FINISHED") -> None:
        """Set the pipeline's parent run's status: FINISHED by the last stage (``report``), FAILED
        or KILLED by a stage that fails (:func:`stage_run`), so the runs table shows how it ended."""
        self._write("parent_status", status=status)

    def log_tags(self, tags: Mapping[str, Any]) -> None:
        """Free-form tags, e.g. which FID extractor produced a score."""
        self._write("tags", tags={k: str(v) for k, v in tags.items()})

    def log_file_hashes(self, kind: str, hashes: Mapping[str, str]) -> None:
        """Tags ``{kind}.{path}`` = md5 (``kind`` is 'input' or 'output')."""
        self._write("tags", tags={f"{kind}.{p}": h for p, h in hashes.items()})


def _new_spool_file(uri: str, stage: str) -> Path:
    """A new spool file for one execution of ``stage``; its name sorts by start time."""
    import secrets

    folder = spool_dir(uri)
    folder.mkdir(parents=True, exist_ok=True)
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now * 1000) % 1000:03d}"
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in stage)
    return folder / f"{stamp}-{safe}-{os.getpid()}-{secrets.token_hex(3)}.jsonl"


def _start_follower(path: Path) -> None:
    """One detached ``python -m fedpipe.tracking.sync --follow <path>``: it replays the spool file
    and follows it to the stage's end event (per-round metrics show live in the MLflow UI)."""
    import subprocess
    import sys

    log_file = path.with_suffix(".follow.log")
    with open(log_file, "ab") as err:
        subprocess.Popen([sys.executable, "-m", "fedpipe.tracking.sync", "--follow", str(path)],
                         cwd=path.parent, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                         start_new_session=True)  # not in the stage's process group: Ctrl-C spares it


_OUTCOME: list[str] = []  # the statuses this process's stage runs ended with (record_failure)


def _open_run(stage: str, params: Mapping[str, Any], seed: int | None,
              inputs: Mapping[str, str] | None = None) -> tuple[StageRun, str]:
    """A new spool file for one run of ``stage``, its start event written (lineage tags, the
    resolved params, the pipeline's parent record); returns the handle and the tracking URI."""
    uri = tracking_uri()
    sha, dirty = git_state()
    exp_name = os.environ.get("DVC_EXP_NAME", "")
    study_params = _params_file()
    algorithm, run_seed = stage_item(stage)
    label = exp_name or "workspace"
    # every run carries what it ran on (dataset, partition, study), so runs compare across variants
    shared = {k: study_params[k] for k in ("dataset", "partition") if k in study_params}
    study_name = (study_params.get("study") or {}).get("name")
    params = {**shared, **({"study.name": study_name} if study_name else {}), **params}
    if algorithm is not None:
        params = {**params, "algorithm": algorithm}
    import torch

    tags = {
        "mlflow.source.git.commit": sha,
        "mlflow.source.name": os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else stage,
        "mlflow.source.type": "LOCAL",
        "mlflow.user": _user(),
        "git.dirty": str(dirty).lower(),
        "dvc.stage": stage,
        "dvc.exp_name": exp_name,
        "dvc.exp_baseline": os.environ.get("DVC_EXP_BASELINE_REV", ""),
        "seed": "" if seed is None else str(seed),
        "torch.threads": str(torch.get_num_threads()),
        # dataset.stand_in: the run's numbers measure cost and plumbing only (STAND_IN_NOTE)
        "fedpipe.stand_in": str(isinstance(study_params.get("dataset"), dict)
                                and study_params["dataset"].get("stand_in") is True).lower(),
        "fedpipe.workers": os.environ.get("FEDPIPE_WORKERS", "one per core"),
    }
    path = _new_spool_file(uri, stage)
    handle = StageRun(active=True, path=path)
    handle._write("start", uri=uri, experiment=experiment_name(),
                  run_name=f"{stage} · {label}", tags=tags,
                  params={k: str(v)[:6000] for k, v in flatten(params).items()},
                  parent=_parent_record(sha, exp_name, study_params))
    if inputs:
        handle.log_file_hashes("input", inputs)
    return handle, uri


@contextlib.contextmanager
def stage_run(stage: str, params: Mapping[str, Any], seed: int,
              inputs: Mapping[str, str] | None = None) -> Iterator[StageRun]:
    """The MLflow run of one DVC stage (lineage tags, the resolved params), spooled: its events go to
    a spool file that :mod:`fedpipe.tracking.sync` replays into MLflow, so a stage never imports
    MLflow. Who replays: the ``report`` stage at its end (everything pending), a stage that fails on
    its way out (its run and its parent's FAILED status), a follower for a stage that runs longer
    than ``FEDPIPE_TRACKING_FOLLOW`` seconds, and ``make ui``."""
    if not tracking_enabled():
        yield StageRun(active=False)
        return
    import threading

    follow = follow_after()  # a bad setting stops the stage before any compute
    handle, uri = _open_run(stage, params, seed, inputs)
    timer = None
    if follow is not None:
        timer = threading.Timer(follow, _start_follower, args=(handle.path,))
        timer.daemon = True
        timer.start()
    try:
        yield handle
    except BaseException as e:  # the experiment failed here: its run and its parent run show it
        status = "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED"
        handle.finish_parent(status)
        handle._write("end", status=status)
        handle.close()
        _OUTCOME.append(status)
        if timer is not None:
            timer.cancel()
        _sync_on_failure(uri)
        raise
    handle._write("end", status="FINISHED")
    handle.close()
    _OUTCOME.append("FINISHED")
    if timer is not None:
        timer.cancel()


def record_failure(stage: str, error: BaseException) -> None:
    """The stage process fails with ``error`` where no run of it recorded a failure: before its
    :func:`stage_run` opened (bad params, a missing input, a read-only folder, found by the checks
    before compute) or after its run ended well. Spools a run of ``stage`` that ends FAILED (KILLED
    for Ctrl-C) with the error's first line as tag ``fedpipe.error``, and sets the pipeline's parent
    run to the same status, so that an experiment whose stage failed is never shown FINISHED; then,
    for a failure (not an interruption, which must stop at once: a stage whose DVC is gone has
    seconds), replays what is pending, as a failing :func:`stage_run` does. Called by
    :func:`fedpipe.cli.run_stage`; never raises (the stage's own error is the one to report)."""
    if not tracking_enabled() or any(s != "FINISHED" for s in _OUTCOME):
        return
    status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
    first = (str(error).strip().splitlines() or [""])[0]
    line = f"{type(error).__name__}: {first}" if first else type(error).__name__
    try:
        handle, uri = _open_run(stage, {}, None)
        handle.log_tags({"fedpipe.error": line[:5000]})
        handle.finish_parent(status)
        handle._write("end", status=status)
        handle.close()
        _OUTCOME.append(status)
    except Exception as e:  # noqa: BLE001 (a folder it cannot write: the stage's error says it)
        log.debug("tracking: the failure of %s is not recorded (%s: %s)", stage, type(e).__name__, e)
        return
    if status == "FAILED":  # an interrupted stage stops at once: the next sync replays its run
        _sync_on_failure(uri)


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _sync_on_failure(uri: str) -> None:
    """A failing stage replays what is pending (its own run, its parent's FAILED status); a failure
    of that sync is one log line, never in place of the stage's own error, and a sync that went
    well says nothing (the stage's error stays its one line)."""
    import logging

    sync_log = logging.getLogger("fedpipe.tracking.sync")
    level = sync_log.level
    sync_log.setLevel(max(logging.WARNING, level))
    try:
        from fedpipe.tracking.sync import sync_pending

        sync_pending(uri)
    except Exception as e:  # noqa: BLE001 (the stage's own error is the one to raise)
        log.warning("tracking: the failed stage's runs stay in %s (%s: %s); "
                    "`python -m fedpipe.tracking.sync` replays them", spool_dir(uri),
                    type(e).__name__, e)
    finally:
        sync_log.setLevel(level)


def _parent_record(sha: str, exp_name: str, study_params: Mapping[str, Any]) -> dict | None:
    """The parent run of this pipeline execution (commit, params.yaml, DVC experiment): its key,
    name ``<study> · <experiment>``, tags and the whole params.yaml as params; None when there is
    no params.yaml. The sync creates it once (the first stage replayed) and finds it by its key."""
    import hashlib

    params_file = Path("params.yaml")
    if not params_file.is_file():
        return None
    digest = hashlib.md5(params_file.read_bytes()).hexdigest()[:12]
    key = f"{sha[:12]}-{digest}-{exp_name or 'workspace'}"
    study = str((study_params.get("study") or {}).get("name", "pipeline"))
    return {"key": key, "run_name": f"{study} · {exp_name or 'workspace'}",
            "tags": {PIPELINE_TAG: key, "mlflow.source.git.commit": sha, "dvc.exp_name": exp_name,
                     "study": study},
            "params": {k: str(v)[:6000] for k, v in flatten(study_params).items()}}

def stage_item(stage: str) -> tuple[str | None, int | None]:
    """(algorithm, training seed) of a matrix stage ``<name>@<algorithm>-<seed>``, else (None, None)."""
    if "@" not in stage:
        return None, None
    algorithm, _, seed = stage.split("@", 1)[1].rpartition("-")
    return (algorithm, int(seed)) if algorithm and seed.isdigit() else (None, None)


def _params_file() -> dict[str, Any]:
    """params.yaml as read by the stages ({} when absent or unreadable: the stage says why)."""
    from fedpipe.config.core import ConfigError, load_params

    try:
        return load_params()
    except (ConfigError, OSError):
        return {}


