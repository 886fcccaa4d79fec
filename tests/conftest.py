import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# No test writes to the repo's own mlflow.db: tracking is off unless a test turns it on.
os.environ.setdefault("FEDPIPE_TRACKING", "off")
# Per-client jobs run in this process unless a test asks for worker processes (spawning costs seconds).
os.environ.setdefault("FEDPIPE_WORKERS", "1")


@pytest.fixture
def repo_root() -> Path:
    return REPO
