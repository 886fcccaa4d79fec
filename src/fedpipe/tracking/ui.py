"""``python -m fedpipe.tracking.ui [mlflow ui options]`` (``make ui``): the MLflow UI on the project's
runs, wherever the repository now lies.

Before starting ``mlflow ui`` on the project's database (``MLFLOW_TRACKING_URI`` if it is a local
SQLite one, else ``<repo>/mlflow.db``), the stored artifact locations are rewritten to the current
repository root (:func:`fedpipe.tracking.locations.relocate`), under the database's file lock, so a
moved or copied repository still shows its runs' artifacts. Extra arguments go to ``mlflow ui``
(``--port 5001``, ``--host 0.0.0.0``).
"""

from __future__ import annotations

import os
import sys

from fedpipe.tracking import _db_lock, sqlite_db, tracking_uri
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


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    uri = tracking_uri()
    if sqlite_path(uri) is None:
        sys.exit(f"error: MLFLOW_TRACKING_URI={uri} is a server: open it in a browser instead")
    uri = f"sqlite:///{sqlite_path(uri).resolve()}"
    for line in prepare(uri):
        print(line, flush=True)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, *argv]
    os.execv(sys.executable, cmd)


if __name__ == "__main__":
    main()
