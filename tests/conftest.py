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
# file goes to one test process (`--dist loadfile`) in collection order (`--no-loadscope-reorder`:
# xdist's default orders files by their number of tests, which put these last, on a process left
# alone at the end): longest first, the other files fill in beside them. The order of the files that
# took more than 60 s in a `make test` (seconds summed per file, 2 workers, load 5-8 on 2 cores:
# pipeline 1656, exp_queue 578, replicates 346, tracking 202, extending 163, tracking_sync 111,
# federate_ddpm 109, faults_more 108, perada_pipeline 99, diffusion_stages 99, overrides 74,
# ray_executor 68).
LONGEST_FIRST = ("test_pipeline.py", "test_exp_queue.py", "test_replicates.py", "test_tracking.py",
                 "test_extending.py", "test_tracking_sync.py", "test_federate_ddpm.py",
                 "test_faults_more.py", "test_perada_pipeline.py", "test_diffusion_stages.py",
                 "test_overrides.py", "test_ray_executor.py")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within each file is kept

