"""``python -m fedpipe.tracking.ui [mlflow ui options]`` (``make ui``): the MLflow UI on the project's
runs, wherever the repository now lies.

Before starting ``mlflow ui`` on the project's database (``MLFLOW_TRACKING_URI`` if it is a local
SQLite one, else ``<repo>/mlflow.db``), the stored artifact locations are rewritten to the current
repository root (:func:`fedpipe.tracking.locations.relocate`), under the database's file lock, so a
moved or copied repository still shows its runs' artifacts. Extra arguments go to ``mlflow ui``
(``--port 5001``, ``--host 0.0.0.0``). It prints the address of the ``fedpipe`` experiment's runs
table, since MLflow 3 opens on its GenAI home page. Spooled runs that no stage replayed yet (a
pipeline stopped before its report, a stage still running) are replayed first
(:func:`fedpipe.tracking.sync.sync_pending`; a running stage's file is left to it).
"""

from __future__ import annotations

import contextlib
import os
import sys

from fedpipe.tracking import EXPERIMENT, _db_lock, sqlite_db, tracking_uri
from fedpipe.tracking.locations import relocate, sqlite_path


def prepare(uri: str) -> list[str]:
    """Rewrite the stored artifact locations of ``uri``'s database to its current folder; one line
    per experiment that moved."""
    db = sqlite_path(uri)
    if db is None or not db.is_file():
        return []
    with _db_lock(uri):
        moved = relocate(sqlite_db(uri))
    return [f"experiment {m.experiment_id}: artifact locations moved from {m.old_root} to "
            f"{m.new_root} ({m.runs} runs)" for m in moved]


def runs_table_url(uri: str, argv: list[str]) -> str | None:
    """The address of the runs table of experiment ``fedpipe`` (MLflow 3 opens on its GenAI home
    page; this page is the project's runs), from ``--host``/``--port`` of ``argv``; None before the
    first run."""
    import sqlite3

    db = sqlite_path(uri)
    if db is None or not db.is_file():
        return None
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        try:
            row = con.execute("SELECT experiment_id FROM experiments WHERE name = ?",
                              (os.environ.get("FEDPIPE_EXPERIMENT", EXPERIMENT),)).fetchone()
        except sqlite3.Error:
            return None
    if row is None:
        return None
    opts = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--host", "--port")}
    host = opts.get("--host", "127.0.0.1")
    return f"http://{host}:{opts.get('--port', '5000')}/#/experiments/{row[0]}/runs"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    uri = tracking_uri()
    if sqlite_path(uri) is None:
        sys.exit(f"error: MLFLOW_TRACKING_URI={uri} is a server: open it in a browser instead")
    uri = f"sqlite:///{sqlite_path(uri).resolve()}"
    for line in prepare(uri):  # before the sync, which would move them without a word
        print(line, flush=True)
    from fedpipe.tracking.sync import sync_pending

    synced = sync_pending(uri)  # the stages' spooled runs that no report stage replayed yet
    if synced:
        print(f"synced {synced} spooled run(s)", flush=True)
    url = runs_table_url(uri, argv)
    if url is not None:
        print(f"the project's runs: {url}", flush=True)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, *argv]
    os.execv(sys.executable, cmd)


if __name__ == "__main__":
    main()
