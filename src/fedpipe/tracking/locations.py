"""Artifact locations that follow the repository when it moves.

MLflow stores an experiment's artifact location, and each run's artifact URI, as absolute paths,
fixed when they are created (relative ones are resolved against the working directory then). A
repository that is copied, cloned with its ``mlflow.db``, or moved would keep pointing at the old
place, and a queued ``dvc exp`` that creates the experiment would point it into its temporary
workspace, which DVC deletes.

So, for a local SQLite database, fedpipe keeps every artifact beside the database, under
``<root>/mlruns/`` (``<root>`` is the folder of ``mlflow.db``, the repository root by default), and
records ``<root>`` in the experiment tag :data:`ROOT_TAG`. :func:`relocate` rewrites the stored
prefixes (``experiments.artifact_location``, ``runs.artifact_uri``, ``logged_models.artifact_location``)
from the recorded root to the current one in one SQLite transaction, and updates the tag. It runs
under the database's file lock before a stage logs (so new artifacts land in the current copy) and
before the UI starts (``python -m fedpipe.tracking.ui``, ``make ui``). MLflow offers no relative
location for a database without a tracking server, and no call that changes a stored one.

Experiments created before this tag existed are adopted when their location has the form
``<old root>/mlruns/...``: their prefixes are rewritten only where that does not lose artifacts that
are still found at the old place.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

ROOT_TAG = "fedpipe.repo_root"
ARTIFACTS_DIR = "mlruns"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///<path>`` tracking URI, else None (a server decides its
    own artifact locations)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///"):].split("?", 1)[0])


def artifact_root(uri: str) -> Path | None:
    """The root that artifact locations are kept under for ``uri``: the database's folder."""
    db = sqlite_path(uri)
    return db.resolve().parent if db is not None else None


def new_experiment_location(root: Path, name: str) -> str:
    """Where a new experiment's artifacts go: ``<root>/mlruns/<name>`` (name made path-safe)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "experiment"
    return (root / ARTIFACTS_DIR / safe).as_posix()


@dataclass(frozen=True)
class Moved:
    """One experiment whose stored locations were rewritten."""

    experiment_id: int
    old_root: str
    new_root: str
    runs: int


def _local(location: str) -> tuple[str, str] | None:
    """(scheme prefix, absolute path) of a local location (plain path or ``file://``), else None."""
    if location.startswith("file://"):
        return "file://", location[len("file://"):]
    if location.startswith("/"):
        return "", location
    return None


def _legacy_root(path: str) -> str | None:
    """The root of an untagged location ``<root>/mlruns/<...>`` (the last ``mlruns`` component)."""
    parts = path.split("/")
    for i in range(len(parts) - 1, 0, -1):
        if parts[i] == ARTIFACTS_DIR:
            return "/".join(parts[:i]) or "/"
    return None


def relocate(db: Path, root: Path | None = None) -> list[Moved]:
    """Point every experiment's stored artifact locations in ``db`` at ``root`` (default: the
    database's folder), in one transaction; record ``root`` in each experiment's :data:`ROOT_TAG`.

    Call it under the database's file lock. Returns the experiments that were rewritten. Reads only,
    unless something is to change (it runs before every stage's logging)."""
    root_s = (root or db.resolve().parent).as_posix().rstrip("/") or "/"
    con = sqlite3.connect(db, timeout=60, isolation_level=None)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"experiments", "runs", "experiment_tags"} <= tables:
            return []  # a database MLflow has not set up yet
        if not _plan(con, root_s):
            return []
        con.execute("BEGIN IMMEDIATE")
        try:
            moved = []
            for exp_id, scheme, old in _plan(con, root_s):  # again, inside the write transaction
                if old != root_s:
                    n_runs = _rewrite(con, exp_id, scheme, old, root_s, "logged_models" in tables)
                    moved.append(Moved(int(exp_id), old, root_s, n_runs))
                con.execute("INSERT OR REPLACE INTO experiment_tags (key, value, experiment_id) "
                            "VALUES (?, ?, ?)", (ROOT_TAG, root_s, exp_id))
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        return moved
    finally:
        con.close()


def _plan(con: sqlite3.Connection, root_s: str) -> list[tuple[int, str, str]]:
    """(experiment id, scheme, recorded root) of each experiment whose locations or tag are to be
    updated for ``root_s``."""
    tags = dict(con.execute("SELECT experiment_id, value FROM experiment_tags WHERE key = ?",
                            (ROOT_TAG,)).fetchall())
    todo = []
    for exp_id, location in con.execute(
            "SELECT experiment_id, artifact_location FROM experiments").fetchall():
        local = _local(location or "")
        if local is None:
            continue  # a remote store (s3:, mlflow-artifacts:, ...): nothing to follow
        scheme, path = local
        old = tags.get(exp_id)
        if old is None:
            old = _legacy_root(path)
            if old is None:
                continue
            new_path = root_s + path[len(old):]
            if old != root_s and Path(path).exists() and not Path(new_path).exists():
                continue  # artifacts still found where they are: leave them be
        elif old == root_s:
            continue
        todo.append((exp_id, scheme, old.rstrip("/") or "/"))
    return todo


def _rewrite(con: sqlite3.Connection, exp_id: int, scheme: str, old: str, new: str,
             logged_models: bool) -> int:
    """Replace the prefix ``<scheme><old>/`` with ``<scheme><new>/`` in one experiment's rows."""
    src, dst = f"{scheme}{old}/", f"{scheme}{new}/"
    n = len(src)
    sql = ("UPDATE {table} SET {col} = ? || substr({col}, ?) "
           "WHERE experiment_id = ? AND substr({col}, 1, ?) = ?")
    con.execute(sql.format(table="experiments", col="artifact_location"), (dst, n + 1, exp_id, n, src))
    runs = con.execute(sql.format(table="runs", col="artifact_uri"), (dst, n + 1, exp_id, n, src))
    if logged_models:
        con.execute(sql.format(table="logged_models", col="artifact_location"),
                    (dst, n + 1, exp_id, n, src))
    return runs.rowcount
