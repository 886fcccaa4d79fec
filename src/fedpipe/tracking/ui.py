"""``python -m fedpipe.tracking.ui [mlflow ui options]`` (``make ui``): the MLflow UI on the project's
runs, wherever the repository now lies.

Before starting ``mlflow ui`` on the project's database (``MLFLOW_TRACKING_URI`` if it is a local
SQLite one, else ``<repo>/mlflow.db``), the stored artifact locations are rewritten to the current
repository root (:func:`fedpipe.tracking.locations.relocate`), under the database's file lock, so a
moved or copied repository still shows its runs' artifacts. Extra arguments go to ``mlflow ui``
(``--port 5001``, ``--host 0.0.0.0``). It prints the address of the ``fedpipe`` experiment's runs
table, since MLflow 3 opens on its GenAI home page, and of its compare view: two views fedpipe
keeps on that experiment (:func:`view_states`, through MLflow's own shared-view mechanism: an
experiment tag the UI loads by its key), each with a column per param that varies between a
study's experiments (:func:`varying_params`: what a sweep's ``-S`` overrides changed), computed
from the runs each time it starts. Spooled runs that no stage replayed yet (a
pipeline stopped before its report, a stage still running) are replayed first
(:func:`fedpipe.tracking.sync.sync_pending`; a running stage's file is left to it). A database
that cannot be read (garbage, truncated) or written (a read-only file or folder), or a replay that
the store stops, ends it with one line naming the file and what to do, and exit code 1.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Mapping, Sequence

from fedpipe.errors import InputError
from fedpipe.tracking import (
    _db_lock,
    check_db,
    check_writable,
    experiment_name,
    sqlite_db,
    tracking_uri,
)
from fedpipe.tracking.locations import relocate, sqlite_path
from fedpipe.tracking.sync import ReplayError


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
                              (experiment_name(),)).fetchone()
        except sqlite3.Error:
            return None
    if row is None:
        return None
    opts = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--host", "--port")}
    host = opts.get("--host", "127.0.0.1")
    return f"http://{host}:{opts.get('--port', '5000')}/#/experiments/{row[0]}/runs"


# Two views of the runs page, stored as MLflow's shared view state (experiment tag
# ``mlflow.sharedViewState.<key>``, opened by ``?viewStateShareKey=<key>``); without them MLflow opens
# on its default columns, and its compare page on the alphabetically first param and metric.
# - "fedpipe-runs", the runs table: each pipeline execution's parent run with its study, the params
#   that vary between the study's experiments (varying_params: a sweep's -S keys) and its claim
#   counts; expanded, its stage runs with their algorithm, replicate, final metric and whole
#   training time across resumes (train_seconds_total, fedpipe.fl.engine.SECONDS_FILE).
# - "fedpipe-compare", chart mode: the training stages' runs only (federate@..., federate_ddpm@...;
#   MLflow adds their parent's row), grouped by algorithm within each DVC experiment (a study's
#   replicates pool into one mean; two variants, such as two Dirichlet alphas, stay apart).
RUNS_KEY, COMPARE_KEY = "fedpipe-runs", "fedpipe-compare"
COMPARE_FILTER = "attributes.run_name LIKE 'federate%'"
#: (chart type, metric): the classification track's accuracy and the diffusion track's FID, final
#: (a bar per group: the mean over its replicates) and by round; a track a study does not run has no
#: values, and its charts are hidden (hideEmptyCharts).
COMPARE_CHARTS = (("BAR", "final_test_accuracy"), ("LINE", "test_accuracy"),
                  ("BAR", "final_fid"), ("LINE", "test_fid"))
#: the columns of each view (MLflow's canonical column keys)
RUNS_COLUMNS = ("params.`study.name`", "metrics.`claims.held`", "metrics.`claims.not_shown`",
                "metrics.`claims.contradicted`", "metrics.`claims.claims`", "params.`algorithm`",
                "params.`run_seed`", "metrics.`final_test_accuracy`", "metrics.`final_fid`",
                "metrics.`train_seconds_total`")
COMPARE_COLUMNS = ("params.`algorithm`", "params.`run_seed`", "params.`study.name`",
                   "metrics.`final_test_accuracy`", "metrics.`final_fid`")


def _chart(i: int, kind: str, key: str, section: str) -> dict:
    chart = {"uuid": f"fedpipe-chart-{i}", "type": kind, "runsCountToCompare": 100,
             "metricSectionId": section, "deleted": False, "isGenerated": False, "metricKey": key}
    if kind == "LINE":
        chart |= {"selectedMetricKeys": [key], "lineSmoothness": 0, "xAxisScaleType": "linear",
                  "scaleType": "linear", "range": {}, "xAxisKey": "step",
                  "selectedXAxisMetricKey": "", "yAxisKey": "metric", "yAxisExpressions": [],
                  "ignoreOutliers": False, "useGlobalXaxisKey": False,
                  "useGlobalLineSmoothing": True}
    return chart


MAX_VARYING = 12
"""At most this many columns for the params that vary between a study's experiments (the first by
name), so that the table keeps its claim counts and metrics in view."""


def varying_params(parents: Iterable[Mapping[str, str]]) -> list[str]:
    """The params (of the pipeline's parent runs: the whole params.yaml each) whose values differ
    between experiments of one study (same ``study.name``): what a sweep varies (``-S
    partition.alpha=0.1``, ``-S fl.local.lr=0.05``) and nothing that all its experiments share. A
    param that one experiment lacks (``+key=value``) differs too. ``study.name`` itself, which is a
    column anyway, is not one. Sorted by name, at most :data:`MAX_VARYING`."""
    studies: dict[str, list[Mapping[str, str]]] = {}
    for params in parents:
        studies.setdefault(params.get("study.name", ""), []).append(params)
    keys: set[str] = set()
    for runs in studies.values():
        if len(runs) > 1:
            keys |= {k for k in set().union(*runs) if len({r.get(k) for r in runs}) > 1}
    return sorted(keys - {"study.name"})[:MAX_VARYING]


def parent_params(client, experiment_id: str) -> list[dict[str, str]]:
    """The params of every active pipeline parent run (tag ``fedpipe.pipeline``) of the experiment."""
    from fedpipe.tracking import PIPELINE_TAG

    out, token = [], None
    while True:
        page = client.search_runs([experiment_id], f"tags.`{PIPELINE_TAG}` LIKE '%'",
                                  max_results=1000, page_token=token)
        out += [dict(r.data.params) for r in page if PIPELINE_TAG in r.data.tags]
        token = page.token
        if not token:
            return out


def _with_params(columns: Sequence[str], params: Sequence[str]) -> list[str]:
    """``columns`` with a column per param of ``params`` after ``study.name``'s."""
    at = columns.index("params.`study.name`") + 1
    extra = [f"params.`{k}`" for k in params if f"params.`{k}`" not in columns]
    return [*columns[:at], *extra, *columns[at:]]


def view_states(varying: Sequence[str] = ()) -> dict[str, dict]:
    """{share key: the view as MLflow's experiment page state (search facets and UI state)}; both
    views have a column per param of ``varying`` (:func:`varying_params`)."""
    base = {"orderByKey": "attributes.start_time", "orderByAsc": False, "startTime": "ALL",
            "lifecycleFilter": "Active"}
    section = "fedpipe-section"
    return {
        RUNS_KEY: base | {"searchFilter": "",
                          "selectedColumns": _with_params(RUNS_COLUMNS, varying)},
        COMPARE_KEY: base | {
            "searchFilter": COMPARE_FILTER,
            "selectedColumns": _with_params(COMPARE_COLUMNS, varying),
            "groupBy": {"aggregateFunction": "average",
                        "groupByKeys": [{"mode": "param", "groupByData": "algorithm"},
                                        {"mode": "tag", "groupByData": "dvc.exp_name"}]},
            "useGroupedValuesInCharts": True, "hideEmptyCharts": True,
            "compareRunCharts": [_chart(i, kind, key, section)
                                 for i, (kind, key) in enumerate(COMPARE_CHARTS)],
            "compareRunSections": [{"uuid": section, "name": "fedpipe", "display": True,
                                    "isReordered": False, "deleted": False, "isGenerated": False}]},
    }


def write_views(uri: str) -> str | None:
    """Store the views on experiment ``fedpipe`` (replacing older ones), with a column per param
    that varies between a study's experiments as the runs are now; its experiment id, or None
    before the first run."""
    return write_views_varying(uri)[0]


def write_views_varying(uri: str) -> tuple[str | None, list[str]]:
    """:func:`write_views`, and the varying params it gave columns."""
    import json

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment_name())
    if exp is None:
        return None, []
    varying = varying_params(parent_params(client, exp.experiment_id))
    with _db_lock(uri):
        for key, state in view_states(varying).items():
            client.set_experiment_tag(exp.experiment_id, f"mlflow.sharedViewState.{key}",
                                      json.dumps(state, separators=(",", ":")))
    return exp.experiment_id, varying


def view_url(runs_url: str, key: str) -> str:
    """The address of view ``key`` of the runs page at ``runs_url``."""
    mode = "CHART" if key == COMPARE_KEY else "TABLE"
    return f"{runs_url}?compareRunsMode={mode}&viewStateShareKey={key}"


def main(argv: list[str] | None = None) -> None:
    """Check the database, move its locations, replay the spool, store the views, then become
    ``mlflow ui``. A database that cannot be read or written, or a replay the store stops, ends
    here with one line naming the file and what to do (exit code 1), never a traceback."""
    argv = sys.argv[1:] if argv is None else argv
    uri = tracking_uri()
    if sqlite_path(uri) is None:
        sys.exit(f"error: MLFLOW_TRACKING_URI={uri} is a server: open it in a browser instead")
    uri = f"sqlite:///{sqlite_path(uri).resolve()}"
    try:
        _prepare_ui(uri, argv)
    except (InputError, ReplayError) as e:
        sys.exit(f"error: {e}")
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, *argv]
    os.execv(sys.executable, cmd)


def _prepare_ui(uri: str, argv: list[str]) -> None:
    """Everything before the UI starts: the database checked, its locations moved, the spool
    replayed, the views stored and their addresses printed. The database's problems raise
    InputError, the store's ReplayError."""
    import sqlite3

    from fedpipe.tracking.sync import sync_pending

    check_db(uri)  # garbage or truncated: one line naming it
    check_writable(uri)  # read-only file or folder: likewise
    try:
        moved = prepare(uri)
    except sqlite3.Error as e:  # locked for longer than the wait, or the disk failed
        raise InputError(sqlite_db(uri), f"its artifact locations cannot be updated ({e}); "
                         "close what holds it and try again", None) from None
    for line in moved:  # before the sync, which would move them without a word
        print(line, flush=True)
    synced = sync_pending(uri, strict=True)  # the stages' spooled runs no report replayed yet
    if synced:
        print(f"synced {synced} spooled run(s)", flush=True)
    url = runs_table_url(uri, argv)
    if url is not None:
        try:
            _, varying = write_views_varying(uri)
        except Exception as e:  # noqa: BLE001 (MLflow's own errors: the store failed)
            raise ReplayError(f"the views cannot be stored in {sqlite_db(uri)} "
                              f"({type(e).__name__}: {(str(e).splitlines() or [''])[0]})") from None
        if varying:
            print(f"columns for the params that vary between a study's experiments: "
                  f"{', '.join(varying)}", flush=True)
        print(f"the project's runs: {view_url(url, RUNS_KEY)}", flush=True)
        print(f"compare them (charts, grouped by algorithm): {view_url(url, COMPARE_KEY)}",
              flush=True)


if __name__ == "__main__":
    main()
