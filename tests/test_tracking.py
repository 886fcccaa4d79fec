"""MLflow lineage as a user sees it: run names, params to group by, round as the step, one parent run
per pipeline execution, the experiment marked as model training; and the UI's REST API finds them."""

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


@pytest.fixture
def tracked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("seed: 0\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("FEDPIPE_TRACKING", "on")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("DVC_EXP_NAME", "")
    return tmp_path, uri


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
    with stage_run("plan", {}, 1):
        pass
    (plan,) = client.search_runs([exp.experiment_id], "attributes.run_name = 'plan · workspace'")
    assert plan.data.tags["mlflow.parentRunId"] != parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(port: int, path: str, body: dict | None = None) -> dict:
    url = f"http://127.0.0.1:{port}/api/2.0/mlflow/{path}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_the_ui_rest_api_finds_runs_by_name_with_history_and_artifacts(tracked):
    tmp_path, uri = tracked
    log_two_stages(tmp_path)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ})
    try:
        for _ in range(120):
            try:
                exp = api(port, "experiments/get-by-name?experiment_name=fedpipe")["experiment"]
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("mlflow server did not start")
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
    finally:
        server.terminate()
        server.wait(timeout=30)


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
