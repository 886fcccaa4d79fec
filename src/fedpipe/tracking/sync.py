"""``python -m fedpipe.tracking.sync [--follow <spool file>]``: replay stages' spooled runs into MLflow.

A stage never imports MLflow (:func:`fedpipe.tracking.stage_run` appends its run's events to a JSONL
spool file, ``mlspool/<id>.jsonl`` beside the tracking database); this module is the one place that
talks to MLflow for the stages. Replaying a file creates (or finds) the pipeline's parent run and the
stage's run, logs params and tags in batches, metrics with ``log_batch`` (each with the time and step
the stage gave it), artifacts from the spool's copies, and the run's end status; a file fully
replayed is removed.

Idempotent: the stage's run is found by its spool id (tag ``fedpipe.spool``), the parent by its key
(both looked up by tag equality compared in Python: a value such as a DVC experiment named
``lr'0.04`` is never spliced into an MLflow filter string, :func:`find_run`); a run found again gets
every tag and param it lacks, a parent found RUNNING its FINISHED status; MLflow keeps one row per
(metric, time, step, value), and artifacts and statuses are written as they are. So a replay killed
at any point (after any MLflow call) and run again leaves the database as one undisturbed replay
would (tests/test_tracking_faults.py kills it at every call). Two syncs never replay one file at
once: each takes ``<id>.lock`` with ``fcntl.flock`` first and leaves a file that another holds. A
file whose stage is still running (its writer holds ``fcntl.flock`` on it) is left to that stage (or
its follower, or the next sync); a file whose stage died without an end event (``kill -9``: no
handler ran) is replayed and its run and its pipeline's parent run end KILLED (:func:`killed_end`).

No empty parent: a pipeline execution's parent run is made only by a stage that logged results
(metrics, artifacts) or failed; a stage that logged only its params and tags (``plan``, which every
``dvc repro`` runs) is recorded under an existing parent, never alone (:func:`sync_pending`).

Never blocked: a file the replay cannot read (a line that is not JSON or not a valid event, a
truncated last line, an empty file, a missing artifact copy) is checked whole before anything of it
reaches MLflow, moved with its copies into ``mlspool/failed/`` with one log line naming it and what
to do, never counted as replayed and never deleted; the files after it are replayed. A tracking
store that fails (an unreadable or read-only ``mlflow.db``, an MLflow error) leaves every file in
the spool: one warning line for a stage (``report``), one error line and a non-zero exit for the
sync command and ``make ui``.

Who runs it: the ``report`` stage at its end (:func:`sync_pending`), a stage that fails on its way
out, ``make ui`` before it opens the UI, and a stage that runs longer than
``FEDPIPE_TRACKING_FOLLOW`` seconds (default 20) starts ``--follow <its file>``, which replays the
file and then follows it until the stage's end event, so per-round metrics show while it trains.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fedpipe.errors import InputError
from fedpipe.tracking import (
    _db_lock,
    check_db,
    check_writable,
    spool_dir,
    sqlite_db,
    tracking_enabled,
    tracking_uri,
)

log = logging.getLogger(__name__)

SPOOL_TAG = "fedpipe.spool"  # a stage run's spool id: how a replay finds the run it made before
POLL_S = 1.0  # a follower's wait between reads of a live spool file
BATCH = 1000  # MLflow's limit of metrics per log_batch (params, tags: 100)
FAILED_DIR = "failed"  # <spool>/failed/: the files a replay cannot read, set aside with their copies
STATUSES = ("RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED")


class SpoolDamage(ValueError):
    """A spool file the replay cannot read (garbled or invalid line, truncated, empty, a missing
    artifact copy); the message says where and what. The file is set aside, never replayed in part
    (its stage has ended: the whole file is checked before MLflow is called)."""


class ReplayError(RuntimeError):
    """The tracking store failed during a replay (one line: the store, the cause, where the spooled
    runs wait); raised by :func:`sync_pending` with ``strict=True`` (the sync command, ``make ui``)."""


@contextlib.contextmanager
def claimed(path: Path, wait: bool) -> Iterator[bool]:
    """Hold ``<id>.lock`` of spool file ``path`` (yields False when another sync holds it and
    ``wait`` is False, or when the file was replayed meanwhile: its lock file is gone or new)."""
    lock_path = path.with_suffix(".lock")
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:  # the sync that held it removes the lock file last, still holding it
            same = os.stat(lock_path).st_ino == os.fstat(lock.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same and not path.is_file():  # made again by this open(): the file was replayed
            lock_path.unlink(missing_ok=True)
        yield same and path.is_file()


def writer_alive(path: Path) -> bool:
    """Whether the stage that writes ``path`` still runs (it holds an exclusive flock on it)."""
    try:
        with open(path, "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            return False
    except FileNotFoundError:
        return False


def pending(folder: Path) -> list[Path]:
    """The spool files in ``folder``, oldest first (their names start with the stage's start time);
    ``failed/`` is not looked in."""
    return sorted(folder.glob("*.jsonl")) if folder.is_dir() else []


def sync_pending(uri: str | None = None, *, strict: bool = False) -> int:
    """Replay every spool file of ``uri``'s spool folder whose stage has ended (or died) and that no
    other sync holds; returns how many were replayed. A file it cannot read is set aside into
    ``<spool>/failed/`` with one log line (:func:`set_aside`) and the files after it are replayed.

    No empty parent runs: a quiet file (:class:`Scan`: a stage that logged nothing but its params
    and tags, as ``plan``, which every ``dvc repro`` runs) is replayed only under a parent run that
    exists or that a file of its pipeline execution with results makes; while a stage of that
    execution still runs it waits; otherwise it is removed with one log line, not counted.

    When the tracking store fails (an unreadable or read-only database, a server that does not
    answer, an MLflow error), the files wait in the spool for the next sync: one warning line, and
    the count so far, so that a stage never fails for its tracking; with ``strict`` (the sync
    command, ``make ui``) a :class:`ReplayError` or the database's InputError, one line each.
    No-op when tracking is off."""
    if not tracking_enabled():
        return 0
    uri = tracking_uri() if uri is None else uri
    folder = spool_dir(uri)
    t0 = time.perf_counter()
    replayer = Replayer(uri)
    done = 0
    try:
        paths = pending(folder)
        scans = {path: scan(path) for path in paths}
        live = {x.key for x in scans.values() if x.live}
        scans = {p: replace(x, live_beside=x.key in live) for p, x in scans.items()}
        results = {x.key for x in scans.values() if not x.quiet and not x.live}  # logged results
        for path in paths:
            with claimed(path, wait=False) as mine:
                if not mine or writer_alive(path):
                    continue
                info = scans[path]
                if info.quiet and info.key not in results:
                    if info.live_beside:  # a stage of its execution still runs: decide later
                        continue
                    if not replayer.has_parent(info.experiment, info.key):
                        log.info("tracking: %s logged nothing but its params and tags, and no "
                                 "stage of its pipeline execution logged results: not recorded "
                                 "(no empty parent run)", info.run_name)
                        _remove(path)
                        continue
                try:
                    done += replayer.replay(path)
                except SpoolDamage as e:
                    set_aside(path, str(e))
    except Exception as e:  # noqa: BLE001 (the store failed: the spool keeps the runs)
        line = failure_line(uri, folder, e)
        log.debug("tracking: the replay failed", exc_info=True)
        if strict:
            raise (e if isinstance(e, InputError) else ReplayError(line)) from None
        log.warning(line)
    if done:
        log.info("tracking: %d spooled run(s) replayed into MLflow in %.1f s", done,
                 time.perf_counter() - t0)
    return done


@dataclass(frozen=True)
class Scan:
    """What :func:`sync_pending` reads of a spool file before replaying it: its pipeline
    execution's parent key (None: no parent, or a file it cannot read), whether it is quiet (its
    stage ended FINISHED and logged nothing but its params and tags: no metric, artifact or parent
    metric, as ``plan`` and ``server_data``), and whether a stage of the same execution still runs
    (``live_beside``, filled in by :func:`scan_all`)."""

    key: str | None
    quiet: bool = False
    experiment: str = ""
    run_name: str = ""
    live: bool = False
    live_beside: bool = False


QUIET_EVENTS = ("start", "tags", "end")  # what a quiet stage's file holds (its end FINISHED)


def scan(path: Path) -> Scan:
    """:class:`Scan` of spool file ``path``, read leniently: a file it cannot read is not quiet (the
    replay sets it aside, naming the problem)."""
    try:
        live = writer_alive(path)
        events = [json.loads(raw) for raw in path.read_bytes().splitlines() if raw.strip()]
        start = events[0]
        parent = start.get("parent")
        key = parent.get("key") if isinstance(parent, dict) else None
        quiet = (not live and key is not None
                 and all(isinstance(e, dict) and e.get("event") in QUIET_EVENTS for e in events)
                 and events[-1].get("event") == "end" and events[-1].get("status") == "FINISHED")
        return Scan(key if isinstance(key, str) else None, quiet, str(start.get("experiment")),
                    str(start.get("run_name")), live)
    except (OSError, ValueError, IndexError, AttributeError):
        return Scan(None)


def failure_line(uri: str, folder: Path, e: BaseException) -> str:
    """One line for a replay that the tracking store stopped: what failed and where the runs wait."""
    if isinstance(e, InputError):  # the database itself: it names the file and what to do
        return f"tracking: {e}; the spooled runs wait in {folder}"
    first = (str(e).strip().splitlines() or [""])[0]
    return (f"tracking: replaying into {uri} failed ({type(e).__name__}: {first}); the spooled runs "
            f"wait in {folder}: run `python -m fedpipe.tracking.sync` once it is fixed")


def set_aside(path: Path, problem: str) -> Path:
    """Move spool file ``path`` that cannot be replayed, with its artifact copies and its
    follower's log, into ``<spool>/failed/`` (``failed/<n>/`` if a file of that name was set aside
    before; names kept, so that moved back it replays), never deleted: its run is not in MLflow.
    One log line names it, why, and what to do; returns where it went. Call it holding its lock."""
    folder, n = path.parent / FAILED_DIR, 1
    while (folder / path.name).exists() or (folder / path.with_suffix(".files").name).exists():
        folder, n = path.parent / FAILED_DIR / str(n), n + 1
    folder.mkdir(parents=True, exist_ok=True)
    moved = [x for x in (path.with_suffix(".files"), path.with_suffix(".follow.log"), path)
             if x.exists()]
    for x in moved:
        os.replace(x, folder / x.name)
    path.with_suffix(".lock").unlink(missing_ok=True)  # last, under the lock (see claimed)
    copies = " with its artifact copies" if path.with_suffix(".files") in moved else ""
    log.warning("tracking: spool file %s cannot be replayed (%s); moved to %s%s, its run is not in "
                "MLflow: repair it and move it back into %s, then run `python -m "
                "fedpipe.tracking.sync` (or delete it)", path.name, problem, folder / path.name,
                copies, path.parent)
    return folder / path.name


def follow(path: Path) -> None:
    """Replay spool file ``path`` and follow it to its end event (or its stage's death)."""
    with claimed(path, wait=True) as mine:
        if mine:
            try:
                with open(path, "rb") as f:
                    start = _event(f.readline(), 1, path.parent, first=True)
                Replayer(start["uri"]).replay(path, follow=True)  # the stage's own URI
            except SpoolDamage as e:
                set_aside(path, str(e))


# -- reading a spool file -----------------------------------------------------------------------
def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _strings(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())


def _numbers(v: Any) -> bool:
    return isinstance(v, dict) and all(_number(x) for x in v.values())


def _parent(v: Any) -> bool:
    return v is None or (isinstance(v, dict) and isinstance(v.get("key"), str)
                         and isinstance(v.get("run_name"), str) and _strings(v.get("tags"))
                         and _strings(v.get("params")))


_INT = (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
_STR = (lambda v: isinstance(v, str), "a string")
_STATUS = (lambda v: v in STATUSES, "a run status")
FIELDS: dict[str, dict[str, tuple]] = {
    "start": {"t": _INT, "uri": _STR, "experiment": _STR, "run_name": _STR,
              "tags": (_strings, "strings"),
              "params": (_strings, "strings"), "parent": (_parent, "null or a parent record")},
    "metrics": {"t": _INT, "step": _INT, "metrics": (_numbers, "numbers")},
    "tags": {"tags": (_strings, "strings")},
    "artifact": {"file": _STR, "parent": (lambda v: isinstance(v, bool), "true or false"),
                 "artifact_path": (lambda v: v is None or isinstance(v, str), "null or a string")},
    "parent_metrics": {"t": _INT, "metrics": (_numbers, "numbers")},
    "parent_status": {"t": _INT, "status": _STATUS},
    "end": {"t": _INT, "status": _STATUS},
}
"""Each event's fields and what each must be (what the replay reads of it)."""


def _event(raw: bytes, line: int, folder: Path, first: bool) -> dict[str, Any]:
    """Line ``line`` of a spool file as an event, checked (SpoolDamage naming the line otherwise):
    JSON, a known event with the fields the replay reads, a start event first and only first, and
    an artifact's copy present in ``folder``."""
    try:
        ev = json.loads(raw)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise SpoolDamage(f"line {line} is not JSON ({str(e).splitlines()[0]})") from None
    kind = ev.get("event") if isinstance(ev, dict) else None
    if kind not in FIELDS:
        raise SpoolDamage(f"line {line} is not an event of a stage run ({str(raw[:60])[2:-1]}...)")
    if (kind == "start") != first:
        raise SpoolDamage(f"line {line} is a {kind!r} event; a file holds one start event, first")
    for name, (ok, what) in FIELDS[kind].items():
        if not ok(ev.get(name)):
            raise SpoolDamage(f"line {line}: the {kind!r} event's {name!r} is not {what}")
    if kind == "artifact":
        copy = Path(ev["file"])
        if copy.is_absolute() or ".." in copy.parts or not (folder / copy).is_file():
            raise SpoolDamage(f"line {line}: the artifact copy {ev['file']} is missing")
    return ev


class _Reader:
    """Reads the events of one spool file in the order written, from where it last stopped."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0  # bytes read so far (whole lines)
        self.line = 0
        self.started = False

    def read(self, complete: bool) -> list[dict[str, Any]]:
        """The events written since the last read, each checked. ``complete``: the stage has ended,
        so a last line without its newline is a truncated file, and a file without a start event an
        empty one (for a live stage, that line is being written: it is read next time)."""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        *lines, tail = chunk.split(b"\n")
        events = []
        for raw in lines:  # the first bad line is the one named
            self.line += 1
            if raw.strip():
                events.append(_event(raw, self.line, self.path.parent,
                                     first=not self.started and not events))
        self.offset += sum(len(x) + 1 for x in lines)
        if complete and tail:
            self.line += 1
            try:  # a last line whose newline alone is missing (a file edited by hand) is whole
                events.append(_event(tail, self.line, self.path.parent,
                                     first=not self.started and not events))
            except SpoolDamage:
                raise SpoolDamage(f"truncated: line {self.line} ends without a newline, "
                                  f"{len(tail)} bytes into it") from None
            self.offset += len(tail)
        self.started = self.started or bool(events)
        if complete and not self.started:
            raise SpoolDamage("empty: no start event (its stage died before it began, or the "
                              "file was cut)")
        return events


# -- replaying into MLflow ----------------------------------------------------------------------
class Replayer:
    """Replays the spool files of one tracking URI (the database they lie beside: a repository
    moved with its database replays into it where it now is); the MLflow client, experiment ids
    and parent runs are looked up once."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._client = None
        self._experiments: dict[str, str] = {}
        self._parents: dict[str, str] = {}

    @property
    def client(self):
        if self._client is None:
            from mlflow import MlflowClient

            check_db(self.uri)  # an unreadable database: one line naming it (the spool is kept)
            check_writable(self.uri)  # a read-only one too
            with _db_lock(self.uri):  # a new database's schema: made by one process at a time
                client = MlflowClient(tracking_uri=self.uri)
                client.search_experiments(max_results=1)  # the store (and schema) made here
            self._client = client
        return self._client

    def experiment(self, name: str) -> str:
        if name not in self._experiments:
            client = self.client
            with _db_lock(self.uri):  # the experiment and its locations: one process at a time
                self._experiments[name] = _experiment(client, name, self.uri)
        return self._experiments[name]

    def parent(self, exp_id: str, record: dict[str, Any], t: int) -> str:
        if record["key"] not in self._parents:
            client = self.client
            with _db_lock(self.uri):  # found or created by one process at a time
                self._parents[record["key"]] = _pipeline_parent(client, exp_id, record, t)
        return self._parents[record["key"]]

    def has_parent(self, experiment: str, key: str) -> bool:
        """Whether the parent run of pipeline execution ``key`` is in experiment ``experiment``
        (made by an earlier sync, or by this one); the experiment is not made to find out."""
        if key in self._parents:
            return True
        from fedpipe.tracking import PIPELINE_TAG

        exp = self.client.get_experiment_by_name(experiment)
        return exp is not None and find_run(self.client, exp.experiment_id, PIPELINE_TAG,
                                            key) is not None

    def replay(self, path: Path, follow: bool = False) -> bool:
        """Replay ``path`` (held by :func:`claimed`); following, read on until its end event or its
        writer's death. Removes the file (and its copies) once its end is replayed, and returns
        True; False for a live stage's file when not following (its stage, follower or a later
        sync replays it). A file that cannot be read raises :class:`SpoolDamage`: for a stage that
        has ended, before anything of it reaches MLflow."""
        reader = _Reader(path)
        run: _Run | None = None
        ended = False
        while not ended:
            alive = writer_alive(path)  # before reading: what it wrote before dying is read below
            if alive and not follow:
                return False
            events = reader.read(complete=not alive)
            if run is None and events:
                run = _Run(self, path, events.pop(0))
            if run is not None:
                ended = run.apply(events)
            if ended or not alive:
                break
            time.sleep(POLL_S)
        if run is not None and not ended:  # its stage died without an end event (SIGKILL, OOM)
            run.apply(killed_end(run.last_t))
        _remove(path)
        return True


def killed_end(t: int) -> list[dict[str, Any]]:
    """The events a replay adds for a stage that died without its end event (``kill -9``, the OOM
    killer, a lost machine: no handler ran): its pipeline's parent run and its own run end KILLED,
    at ``t``, the time of its last event (when it was last heard of), so that neither stays RUNNING
    nor shows FINISHED. A later execution of the same pipeline (same commit, params and experiment)
    whose report ends well sets the parent FINISHED again; the killed stage's run stays KILLED."""
    return [{"event": "parent_status", "t": t, "status": "KILLED"},
            {"event": "end", "t": t, "status": "KILLED"}]


class _Run:
    """One stage run being replayed: the start event's run (found or created, and given whatever
    it lacks) and its parent."""

    def __init__(self, rep: Replayer, path: Path, start: dict[str, Any]):
        self.path = path
        self.last_t = start["t"]  # the time of the last event applied (a killed stage's end)
        self.client = rep.client
        exp_id = rep.experiment(start["experiment"])
        self.parent_id = (rep.parent(exp_id, start["parent"], start["t"])
                          if start.get("parent") else None)
        spool_id = path.stem
        tags = {**start["tags"], SPOOL_TAG: spool_id,
                **({"mlflow.parentRunId": self.parent_id} if self.parent_id else {})}
        self.run_id, _ = _ensure_run(self.client, exp_id, SPOOL_TAG, spool_id, start["run_name"],
                                     tags, start["params"], start["t"])

    def apply(self, events: list[dict[str, Any]]) -> bool:
        """Apply events in order (metrics batched); True once the end event is applied."""
        from mlflow.entities import Metric, RunTag

        metrics: list[Metric] = []

        def flush() -> None:
            for i in range(0, len(metrics), BATCH):
                self.client.log_batch(self.run_id, metrics=metrics[i:i + BATCH])
            metrics.clear()

        for ev in events:
            kind = ev["event"]
            if isinstance(ev.get("t"), int):
                self.last_t = max(self.last_t, ev["t"])
            if kind == "metrics":
                metrics.extend(Metric(k, v, ev["t"], ev["step"]) for k, v in ev["metrics"].items())
                continue
            flush()
            if kind == "tags":
                items = sorted(ev["tags"].items())
                for i in range(0, len(items), 100):
                    self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in items[i:i + 100]])
            elif kind == "artifact":
                target = self.parent_id if ev["parent"] and self.parent_id else self.run_id
                self.client.log_artifact(target, str(self.path.parent / ev["file"]),
                                         ev["artifact_path"])
            elif kind == "parent_metrics":
                target = self.parent_id or self.run_id
                self.client.log_batch(target, metrics=[Metric(k, v, ev["t"], 0)
                                                       for k, v in ev["metrics"].items()])
            elif kind == "parent_status":
                if self.parent_id is not None:
                    self.client.set_terminated(self.parent_id, ev["status"], end_time=ev["t"])
            elif kind == "end":
                self.client.set_terminated(self.run_id, ev["status"], end_time=ev["t"])
                return True
        flush()
        return False


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path.with_suffix(".files"), ignore_errors=True)
    path.with_suffix(".follow.log").unlink(missing_ok=True)
    path.unlink(missing_ok=True)
    path.with_suffix(".lock").unlink(missing_ok=True)  # last, under the lock (see claimed)


def like_pattern(value: str) -> str:
    """An MLflow ``LIKE`` pattern that matches ``value``: every character but letters, digits,
    ``.`` and ``-`` becomes ``_`` (any one character), so that nothing of ``value`` (a DVC
    experiment's name: ``lr'0.04``) is ever spliced into a filter string; callers compare the runs
    found with ``value`` exactly."""
    return re.sub(r"[^A-Za-z0-9.\-]", "_", value)


def find_run(client, experiment_id: str, tag: str, value: str):
    """The active run of ``experiment_id`` whose tag ``tag`` (a constant key) is exactly ``value``,
    or None: searched with :func:`like_pattern` (the filter never holds ``value`` itself) and
    compared here."""
    token = None
    while True:
        page = client.search_runs([experiment_id], f"tags.`{tag}` LIKE '{like_pattern(value)}'",
                                  max_results=100, page_token=token)
        for run in page:
            if run.data.tags.get(tag) == value:
                return run
        token = page.token
        if not token:
            return None


def _ensure_run(client, experiment_id: str, tag: str, value: str, name: str,
                tags: dict[str, str], params: dict[str, str], start_time: int) -> tuple[str, str]:
    """The run whose tag ``tag`` is ``value``: found, or created with ``tags`` (one call: a run
    never exists without them); either way given each of ``tags`` and ``params`` it lacks (a
    replay killed after creating it, or between batches, left them out). Returns (run id, its
    status)."""
    from mlflow.entities import Param, RunTag

    run = find_run(client, experiment_id, tag, value)
    if run is None:
        run = client.create_run(experiment_id, start_time=start_time, tags=tags, run_name=name)
    run_id = run.info.run_id
    lacking = [RunTag(k, v) for k, v in sorted(tags.items()) if k not in run.data.tags]
    for i in range(0, len(lacking), 100):  # MLflow's batch limit
        client.log_batch(run_id, tags=lacking[i:i + 100])
    lacking = [Param(k, v) for k, v in sorted(params.items()) if k not in run.data.params]
    for i in range(0, len(lacking), 100):
        client.log_batch(run_id, params=lacking[i:i + 100])
    return run_id, run.info.status


def _experiment(client, name: str, uri: str) -> str:
    """The experiment's id, created if needed and marked as model training for the UI. With a local
    database, its artifacts go beside it (not into the working directory, which for a queued ``dvc
    exp`` is a temporary copy), and stored locations from before a move are rewritten first."""
    from mlflow.exceptions import MlflowException

    from fedpipe.tracking.locations import ROOT_TAG, artifact_root, new_experiment_location, relocate

    exp = client.get_experiment_by_name(name)  # creates the schema of a new database
    root = artifact_root(uri)
    if root is not None:
        relocate(sqlite_db(uri))
    if exp is None:
        location = None if root is None else new_experiment_location(root, name)
        try:
            exp_id = client.create_experiment(
                name, artifact_location=location,
                tags=None if root is None else {ROOT_TAG: root.as_posix()})
        except MlflowException:  # created meanwhile by a sync running beside this one
            exp_id = client.get_experiment_by_name(name).experiment_id
    else:
        exp_id = exp.experiment_id
    if exp is None or exp.tags.get("mlflow.experimentKind") != "custom_model_development":
        client.set_experiment_tag(exp_id, "mlflow.experimentKind", "custom_model_development")
    return exp_id


def _pipeline_parent(client, experiment_id: str, record: dict[str, Any], t: int) -> str:
    """The parent run of the pipeline execution ``record`` describes (its key: commit, params.yaml
    digest, DVC experiment), created by the first replay that needs it, named ``<study> ·
    <experiment>`` and holding the whole params.yaml as its params (the runs table compares
    experiments on it). Created FINISHED; a failing stage sets FAILED, the report FINISHED again.
    Found again, it gets what it lacks: params, and its FINISHED status if a replay was killed
    before it was set (a parent is never left RUNNING)."""
    from fedpipe.tracking import PIPELINE_TAG

    run_id, status = _ensure_run(client, experiment_id, PIPELINE_TAG, record["key"],
                                 record["run_name"], record["tags"], record["params"], t)
    if status == "RUNNING":
        client.set_terminated(run_id, end_time=t)
    return run_id


def main(argv: list[str] | None = None) -> int:
    """The sync command: 0 when every readable file was replayed (unreadable ones set aside, one
    line each); 2 for an unreadable or read-only database, 1 when the store failed (one line)."""
    parser = argparse.ArgumentParser(prog="python -m fedpipe.tracking.sync", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--follow", type=Path, metavar="SPOOL_FILE",
                        help="replay this stage's spool file and follow it to its end")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.follow is not None:
        follow(args.follow.resolve())
        return 0
    t0 = time.perf_counter()
    uri = tracking_uri()
    try:
        if tracking_enabled():
            check_db(uri)
            check_writable(uri)
        n = sync_pending(uri, strict=True)  # its own time, with MLflow's import: the whole process
    except InputError as e:
        print(f"error: {failure_line(uri, spool_dir(uri), e)}", file=sys.stderr)
        return 2
    except ReplayError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"synced {n} spooled run(s) into {uri} in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
