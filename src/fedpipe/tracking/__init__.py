"""MLflow lineage for stage runs.

Embedded by default (``sqlite:///mlflow.db`` in the repo root); ``MLFLOW_TRACKING_URI`` points at a
team server instead; ``FEDPIPE_TRACKING=off`` disables logging (tests use a temporary URI instead).
Each run records: git commit and dirty flag, DVC stage name, DVC experiment name and baseline (when
run by ``dvc exp run``), the hashes of its input and output files, the resolved params and the seed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_URI = "sqlite:///mlflow.db"
EXPERIMENT = "fedpipe"


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


class StageRun:
    """Handle passed to a stage: log metrics, files and tags (no-ops when tracking is off)."""

    def __init__(self, active: bool):
        self.active = active
        self.run_id: str | None = None

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self.active:
            import mlflow

            clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
            mlflow.log_metrics(clean, step=step)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if self.active:
            import mlflow

            mlflow.log_artifact(str(path), artifact_path=artifact_path)

    def log_tags(self, tags: Mapping[str, Any]) -> None:
        """Free-form tags, e.g. which FID extractor produced a score."""
        if self.active:
            import mlflow

            mlflow.set_tags({k: str(v) for k, v in tags.items()})

    def log_file_hashes(self, kind: str, hashes: Mapping[str, str]) -> None:
        """Tags ``{kind}.{path}`` = md5 (``kind`` is 'input' or 'output')."""
        if self.active:
            import mlflow

            mlflow.set_tags({f"{kind}.{p}": h for p, h in hashes.items()})


@contextlib.contextmanager
def stage_run(stage: str, params: Mapping[str, Any], seed: int,
              inputs: Mapping[str, str] | None = None) -> Iterator[StageRun]:
    """An MLflow run for one DVC stage, with lineage tags and the resolved params."""
    if not tracking_enabled():
        yield StageRun(active=False)
        return
    import mlflow

    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_URI))
    mlflow.set_experiment(os.environ.get("FEDPIPE_EXPERIMENT", EXPERIMENT))
    sha, dirty = git_state()
    with mlflow.start_run(run_name=stage) as run:
        mlflow.set_tags({
            "mlflow.source.git.commit": sha,
            "git.dirty": str(dirty).lower(),
            "dvc.stage": stage,
            "dvc.exp_name": os.environ.get("DVC_EXP_NAME", ""),
            "dvc.exp_baseline": os.environ.get("DVC_EXP_BASELINE_REV", ""),
            "seed": str(seed),
        })
        flat = {k: str(v)[:6000] for k, v in flatten(params).items()}
        items = sorted(flat.items())
        for i in range(0, len(items), 100):  # MLflow's batch limit
            mlflow.log_params(dict(items[i:i + 100]))
        handle = StageRun(active=True)
        handle.run_id = run.info.run_id
        if inputs:
            handle.log_file_hashes("input", inputs)
        yield handle
