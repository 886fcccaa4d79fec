"""``python -m fedpipe.tracking.sync [--follow <spool file>]``: replay stages' spooled runs into MLflow.

A stage never imports MLflow (:func:`fedpipe.tracking.stage_run` appends its run's events to a JSONL
spool file, ``mlspool/<id>.jsonl`` beside the tracking database); this module is the one place that
talks to MLflow for the stages. Replaying a file creates (or finds) the pipeline's parent run and the
stage's run, logs params and tags in batches, metrics with ``log_batch`` (each with the time and step
the stage gave it), artifacts from the spool's copies, and the run's end status; a file fully
replayed is removed.

Idempotent: the stage's run is found by its spool id (tag ``fedpipe.spool``), the parent by its key;
MLflow keeps one row per (metric, time, step, value), and params, tags, artifacts and statuses are
written as they are. Two syncs never replay one file at once: each takes ``<id>.lock`` with
``fcntl.flock`` first and leaves a file that another holds. A file whose stage is still running (its
writer holds ``fcntl.flock`` on it) is left to that stage (or its follower, or the next sync); a
file whose stage died without an end event (killed) is replayed and its run ends KILLED.

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
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedpipe.tracking import _db_lock, check_db, spool_dir, sqlite_db, tracking_enabled, tracking_uri

log = logging.getLogger(__name__)

SPOOL_TAG = "fedpipe.spool"  # a stage run's spool id: how a replay finds the run it made before
POLL_S = 1.0  # a follower's wait between reads of a live spool file
BATCH = 1000  # MLflow's limit of metrics per log_batch (params, tags: 100)


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
    """The spool files in ``folder``, oldest first (their names start with the stage's start time)."""
    return sorted(folder.glob("*.jsonl")) if folder.is_dir() else []


def sync_pending(uri: str | None = None) -> int:
    """Replay every spool file of ``uri``'s spool folder whose stage has ended (or died) and that no
    other sync holds; returns how many were replayed. No-op when tracking is off."""
    if not tracking_enabled():
        return 0
    uri = tracking_uri() if uri is None else uri
    t0 = time.perf_counter()
    replayer = Replayer(uri)
    done = 0
    for path in pending(spool_dir(uri)):
        with claimed(path, wait=False) as mine:
            if not mine or writer_alive(path):
                continue
            replayer.replay(path)
            done += 1
    if done:
        log.info("tracking: %d spooled run(s) replayed into MLflow in %.1f s", done,
                 time.perf_counter() - t0)
    return done


def follow(path: Path) -> None:
    """Replay spool file ``path`` and follow it to its end event (or its stage's death)."""
    with claimed(path, wait=True) as mine:
        if mine:
            with open(path, encoding="utf-8") as f:
                uri = json.loads(f.readline())["uri"]  # the stage's own (its start event)
            Replayer(uri).replay(path, follow=True)


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

    def replay(self, path: Path, follow: bool = False) -> None:
        """Replay ``path`` (held by :func:`claimed`); following, read on until its end event or its
        writer's death. Removes the file (and its copies) once its end is replayed."""
        run: _Run | None = None
        offset = 0
        ended = False
        while not ended:
            alive = writer_alive(path)  # before reading: what it wrote before dying is read below
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            lines = chunk.split(b"\n")[:-1]  # a last line without its newline is still being written
            offset += sum(len(x) + 1 for x in lines)
            events = [json.loads(x) for x in lines if x.strip()]
            if run is None and events:
                run = _Run(self, path, events.pop(0))
            if run is not None:
                ended = run.apply(events)
            if ended or not alive:
                break
            if not follow:
                return  # a live stage's file: its stage, follower or a later sync replays it
            time.sleep(POLL_S)
        if run is not None and not ended:
            run.apply([{"event": "end", "t": int(time.time() * 1000), "status": "KILLED"}])
        _remove(path)


class _Run:
    """One stage run being replayed: the start event's run (found or created) and its parent."""

    def __init__(self, rep: Replayer, path: Path, start: dict[str, Any]):
        if start.get("event") != "start":
            raise ValueError(f"{path}: the first event is {start.get('event')!r}, not 'start'")
        self.path = path
        self.client = rep.client
        exp_id = rep.experiment(start["experiment"])
        self.parent_id = (rep.parent(exp_id, start["parent"], start["t"])
                          if start.get("parent") else None)
        self.run_id = self._run(exp_id, start)

    def _run(self, exp_id: str, start: dict[str, Any]) -> str:
        from mlflow.entities import Param

        spool_id = self.path.stem
        found = self.client.search_runs([exp_id], filter_string=f"tags.`{SPOOL_TAG}` = '{spool_id}'",
                                        max_results=1)
        if found:
            return found[0].info.run_id
        tags = {**start["tags"], SPOOL_TAG: spool_id,
                **({"mlflow.parentRunId": self.parent_id} if self.parent_id else {})}
        run = self.client.create_run(exp_id, start_time=start["t"], tags=tags,
                                     run_name=start["run_name"])
        run_id = run.info.run_id
        params = sorted(start["params"].items())
        for i in range(0, len(params), 100):  # MLflow's batch limit
            self.client.log_batch(run_id, params=[Param(k, v) for k, v in params[i:i + 100]])
        return run_id

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
            else:
                raise ValueError(f"{self.path}: unknown event {kind!r}")
        flush()
        return False


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path.with_suffix(".files"), ignore_errors=True)
    path.with_suffix(".follow.log").unlink(missing_ok=True)
    path.unlink(missing_ok=True)
    path.with_suffix(".lock").unlink(missing_ok=True)  # last, under the lock (see claimed)


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
    experiments on it). Created FINISHED; a failing stage sets FAILED, the report FINISHED again."""
    from mlflow.entities import Param

    from fedpipe.tracking import PIPELINE_TAG

    found = client.search_runs([experiment_id],
                               filter_string=f"tags.`{PIPELINE_TAG}` = '{record['key']}'",
                               max_results=1)
    if found:
        return found[0].info.run_id
    run = client.create_run(experiment_id, start_time=t, run_name=record["run_name"],
                            tags=record["tags"])
    items = sorted(record["params"].items())
    for i in range(0, len(items), 100):  # MLflow's batch limit
        client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in items[i:i + 100]])
    client.set_terminated(run.info.run_id, end_time=t)
    return run.info.run_id


def main(argv: list[str] | None = None) -> int:
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
    n = sync_pending()  # its own time, with MLflow's import: the whole process
    print(f"synced {n} spooled run(s) into {tracking_uri()} in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
