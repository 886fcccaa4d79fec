"""MLflow lineage for stage runs.

Embedded by default (``mlflow.db`` in the repo root, also for a queued ``dvc exp`` that runs in a
temporary copy of the repo; first writes to a new database are serialised by a file lock, so
experiments started together do not race on its schema); ``MLFLOW_TRACKING_URI`` points at a team
server instead; ``FEDPIPE_TRACKING=off`` disables logging (tests use a temporary URI instead).
Each run records: git commit and dirty flag, DVC stage name, DVC experiment name and baseline (when
run by ``dvc exp run``), the hashes of its input and output files, the resolved params and the seed,
and the torch thread count and worker processes it ran with (results are bit-identical only for the
same thread count).

In the UI: the experiment is marked as model training (``mlflow.experimentKind``), so it opens on the
runs table. A run is named ``<stage> · <experiment>`` (``federate@fedprox-0 · workspace``, or the DVC
experiment's name) and has ``algorithm`` and ``run_seed`` params where the stage has them, so the
compare view can group by them. The runs of one pipeline execution (same commit, same params.yaml,
same DVC experiment) hang under one parent run named ``pipeline · <experiment>``. Per-round records
use the round as MLflow's step.

Artifacts of a local database live beside it, in ``mlruns/``; the stored locations follow the
repository when it is moved or copied (:mod:`fedpipe.tracking.locations`): they are rewritten to the
current root before a stage logs and before the UI starts (``python -m fedpipe.tracking.ui``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
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
        self.parent_run_id: str | None = None  # the pipeline execution's run (None: no params.yaml)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self.active:
            import mlflow

            clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
            mlflow.log_metrics(clean, step=step)

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

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if self.active:
            import mlflow

            mlflow.log_artifact(str(path), artifact_path=artifact_path)

    def log_parent_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """A file of the study as a whole (the claims table) on the pipeline's parent run, where the
        runs of one execution hang; on this run when there is no parent."""
        if not self.active:
            return
        import mlflow

        if self.parent_run_id is None:
            mlflow.log_artifact(str(path), artifact_path=artifact_path)
        else:
            mlflow.MlflowClient().log_artifact(self.parent_run_id, str(path), artifact_path)

    def log_parent_metrics(self, metrics: Mapping[str, float]) -> None:
        """The study's own numbers (the claims summary) on the pipeline's parent run, so that the
        runs table compares studies and experiments by them; on this run when there is no parent."""
        if not self.active:
            return
        if self.parent_run_id is None:
            self.log_metrics(metrics)
            return
        import mlflow
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        mlflow.MlflowClient().log_batch(self.parent_run_id, metrics=[
            Metric(k, float(v), now, 0) for k, v in metrics.items() if isinstance(v, (int, float))])

    def finish_parent(self, status: str = "FINISHED") -> None:
        """Set the pipeline's parent run's status: FINISHED by the last stage (``report``), FAILED
        or KILLED by a stage that fails (:func:`stage_run`), so the runs table shows how it ended."""
        if self.active and self.parent_run_id is not None:
            import mlflow

            mlflow.MlflowClient().set_terminated(self.parent_run_id, status)

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

    uri = tracking_uri()
    check_db(uri)
    mlflow.set_tracking_uri(uri)
    sha, dirty = git_state()
    exp_name = os.environ.get("DVC_EXP_NAME", "")
    study_params = _params_file()
    with _db_lock(uri):  # schema creation, the experiment and the parent run: one process at a time
        experiment = _experiment(os.environ.get("FEDPIPE_EXPERIMENT", EXPERIMENT), uri)
        parent = _pipeline_parent(experiment, sha, exp_name, study_params)
    algorithm, run_seed = stage_item(stage)
    label = exp_name or "workspace"
    # every run carries what it ran on (dataset, partition, study), so runs compare across variants
    shared = {k: study_params[k] for k in ("dataset", "partition") if k in study_params}
    study_name = (study_params.get("study") or {}).get("name")
    params = {**shared, **({"study.name": study_name} if study_name else {}), **params}
    with mlflow.start_run(run_name=f"{stage} · {label}", experiment_id=experiment) as run:
        import torch

        mlflow.set_tags({
            "mlflow.source.git.commit": sha,
            "git.dirty": str(dirty).lower(),
            "dvc.stage": stage,
            "dvc.exp_name": exp_name,
            "dvc.exp_baseline": os.environ.get("DVC_EXP_BASELINE_REV", ""),
            "seed": str(seed),
            "torch.threads": str(torch.get_num_threads()),
            "fedpipe.workers": os.environ.get("FEDPIPE_WORKERS", "one per core"),
            **({"mlflow.parentRunId": parent} if parent else {}),
        })
        if algorithm is not None:
            params = {**params, "algorithm": algorithm}
        flat = {k: str(v)[:6000] for k, v in flatten(params).items()}
        items = sorted(flat.items())
        for i in range(0, len(items), 100):  # MLflow's batch limit
            mlflow.log_params(dict(items[i:i + 100]))
        handle = StageRun(active=True)
        handle.run_id = run.info.run_id
        handle.parent_run_id = parent
        if inputs:
            handle.log_file_hashes("input", inputs)
        try:
            yield handle
        except BaseException as e:  # the experiment failed here: its parent run shows it
            handle.finish_parent("KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
            raise


def stage_item(stage: str) -> tuple[str | None, int | None]:
    """(algorithm, training seed) of a matrix stage ``<name>@<algorithm>-<seed>``, else (None, None)."""
    if "@" not in stage:
        return None, None
    algorithm, _, seed = stage.split("@", 1)[1].rpartition("-")
    return (algorithm, int(seed)) if algorithm and seed.isdigit() else (None, None)


def _experiment(name: str, uri: str) -> str:
    """The experiment's id, created if needed and marked as model training for the UI. With a local
    database, its artifacts go beside it (not into the working directory, which for a queued ``dvc
    exp`` is a temporary copy), and stored locations from before a move are rewritten first."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from fedpipe.tracking.locations import ROOT_TAG, artifact_root, new_experiment_location, relocate

    exp = mlflow.get_experiment_by_name(name)  # creates the schema of a new database
    root = artifact_root(uri)
    if root is not None:
        relocate(sqlite_db(uri))
    if exp is None:
        location = None if root is None else new_experiment_location(root, name)
        try:
            exp_id = mlflow.create_experiment(
                name, artifact_location=location,
                tags=None if root is None else {ROOT_TAG: root.as_posix()})
        except MlflowException:  # created meanwhile by a stage running beside this one
            exp_id = mlflow.get_experiment_by_name(name).experiment_id
    else:
        exp_id = exp.experiment_id
    if exp is None or exp.tags.get("mlflow.experimentKind") != "custom_model_development":
        mlflow.MlflowClient().set_experiment_tag(exp_id, "mlflow.experimentKind",
                                                 "custom_model_development")
    return exp_id


def _params_file() -> dict[str, Any]:
    """params.yaml as read by the stages ({} when absent or unreadable: the stage says why)."""
    from fedpipe.config.core import ConfigError, load_params

    try:
        return load_params()
    except (ConfigError, OSError):
        return {}


def _pipeline_parent(experiment_id: str, sha: str, exp_name: str,
                     study_params: Mapping[str, Any] | None = None) -> str | None:
    """The parent run of this pipeline execution (commit, params.yaml, DVC experiment), created by
    the first stage that logs, named ``<study> · <experiment>`` and holding the whole params.yaml as
    its params (the runs table compares experiments on it); None when there is no params.yaml."""
    import hashlib

    import mlflow
    from mlflow.entities import Param

    params_file = Path("params.yaml")
    if not params_file.is_file():
        return None
    digest = hashlib.md5(params_file.read_bytes()).hexdigest()[:12]
    key = f"{sha[:12]}-{digest}-{exp_name or 'workspace'}"
    client = mlflow.MlflowClient()
    found = client.search_runs([experiment_id], filter_string=f"tags.`{PIPELINE_TAG}` = '{key}'",
                               max_results=1)
    if found:
        return found[0].info.run_id
    study_params = _params_file() if study_params is None else study_params
    study = str((study_params.get("study") or {}).get("name", "pipeline"))
    run = client.create_run(experiment_id, run_name=f"{study} · {exp_name or 'workspace'}",
                            tags={PIPELINE_TAG: key, "mlflow.source.git.commit": sha,
                                  "dvc.exp_name": exp_name, "study": study})
    items = sorted((k, str(v)[:6000]) for k, v in flatten(study_params).items())
    for i in range(0, len(items), 100):  # MLflow's batch limit
        client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in items[i:i + 100]])
    client.set_terminated(run.info.run_id)  # FINISHED; FAILED while a stage fails, until a report
    return run.info.run_id
