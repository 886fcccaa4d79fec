"""MLflow lineage as a user sees it once the stages' spooled runs are replayed (fedpipe.tracking.sync):
run names, params to group by, round as the step, one parent run per pipeline execution, the
experiment marked as model training; and the UI's REST API finds them."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fedpipe.tracking import stage_item, stage_run
from fedpipe.tracking.sync import sync_pending


def test_stage_item_reads_matrix_stage_names():
    assert stage_item("federate@fedprox-0") == ("fedprox", 0)
    assert stage_item("federate_ddpm@fedddpm_plus-12") == ("fedddpm_plus", 12)
    assert stage_item("evaluate") == (None, None)


def log_two_stages(tmp_path: Path) -> None:
    with stage_run("federate@fedprox-1", {"seed": 0, "run_seed": 1}, 0) as run:
        for r in (1, 2):
            run.log_round({"round": r, "clients": 5, "train_loss": 1.0 / r})
        run.log_final({"final_train_loss": 0.5, "test_accuracy": 0.9})
        (tmp_path / "curve.png").write_bytes(b"png")
        run.log_artifact(tmp_path / "curve.png", "plots")
    with stage_run("evaluate", {"study": {"seeds": [1]}}, 0):
        pass
    assert sync_pending() == 2


def test_per_client_values_are_one_metric_stepped_by_client(tracked):
    _, uri = tracked
    from mlflow.tracking import MlflowClient

    with stage_run("warmup", {"seed": 0}, 0) as run:
        run.log_per_client("client_final_loss", {2: 0.25, 0: 1.0, 1: 0.5})
    sync_pending()
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("fedpipe")
    (r,) = [r for r in client.search_runs([exp.experiment_id]) if r.info.run_name.startswith("warmup")]
    assert [(m.step, m.value) for m in client.get_metric_history(r.info.run_id, "client_final_loss")] \
        == [(0, 1.0), (1, 0.5), (2, 0.25)]
    assert not any(k.startswith("client_0") for k in r.data.metrics)


def test_runs_are_named_grouped_and_stepped(tracked):
    tmp_path, uri = tracked
    from mlflow.tracking import MlflowClient

    log_two_stages(tmp_path)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("fedpipe")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {"federate@fedprox-1 · workspace", "evaluate · workspace", "pipeline · workspace"}
    fed = runs["federate@fedprox-1 · workspace"]
    assert fed.data.params["algorithm"] == "fedprox" and fed.data.params["run_seed"] == "1"
    assert "round" not in fed.data.metrics and "clients" not in fed.data.metrics
    assert [(m.step, m.value) for m in client.get_metric_history(fed.info.run_id, "train_loss")] == \
        [(1, 1.0), (2, 0.5)]
    assert set(fed.data.metrics) >= {"final_train_loss", "final_test_accuracy"}
    assert "final_final_train_loss" not in fed.data.metrics
    parent = runs["pipeline · workspace"].info.run_id
    assert fed.data.tags["mlflow.parentRunId"] == parent
    assert runs["evaluate · workspace"].data.tags["mlflow.parentRunId"] == parent
    assert int(fed.data.tags["torch.threads"]) >= 1
    # another params.yaml is another pipeline execution: another parent
    (tmp_path / "params.yaml").write_text("seed: 1\n")
    with stage_run("plan", {}, 1) as run:
        run.log_metrics({"x": 1.0})  # a stage that logs nothing makes no parent run
    sync_pending()
    (plan,) = client.search_runs([exp.experiment_id], "attributes.run_name = 'plan · workspace'")
    assert plan.data.tags["mlflow.parentRunId"] != parent
    assert fed.data.tags["fedpipe.stand_in"] == plan.data.tags["fedpipe.stand_in"] == "false"
    # a run on stand-in data says so (dataset.stand_in: its numbers measure cost and plumbing)
    (tmp_path / "params.yaml").write_text("seed: 1\ndataset: {name: cifar10, stand_in: true}\n")
    with stage_run("partition@1", {}, 1) as run:
        run.log_metrics({"clients": 5.0})
    sync_pending()
    (part,) = client.search_runs([exp.experiment_id],
                                 "attributes.run_name = 'partition@1 · workspace'")
    assert part.data.tags["fedpipe.stand_in"] == "true"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(port: int, path: str, body: dict | None = None) -> dict:
    url = f"http://127.0.0.1:{port}/api/2.0/mlflow/{path}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=60) as resp:
        return resp.read()


def test_the_ui_of_a_moved_repository_finds_runs_by_name_with_history_and_artifacts(
        repo, tmp_path, monkeypatch):
    """Runs logged in one place; the repository copied elsewhere and the original deleted; the
    documented UI command (`python -m fedpipe.tracking.ui`, `make ui`) started in the copy serves
    the runs, their history and their artifacts through its REST API; a run still spooled (no
    report stage replayed it) is replayed by the UI command before the UI opens."""
    log_two_stages(repo)
    new = tmp_path / "moved"
    move(repo, new, monkeypatch)
    with stage_run("plan", {}, 0) as run:  # spooled in the new place, not replayed
        run.log_metrics({"late": 1.0})
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "fedpipe.tracking.ui", "--host", "127.0.0.1",
                               "--port", str(port), "--workers", "1"],
                              cwd=new, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"})
    try:
        deadline = time.monotonic() + 300  # a few seconds on an idle machine; minutes on a loaded one
        while True:
            try:
                exp = api(port, "experiments/get-by-name?experiment_name=fedpipe")["experiment"]
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("mlflow ui did not start")
                time.sleep(0.5)
        assert exp["artifact_location"] == (new / "mlruns" / "fedpipe").as_posix()
        found = api(port, "runs/search", {"experiment_ids": [exp["experiment_id"]],
                                          "filter": "attributes.run_name = "
                                                    "'federate@fedprox-1 · workspace'"})["runs"]
        assert len(found) == 1
        run_id = found[0]["info"]["run_id"]
        params = {p["key"]: p["value"] for p in found[0]["data"]["params"]}
        assert params["algorithm"] == "fedprox"
        hist = api(port, f"metrics/get-history?run_id={run_id}&metric_key=train_loss")["metrics"]
        assert [(m["step"], m["value"]) for m in hist] == [(1, 1.0), (2, 0.5)]
        arts = api(port, f"artifacts/list?run_id={run_id}&path=plots")["files"]
        assert [a["path"] for a in arts] == ["plots/curve.png"]
        assert get(port, f"get-artifact?path=plots/curve.png&run_uuid={run_id}") == b"png"
        (late,) = api(port, "runs/search", {"experiment_ids": [exp["experiment_id"]],
                                            "filter": "attributes.run_name = 'plan · workspace'"})["runs"]
        assert [m["value"] for m in late["data"]["metrics"]] == [1.0]
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=30)
    # the fedprox and evaluate runs and their parent run
    assert f": artifact locations moved from {repo} to {new} (3 runs)" in out, out
    assert "synced 1 spooled run(s)" in out, out
    assert not list((new / "mlspool").glob("*.jsonl"))
    assert not repo.exists()


def test_fedpipe_threads_sets_torchs_thread_count(monkeypatch):
    import torch

    from fedpipe.cli import set_threads
    from fedpipe.config import ConfigError

    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("FEDPIPE_THREADS", "1")
        set_threads()
        assert torch.get_num_threads() == 1
        for bad in ("0", "two", "-3"):
            monkeypatch.setenv("FEDPIPE_THREADS", bad)
            with pytest.raises(ConfigError, match="FEDPIPE_THREADS"):
                set_threads()
    finally:
        torch.set_num_threads(before)


def test_a_queued_experiments_runs_go_to_the_projects_database(tmp_path, monkeypatch):
    from fedpipe.tracking import repo_root, tracking_uri

    work = tmp_path / "proj" / ".dvc" / "tmp" / "exps" / "tmpab12" / "sub"
    work.mkdir(parents=True)
    assert repo_root(work) == (tmp_path / "proj").resolve()
    assert repo_root(tmp_path) == tmp_path.resolve()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(work)
    assert tracking_uri() == f"sqlite:///{(tmp_path / 'proj').resolve() / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://team:5000")
    assert tracking_uri() == "http://team:5000"


# --- artifact locations follow the repository ------------------------------------------------------

@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A repository logging to its own mlflow.db (no MLFLOW_TRACKING_URI), as `dvc repro` does."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "params.yaml").write_text("seed: 0\n")
    monkeypatch.chdir(root)
    monkeypatch.setenv("FEDPIPE_TRACKING", "on")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DVC_EXP_NAME", "")
    return root


def move(src: Path, dst: Path, monkeypatch) -> None:
    import shutil

    shutil.copytree(src, dst)
    shutil.rmtree(src)
    monkeypatch.chdir(dst)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # mlflow.set_tracking_uri sets it


def fedprox_run(client, exp_id: str):
    (run,) = client.search_runs([exp_id], "attributes.run_name = 'federate@fedprox-1 · workspace'")
    return run


def test_artifacts_of_a_queued_experiment_land_in_the_project_not_its_temporary_copy(repo,
                                                                                      monkeypatch):
    from mlflow.tracking import MlflowClient

    work = repo / ".dvc" / "tmp" / "exps" / "tmpab12"
    work.mkdir(parents=True)
    (work / "params.yaml").write_text("seed: 0\n")
    monkeypatch.chdir(work)
    log_two_stages(work)  # the first run ever: it creates the experiment from the temporary copy
    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("fedpipe")
    assert exp.artifact_location == (repo / "mlruns" / "fedpipe").as_posix()
    assert exp.tags["fedpipe.repo_root"] == repo.as_posix()
    run = fedprox_run(client, exp.experiment_id)
    assert run.info.artifact_uri.startswith(f"{repo}/mlruns/fedpipe/")
    assert (repo / "mlruns" / "fedpipe" / run.info.run_id / "artifacts/plots/curve.png").is_file()
    assert not (work / "mlruns").exists()


def test_a_moved_repository_logs_into_its_new_place_and_finds_its_old_artifacts(repo, tmp_path,
                                                                                monkeypatch):
    from mlflow.tracking import MlflowClient

    log_two_stages(repo)
    new = tmp_path / "elsewhere" / "repo2"
    move(repo, new, monkeypatch)
    with stage_run("federate@fedavg-0", {"seed": 0}, 0) as run:  # a stage of the moved copy
        (new / "late.png").write_bytes(b"late")
        run.log_artifact(new / "late.png", "plots")
    sync_pending()
    assert not repo.exists()  # nothing recreated at the old place
    client = MlflowClient(tracking_uri=f"sqlite:///{new / 'mlflow.db'}")
    exp = client.get_experiment_by_name("fedpipe")
    assert exp.artifact_location == (new / "mlruns" / "fedpipe").as_posix()
    assert exp.tags["fedpipe.repo_root"] == new.as_posix()
    for r in client.search_runs([exp.experiment_id]):
        assert r.info.artifact_uri.startswith(f"{new}/mlruns/fedpipe/"), r.info.artifact_uri
    old_run = fedprox_run(client, exp.experiment_id)
    assert [a.path for a in client.list_artifacts(old_run.info.run_id, "plots")] == ["plots/curve.png"]
    got = client.download_artifacts(old_run.info.run_id, "plots/curve.png", str(tmp_path))
    assert Path(got).read_bytes() == b"png"


def test_relocate_adopts_an_untagged_database_without_losing_artifacts(tmp_path, monkeypatch):
    """A database from before the tag: its locations `<old>/mlruns/<id>` are adopted when the
    artifacts are not at the old place any more, and left alone while they still are."""
    import shutil
    import sqlite3

    import mlflow

    from fedpipe.tracking.locations import ROOT_TAG, relocate

    old = tmp_path / "old"
    old.mkdir()
    monkeypatch.chdir(old)  # MLflow's own "Default" experiment goes to old/mlruns/0 (never written)
    db = old / "mlflow.db"
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp_id = client.create_experiment("legacy", artifact_location=str(old / "mlruns" / "7"))
    run = client.create_run(exp_id)
    (tmp_path / "a.txt").write_text("a")
    client.log_artifact(run.info.run_id, str(tmp_path / "a.txt"))
    client.create_experiment("remote", artifact_location="s3://bucket/x")

    new = tmp_path / "new"
    shutil.copytree(old, new)

    def moved_legacy():
        return [m for m in relocate(new / "mlflow.db") if m.experiment_id == int(exp_id)]

    # "Default" has no artifacts anywhere: adopted at once; "legacy" has them at both places
    assert [m.experiment_id for m in relocate(new / "mlflow.db")] == [0, int(exp_id)]
    shutil.copy2(old / "mlflow.db", new / "mlflow.db")  # back to the untagged database
    shutil.rmtree(new / "mlruns")
    assert moved_legacy() == []  # only at the old place: keep pointing at them
    shutil.copytree(old / "mlruns", new / "mlruns")
    monkeypatch.chdir(tmp_path)
    shutil.rmtree(old)
    (moved,) = moved_legacy()
    assert (moved.old_root, moved.new_root, moved.runs) == (old.as_posix(), new.as_posix(), 1)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{new / 'mlflow.db'}")
    assert client.get_experiment(exp_id).artifact_location == (new / "mlruns" / "7").as_posix()
    assert client.get_experiment(exp_id).tags[ROOT_TAG] == new.as_posix()
    assert client.get_experiment_by_name("remote").artifact_location == "s3://bucket/x"
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["a.txt"]
    assert relocate(new / "mlflow.db") == []  # a second call has nothing to do
    con = sqlite3.connect(new / "mlflow.db")
    stored = [r[0] for r in con.execute("SELECT artifact_uri FROM runs")]
    con.close()
    assert stored == [f"{new}/mlruns/7/{run.info.run_id}/artifacts"]


def test_the_documented_ui_commands_are_the_tested_one():
    """README and `make ui` start the UI through `python -m fedpipe.tracking.ui`, the command the
    moved-repository test drives; plain `mlflow ui` is mentioned only with its caveat."""
    root = Path(__file__).resolve().parents[1]
    readme = root / "README.md"
    text = " ".join(readme.read_text().split())
    assert "`make ui` (or `python -m fedpipe.tracking.ui [--port 5001]`" in text
    assert "`mlflow ui --backend-store-uri sqlite:///mlflow.db` works too, but does not rewrite them" \
        in text
    make = (root / "Makefile").read_text()
    assert "\nui: $(STAMP)\n\t$(BIN)/python -m fedpipe.tracking.ui $(UI_ARGS)\n" in make


def test_the_claims_table_is_an_artifact_of_the_parent_run(tracked):
    """The report stage logs claims.md on the pipeline's parent run, beside the stage runs."""
    tmp_path, uri = tracked
    from mlflow.tracking import MlflowClient

    (tmp_path / "claims.md").write_text("# Study s: claims\n| claim | verdict |\n")
    with stage_run("report", {"study": {"seeds": [0, 1, 2]}}, 0) as run:
        run.log_parent_artifact(tmp_path / "claims.md", "claims")
    sync_pending()
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("fedpipe")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    report_id = runs["report · workspace"].info.run_id
    parent_id = runs["pipeline · workspace"].info.run_id
    assert runs["report · workspace"].data.tags["mlflow.parentRunId"] == parent_id
    assert [a.path for a in client.list_artifacts(parent_id, "claims")] == ["claims/claims.md"]
    assert client.list_artifacts(report_id, "claims") == []
    got = client.download_artifacts(parent_id, "claims/claims.md", str(tmp_path / "dl"))
    assert Path(got).read_text().startswith("# Study s: claims")


def test_the_parent_run_is_the_study_with_its_params_claims_and_how_it_ended(tracked):
    """Named `<study> · <experiment>`, the whole params.yaml as params, FAILED when a stage fails,
    FINISHED with the claim counts as metrics when the report ends it; every stage run carries the
    dataset and partition it ran on (to compare a Dirichlet-alpha sweep run by run)."""
    tmp_path, uri = tracked
    from mlflow.tracking import MlflowClient

    (tmp_path / "params.yaml").write_text(
        "seed: 0\ndataset: {name: digits}\npartition: {scheme: dirichlet, alpha: 0.1}\n"
        "study: {name: classification, seeds: [0]}\nfl: {rounds: 3}\n")
    with pytest.raises(RuntimeError):
        with stage_run("federate@fedavg-0", {"fl": {"rounds": 3}}, 0):
            raise RuntimeError("a stage fails")
    # no sync here: the failing stage replayed its run (and the parent's status) on its way out
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("fedpipe")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    parent = runs["classification · workspace"]
    assert parent.info.status == "FAILED"
    assert parent.data.params["partition.alpha"] == "0.1" and parent.data.params["fl.rounds"] == "3"
    assert parent.data.tags["study"] == "classification"
    fed = runs["federate@fedavg-0 · workspace"]
    assert fed.info.status == "FAILED" and fed.data.params["partition.alpha"] == "0.1"
    assert fed.data.params["dataset.name"] == "digits"
    assert fed.data.params["study.name"] == "classification"
    with stage_run("report", {"study": {"seeds": [0]}}, 0) as run:
        run.log_parent_metrics({"claims.held": 2, "claims.not_shown": 1})
        run.finish_parent()
    sync_pending()
    parent = client.get_run(parent.info.run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics == {"claims.held": 2.0, "claims.not_shown": 1.0}


def test_make_ui_prints_the_runs_table_of_the_projects_experiment(tracked):
    """MLflow 3's home page is its GenAI page: the UI command names the runs table's address."""
    tmp_path, uri = tracked
    from fedpipe.tracking.ui import runs_table_url

    assert runs_table_url(uri, []) is None  # nothing logged yet
    with stage_run("partition@0", {}, 0) as run:
        run.log_metrics({"clients": 5})
    sync_pending()
    from mlflow.tracking import MlflowClient

    exp_id = MlflowClient(tracking_uri=uri).get_experiment_by_name("fedpipe").experiment_id
    assert runs_table_url(uri, []) == f"http://127.0.0.1:5000/#/experiments/{exp_id}/runs"
    assert runs_table_url(uri, ["--port", "5001", "--host", "0.0.0.0"]) == \
        f"http://0.0.0.0:5001/#/experiments/{exp_id}/runs"


def test_make_ui_stores_its_views_on_the_experiment(tracked):
    """The runs table and the compare view are MLflow's shared view states, experiment tags the UI
    loads by the key in the printed address; written again on each start (an older one replaced)."""
    tmp_path, uri = tracked
    from mlflow.tracking import MlflowClient

    from fedpipe.tracking.ui import COMPARE_KEY, RUNS_KEY, view_states, view_url, write_views

    assert write_views(uri) is None  # no experiment yet
    with stage_run("federate@fedavg-0", {"fl": {"rounds": 1}}, 0) as run:
        run.log_round({"round": 1, "train_loss": 0.5})
    sync_pending()
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.get_experiment_by_name("fedpipe").experiment_id
    client.set_experiment_tag(exp_id, f"mlflow.sharedViewState.{COMPARE_KEY}", "an older layout")
    assert write_views(uri) == exp_id
    tags = client.get_experiment(exp_id).tags
    for key in (RUNS_KEY, COMPARE_KEY):
        assert json.loads(tags[f"mlflow.sharedViewState.{key}"]) == view_states()[key]
    compare = view_states()[COMPARE_KEY]
    charts = compare["compareRunCharts"]
    assert {c["metricSectionId"] for c in charts} == {s["uuid"] for s in compare["compareRunSections"]}
    assert len({c["uuid"] for c in charts}) == len(charts)
    runs = f"http://h:1/#/experiments/{exp_id}/runs"
    assert view_url(runs, COMPARE_KEY) == f"{runs}?compareRunsMode=CHART&viewStateShareKey={COMPARE_KEY}"
    assert view_url(runs, RUNS_KEY) == f"{runs}?compareRunsMode=TABLE&viewStateShareKey={RUNS_KEY}"


VARYING = {  # name: (the parent runs' params, the columns)
    "one experiment": ([{"study.name": "s", "fl.rounds": "3"}], []),
    "a sweep of one param": ([{"study.name": "s", "seed": "0", "fl.local.lr": "0.01"},
                              {"study.name": "s", "seed": "0", "fl.local.lr": "0.05"},
                              {"study.name": "s", "seed": "0", "fl.local.lr": "0.05"}],
                             ["fl.local.lr"]),
    "two params": ([{"study.name": "s", "partition.alpha": "0.1", "fl.rounds": "3"},
                    {"study.name": "s", "partition.alpha": "0.5", "fl.rounds": "6"}],
                   ["fl.rounds", "partition.alpha"]),
    "a param one experiment adds": ([{"study.name": "s"}, {"study.name": "s", "extra.k": "1"}],
                                    ["extra.k"]),
    "two studies, each alone": ([{"study.name": "a", "fl.rounds": "3"},
                                 {"study.name": "b", "fl.rounds": "9"}], []),
    "more than the cap": ([{"study.name": "s", **{f"k{i:02d}": "0" for i in range(20)}},
                           {"study.name": "s", **{f"k{i:02d}": "1" for i in range(20)}}],
                          [f"k{i:02d}" for i in range(12)]),
}


@pytest.mark.parametrize("name", VARYING)
def test_the_params_that_vary_between_a_studys_experiments(name):
    from fedpipe.tracking.ui import MAX_VARYING, varying_params

    parents, want = VARYING[name]
    assert varying_params(parents) == want
    assert len(want) <= MAX_VARYING


def test_the_stored_views_have_a_column_per_param_a_sweep_varies(tracked, monkeypatch, capsys):
    """Two experiments of one study, `-S fl.local.lr=...` apart: the runs table and the compare
    view show fl.local.lr beside study.name, and make ui names the column; the params both share
    (fl.rounds) get none."""
    tmp_path, uri = tracked
    from mlflow.tracking import MlflowClient

    from fedpipe.tracking.ui import COMPARE_KEY, RUNS_KEY, _prepare_ui

    for exp, lr in (("lr-lo", 0.01), ("lr-hi", 0.05)):
        (tmp_path / "params.yaml").write_text(
            f"seed: 0\nstudy: {{name: sweep}}\nfl: {{rounds: 3, local: {{lr: {lr}}}}}\n")
        monkeypatch.setenv("DVC_EXP_NAME", exp)
        with stage_run("federate@fedavg-0", {"fl": {"local": {"lr": lr}}}, 0) as run:
            run.log_final({"test_accuracy": lr * 10})
    _prepare_ui(uri, [])
    assert "params that vary between a study's experiments: fl.local.lr" in capsys.readouterr().out
    client = MlflowClient(tracking_uri=uri)
    tags = client.get_experiment_by_name("fedpipe").tags
    for key in (RUNS_KEY, COMPARE_KEY):
        columns = json.loads(tags[f"mlflow.sharedViewState.{key}"])["selectedColumns"]
        at = columns.index("params.`study.name`")
        assert columns[at + 1] == "params.`fl.local.lr`", columns
        assert "params.`fl.rounds`" not in columns
