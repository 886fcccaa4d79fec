import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# No test writes to the repo's own mlflow.db: tracking is off unless a test turns it on.
os.environ.setdefault("FEDPIPE_TRACKING", "off")
# Per-client jobs run in this process unless a test asks for worker processes (spawning costs seconds).
os.environ.setdefault("FEDPIPE_WORKERS", "1")
# Under pytest-xdist (`make test`: one test process per core) each process, and the stages it runs,
# uses one torch thread: two processes with 2 threads each on 2 cores run many times slower.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("FEDPIPE_THREADS", "1")
    import torch

    torch.set_num_threads(1)


@pytest.fixture
def repo_root() -> Path:
    return REPO


@pytest.fixture
def tracked(tmp_path, monkeypatch) -> tuple[Path, str]:
    """Tracking on, into a database of its own in tmp_path (the working directory, with a
    params.yaml); no follower unless a test asks for one. Returns (tmp_path, tracking URI)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("seed: 0\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("FEDPIPE_TRACKING", "on")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("DVC_EXP_NAME", "")
    monkeypatch.setenv("FEDPIPE_TRACKING_FOLLOW", "off")
    return tmp_path, uri


# The end-to-end DVC files run longest (minutes, one stage after another). Under `make test` each
# file goes to one test process (`--dist loadfile`) in collection order: collected first, they run
# beside all the other files instead of after them, on a process left alone at the end.
LONGEST_FIRST = ("test_pipeline.py", "test_exp_queue.py")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within each file is kept

