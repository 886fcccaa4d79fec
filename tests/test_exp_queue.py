"""`dvc exp` as researchers run it: two queued experiments run side by side (`dvc queue start -j 2`);
each shows its params and metrics in `dvc exp show`, can be applied back completely, and lands in the
project's MLflow database; going back to earlier params restores from DVC's run-cache."""

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from repo_copy import commit_all, copy_repo, sh

pytestmark = pytest.mark.slow

# A classification-only study (the plan skips the diffusion side), a few rounds.
TINY = ["-S", "study.algorithms=[fedavg]", "-S", "study.diffusion_algorithms=[]",
        "-S", "fl.rounds=3", "-S", "fl.eval_every=1"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Iterator[tuple[Path, dict]]:
    dst = tmp_path_factory.mktemp("queue")
    env = {**copy_repo(dst), "FEDPIPE_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)  # the project's own mlflow.db
    commit_all(dst, env)
    yield dst, env
    sh(["dvc", "queue", "stop"], dst, env, check=False)  # a worker DVC left idle stops now


def start_queue(dst: Path, env: dict) -> None:
    """`dvc queue start -j 2`, its output not piped to this process: the workers it leaves in the
    background inherit its output, and a pipe would keep this call waiting until the last one exits
    (seen once: one of two workers took its shutdown message while busy and then idled for good)."""
    proc = subprocess.run(["dvc", "queue", "start", "-j", "2"], cwd=dst, env=env,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 0


def wait_for_queue(dst: Path, env: dict, timeout: float = 600) -> str:
    t0 = time.time()
    while time.time() - t0 < timeout:
        status = sh(["dvc", "queue", "status"], dst, env).stdout
        if "Running" not in status and "Queued" not in status:
            return status
        time.sleep(3)
    pytest.fail(f"queue did not finish:\n{status}")


def shown_experiments(dst: Path, env: dict) -> dict[str, dict]:
    """{experiment name: its entry} of `dvc exp show --json` (its commit, params and metrics)."""
    rows = json.loads(sh(["dvc", "exp", "show", "--json"], dst, env).stdout)
    return {e["name"]: e for row in rows for e in (row.get("experiments") or [])
            for e in [e["revs"][0]] if e.get("name")}


def exp_revs(dst: Path, env: dict) -> dict[str, str]:
    """{experiment name: its commit}."""
    return {name: e["rev"] for name, e in shown_experiments(dst, env).items()}


def test_two_queued_experiments_in_parallel_keep_everything(project):
    dst, env = project
    for lr in ("0.05", "0.1"):
        sh(["dvc", "exp", "run", "--queue", "--name", f"lr{lr}", *TINY, "-S", f"fl.local.lr={lr}"],
           dst, env)
    start_queue(dst, env)
    status = wait_for_queue(dst, env)
    assert "Failed" not in status, sh(["dvc", "queue", "logs", "lr0.05"], dst, env, check=False).stdout

    exps = shown_experiments(dst, env)
    assert set(exps) >= {"lr0.05", "lr0.1"}
    acc = {}
    for name, e in exps.items():
        data = e["data"]
        metrics = data["metrics"]["data/evaluate/metrics.json"]["data"]
        acc[name] = metrics["fedavg"]["test_accuracy"]
        assert data["params"]["params.yaml"]["data"]["fl"]["local"]["lr"] == float(name[2:])
    assert acc["lr0.05"] != acc["lr0.1"]

    # applied back completely: params, the model and the metrics files
    sh(["dvc", "exp", "apply", "lr0.1"], dst, env)
    applied = json.loads((dst / "data/evaluate/metrics.json").read_text())
    assert applied["fedavg"]["test_accuracy"] == acc["lr0.1"]
    assert (dst / "data/federate/fedavg/seed_0/history.csv").is_file()
    assert yaml.safe_load((dst / "params.yaml").read_text())["fl"]["local"]["lr"] == 0.1

    # both landed in the project's MLflow database (not in the queue's temporary copies)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{dst / 'mlflow.db'}")
    exp = client.get_experiment_by_name("fedpipe")
    names = {r.data.tags.get("dvc.exp_name") for r in client.search_runs([exp.experiment_id])}
    assert {"lr0.05", "lr0.1"} <= names
    runs = client.search_runs([exp.experiment_id], "tags.`dvc.stage` = 'federate@fedavg-0'")
    assert {r.info.run_name for r in runs} == {"federate@fedavg-0 · lr0.05", "federate@fedavg-0 · lr0.1"}
    for r in runs:  # their artifacts too: in the project's mlruns/, not in the deleted copies
        assert r.info.artifact_uri.startswith(f"{dst.resolve()}/mlruns/"), r.info.artifact_uri
        assert [a.path for a in client.list_artifacts(r.info.run_id, "plots")] == ["plots/curves.png"]

    # back to the other params: DVC's run-cache restores the training stage instead of re-running it
    commit_all(dst, env, "lr 0.1 applied")
    proc = sh(["dvc", "exp", "run", *TINY, "-S", "fl.local.lr=0.05"], dst, env)
    assert "Stage 'federate@fedavg-0' is cached - skipping run" in proc.stdout, proc.stdout
    assert json.loads((dst / "data/evaluate/metrics.json").read_text())["fedavg"]["test_accuracy"] \
        == acc["lr0.05"]


def test_readme_grid_command_queues_three_experiments(project):
    """The README's grid: `dvc exp run --queue -S partition=dirichlet -S 'partition.alpha=...'`."""
    dst, env = project
    readme = (dst / "README.md").read_text()
    line = next(x for x in readme.splitlines() if x.startswith("dvc exp run --queue"))
    cmd = line.split("#")[0].split()
    assert cmd[:4] == ["dvc", "exp", "run", "--queue"]
    args = [a.strip("'") for a in cmd]
    sh(args, dst, env)
    status = sh(["dvc", "queue", "status"], dst, env).stdout
    assert status.count("Queued") == 3, status
    sh(["dvc", "queue", "remove", "--queued"], dst, env)


def test_make_smoke_runs_the_studies_two_at_a_time_and_prints_each_ones_claims(project):
    """`make smoke` queues every smoke study as an experiment named after it, runs them two at a time
    and prints each one's claims from what the experiment committed; an experiment of that name from
    before (a `dvc exp save` here, as an earlier `make smoke` leaves one) is replaced."""
    from repo_copy import BIN

    dst, env = project
    studies = ["equitable_smoke", "fednh_smoke"]
    # one replicate, one method, one round: the recipe, not the studies (their claims go unjudged)
    make = ["make", "--no-print-directory", "smoke", "STAMP=", f"BIN={BIN}",
            f"SMOKE_STUDIES={' '.join(studies)}",
            "SMOKE_ARGS=-S study.seeds=[0] -S study.algorithms=[fedavg] -S fl.rounds=1"]
    env = {k: v for k, v in env.items() if k != "FEDPIPE_THREADS"}  # the recipe's default: 1
    for s in studies:
        sh(["dvc", "exp", "save", "--name", s], dst, env)
    saved = exp_revs(dst, env)
    assert set(studies) <= set(saved)
    proc = sh(make, dst, env)
    out = proc.stdout
    for s in studies:
        assert f"== study={s}\n{s}:data/report/claims.json: 0 of " in out, out
    listed = sh(["dvc", "exp", "list", "--name-only"], dst, env).stdout.split()
    assert sorted(n for n in listed if n in studies) == studies, listed  # once each, not twice
    now = exp_revs(dst, env)
    assert all(now[s] != saved[s] for s in studies), (saved, now)  # replaced, not kept
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{dst / 'mlflow.db'}")
    exp = client.get_experiment_by_name("fedpipe")
    runs = client.search_runs([exp.experiment_id], "tags.`dvc.stage` = 'federate@fedavg-0'")
    threads = {r.data.tags.get("dvc.exp_name"): r.data.tags.get("torch.threads") for r in runs}
    assert threads.get("equitable_smoke") == "1" and threads.get("fednh_smoke") == "1", threads
    spans = {}  # each study's stage runs, first start to last end: the two overlap (side by side)
    for r in client.search_runs([exp.experiment_id], "tags.`dvc.stage` LIKE '%'"):
        name = r.data.tags.get("dvc.exp_name")
        if name in studies:
            lo, hi = spans.get(name, (r.info.start_time, r.info.end_time))
            spans[name] = (min(lo, r.info.start_time), max(hi, r.info.end_time))
    (a0, a1), (b0, b1) = spans["equitable_smoke"], spans["fednh_smoke"]
    assert a0 < b1 and b0 < a1, spans

    bad = sh([str(BIN / "python"), "-m", "fedpipe.claims", "--exp", "no_such_exp"], dst, env, check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "no claims in experiment 'no_such_exp'" in bad.stderr
