"""End to end: the README's quick start (`make run`, i.e. `dvc repro`) in a temporary copy of the
repo, then the README's `dvc exp show` recipe on the committed results; a second repro re-runs
nothing but the always-changed plan stage, and `dvc exp run -S partition=dirichlet -S
partition.alpha=0.05` composes new params with Hydra and gives a new partition; changing one
algorithm's params re-runs only its federate stage and evaluate.
MLflow lineage of the partition run is checked in the same copy."""

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from repo_copy import BIN, commit_all, copy_repo, sh, stages_ran
from test_readme_tour import section_commands

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> tuple[Path, dict]:
    """A git repo holding the project's tracked and untracked-but-not-ignored files."""
    dst = tmp_path_factory.mktemp("repo")
    # the copy's package, not the checkout's (an edit in the checkout during the run changes nothing)
    env = {**copy_repo(dst), "MLFLOW_TRACKING_URI": f"sqlite:///{dst / 'test-mlflow.db'}",
           "PYTHONPATH": str(dst / "src")}
    shrink_diffusion_track(dst)
    sh([str(BIN / "python"), "-m", "fedpipe.pipeline.compose"], dst, env)
    sh(["git", "init", "-q"], dst, env)
    (dst / ".gitignore").write_text((dst / ".gitignore").read_text() + "/test-mlflow.db\n")
    (dst / ".venv").symlink_to(BIN.parent)  # this test's environment, as `make run` expects it
    commit_all(dst, env)
    return dst, env


# CPU-tiny diffusion settings, written into the copy's conf/ so that `dvc exp run` composes them too.
TINY_CONF = {"diffusion/digits.yaml": {"num_train_timesteps": 10},
             "warmup/digits.yaml": {"epochs": 2},
             "diffusion_fl/digits.yaml": {"rounds": 2, "eval_every": 1},
             "fid/digits.yaml": {"classifier_epochs": 3, "num_samples": 20, "curve_samples": 10,
                                 "ddim_steps": 5}}


def shrink_diffusion_track(dst: Path) -> None:
    for rel, changes in TINY_CONF.items():
        path = dst / "conf" / rel
        path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), **changes}, sort_keys=False))


def ran(proc: subprocess.CompletedProcess) -> set[str]:
    return stages_ran(proc.stdout)


def test_repro_outputs_then_nothing_reruns(workdir):
    dst, env = workdir
    assert section_commands("Quick start") == ["make run", "make test"]
    # the README's `make run`; its install step (.venv/.installed) counts as done: -o keeps make
    # from remaking it (nothing is installed)
    first = sh(["make", "-o", ".venv/.installed", "run"], dst, env)
    algos = yaml.safe_load((dst / "params.yaml").read_text())["study"]["algorithms"]
    study = yaml.safe_load((dst / "params.yaml").read_text())["study"]
    seeds = study["seeds"]
    # one partition, warm-up, auxiliary set and server data per replicate; one shared FID extractor
    per_replicate = {f"{st}@{s}" for st in ("partition", "warmup", "generate", "aux_quality",
                                             "server_data") for s in seeds}
    diffusion_track = {"feature_extractor", "report"} | {
        f"federate_ddpm@{a}-{s}" for a in study["diffusion_algorithms"] for s in study["seeds"]}
    classification = {f"federate@{a}-{s}" for a in algos for s in seeds}
    backbone = {f"backbone@{s}" for s in seeds}  # placeholders: no algorithm has backbone: fedavg
    assert ran(first) == ({"plan", "evaluate"} | per_replicate | classification
                          | diffusion_track | backbone)
    assert all(f"{b}: skipped" in first.stdout for b in backbone)
    report = (dst / "data/report/report.md").read_text()
    assert all(f"| {a} |" in report for a in study["diffusion_algorithms"] + algos)
    plots = re.findall(r"!\[[^]]+\]\(([^)]+)\)", report)  # embedded from report.md's folder
    assert len(plots) == 8 and all((dst / "data/report" / p).is_file() for p in plots), plots
    aux = json.loads((dst / f"data/aux_quality/seed_{seeds[0]}/metrics.json").read_text())
    assert aux["samples"] == round(0.1 * 1347) and aux["fid_aux"] > 0
    assert len(list((dst / f"data/warmup/seed_{seeds[0]}/models").glob("client_*.safetensors"))) == 10
    for a in algos:
        fed = json.loads((dst / f"data/federate/{a}/seed_{seeds[0]}/metrics.json").read_text())
        assert fed["rounds"] == 30 and 0.5 < fed["test_accuracy"] <= 1.0
        assert (dst / f"data/federate/{a}/seed_{seeds[0]}/clients.csv").is_file()
    claims = json.loads((dst / "data/report/claims.json").read_text())
    assert claims["summary"]["claims"] == len(claims["claims"]) > 0
    assert any(c["paper"].startswith("FedDDPM") for c in claims["claims"])
    assert {c["paper"].split()[0] for c in claims["claims"]} <= {"FedDDPM", "SCAFFOLD", "FedDyn", "FedDC"}
    assert "| paper | claim |" in (dst / "data/report/claims.md").read_text()  # the claims table alone
    assert json.loads((dst / f"data/server_data/seed_{seeds[0]}/manifest.json").read_text()) == {"kinds": {}}
    ev = json.loads((dst / "data/evaluate/metrics.json").read_text())
    assert set(ev) == set(algos)
    assert "| fedavg |" in (dst / "data/evaluate/comparison.md").read_text()
    out = dst / "data" / "partition" / f"seed_{seeds[0]}"
    for name in ("partition.safetensors", "metrics.json", "clients.csv", "heatmap.png",
                 "sizes.png"):
        assert (out / name).is_file(), name
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["num_clients"] == 10 and metrics["samples_assigned"] == 1347
    assert (dst / "dvc.lock").is_file()
    second = sh(["dvc", "repro"], dst, env)
    assert ran(second) == {"plan"}  # always_changed (it hashes the files params name); nothing else
    assert "didn't change" in second.stdout or "up to date" in second.stdout

    # MLflow lineage of that run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("fedpipe")
    runs = [r for r in client.search_runs([exp.experiment_id]) if "dvc.stage" in r.data.tags]
    assert {r.data.tags["dvc.stage"] for r in runs} == ran(first) - backbone  # skipped: no run
    parents = {r.data.tags.get("mlflow.parentRunId") for r in runs}
    assert len(parents) == 1 and None not in parents  # one pipeline execution, one parent run
    (run,) = [r for r in runs if r.data.tags["dvc.stage"] == f"partition@{seeds[0]}"]
    tags, params = run.data.tags, run.data.params
    head = sh(["git", "rev-parse", "HEAD"], dst, env).stdout.strip()
    assert tags["mlflow.source.git.commit"] == head and tags["dvc.stage"] == f"partition@{seeds[0]}"
    from fedpipe.io import md5_file

    assert tags[f"output.data/partition/seed_{seeds[0]}/partition.safetensors"] == md5_file(
        out / "partition.safetensors")
    assert params["partition.scheme"] == "shards" and params["dataset.name"] == "digits"
    assert run.data.metrics["emd_mean"] == pytest.approx(metrics["emd_mean"])
    arts = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert {"plots/heatmap.png", "plots/sizes.png"} <= arts

    # make ui's compare view: its filter, through MLflow's own search, selects the training stages'
    # runs, and every key it charts, groups by or shows is one those runs logged
    from fedpipe.tracking.ui import COMPARE_FILTER, COMPARE_KEY, RUNS_KEY, view_states

    shown = client.search_runs([exp.experiment_id], COMPARE_FILTER)
    trained = classification | {f"federate_ddpm@{a}-{s}" for a in study["diffusion_algorithms"]
                                for s in seeds}
    assert {r.data.tags["dvc.stage"] for r in shown} == trained
    view = view_states()[COMPARE_KEY]
    metrics = set().union(*(r.data.metrics for r in shown))
    params = set().union(*(r.data.params for r in shown))
    assert all(chart["metricKey"] in metrics for chart in view["compareRunCharts"])
    for group in view["groupBy"]["groupByKeys"]:
        assert all(group["groupByData"] in (r.data.tags if group["mode"] == "tag" else r.data.params)
                   for r in shown), group
    parents = client.search_runs([exp.experiment_id], "tags.study != ''")
    for column in view["selectedColumns"] + view_states()[RUNS_KEY]["selectedColumns"]:
        kind, key = column.split(".", 1)
        assert any(key.strip("`") in (r.data.params if kind == "params" else r.data.metrics)
                   for r in shown + parents), column


def stale(proc: subprocess.CompletedProcess) -> set[str]:
    """The stages that ``dvc status --json`` calls changed (``plan`` is always changed)."""
    return set(json.loads(proc.stdout or "{}")) - {"plan"}


def test_editing_one_method_file_reruns_only_that_methods_stages(workdir):
    """Each training stage's code file names its own method's module only (fedpipe.pipeline.code):
    an edit to a method outside the study changes nothing; an edit to FedProx's module changes its
    two training stages and evaluate (which looks up every classification method of the study), as
    `dvc status` lists after the plan has re-hashed the code, and `dvc repro` runs them and their
    readers only."""
    dst, env = workdir
    study = yaml.safe_load((dst / "params.yaml").read_text())["study"]
    assert "fednh" not in study["algorithms"] + study["diffusion_algorithms"]
    for module, changed in (("fednh", set()),
                            ("fedprox", {"federate@fedprox-0", "federate_ddpm@fedprox-0",
                                         "evaluate"})):
        path = dst / f"src/fedpipe/algorithms/{module}.py"
        before = path.read_text()
        path.write_text(before + "# an edit\n")
        sh(["dvc", "repro", "plan"], dst, env)
        assert stale(sh(["dvc", "status", "--json"], dst, env)) == changed, module
        reran = ran(sh(["dvc", "repro"], dst, env)) - {"plan"}
        assert changed <= reran <= changed | {"report"}, (module, reran)
        path.write_text(before)
        sh(["dvc", "repro"], dst, env)  # back to the committed code
    assert ran(sh(["dvc", "repro"], dst, env)) == {"plan"}


def test_exp_show_recipe_whole_at_200_columns_with_mains_metrics(workdir):
    """The summary metrics are in git (not ignored) and committed with dvc.lock, as the README
    says; its `dvc exp show` recipe then shows main's four accuracies without a cut cell at 200
    columns."""
    dst, env = workdir
    for f in ("data/evaluate/metrics.json", "data/report/metrics.json", "data/report/claims.json"):
        assert (dst / f).is_file() and sh(["git", "check-ignore", "-q", f], dst, env,
                                          check=False).returncode == 1, f
    assert sh(["git", "check-ignore", "-q", "data/evaluate/seeds.json"], dst, env,
              check=False).returncode == 0  # every other output: DVC's cache
    commit_all(dst, env, "make run")
    show = next(c for c in section_commands("Running experiments") if c.startswith("dvc exp show"))
    proc = sh(["bash", "-c", show], dst, {**env, "COLUMNS": "200"})
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 200 and "…" not in proc.stdout, proc.stdout
    branch = sh(["git", "branch", "--show-current"], dst, env).stdout.strip()
    row = next(line for line in lines if line.split()[:1] == [branch])
    accuracies = re.findall(r"\b0\.\d+\b", row)  # fedavg ... feddyn test_accuracy, from git
    assert len(accuracies) == 4 and "!" not in row, proc.stdout
    # the compact table (`make exps`): within 120 columns, main's four accuracies as DVC reads them
    exps = sh([str(BIN / "python"), "-m", "fedpipe.exps"], dst,
              {**env, "COLUMNS": "120"}).stdout.splitlines()  # a 120-column terminal
    assert max(len(line) for line in exps) <= 120, exps
    assert exps[0].split()[5:9] == ["fedavg", "feddyn", "fedprox", "scaffold"], exps
    main_row = next(line.split() for line in exps if line.split()[:1] == [branch])
    assert [float(a) for a in main_row[5:9]] == pytest.approx(
        [float(a) for a in accuracies], abs=5e-5)


def test_changing_one_algorithm_reruns_only_that_one(workdir):
    dst, env = workdir
    params = yaml.safe_load((dst / "params.yaml").read_text())
    params["algorithms"]["fedprox"]["mu"] = 0.1
    (dst / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    proc = sh(["dvc", "repro"], dst, env)
    # the diffusion track's FedProx reads the same algorithms.fedprox section; server_data depends
    # on the plan's server-data kinds (data/plan/server_data.json), unchanged, so it stays cached
    assert ran(proc) == {"plan", "federate@fedprox-0", "evaluate",
                         "federate_ddpm@fedprox-0", "report"}


def test_changing_fedddpm_server_lr_reruns_only_fedddpm(workdir):
    dst, env = workdir
    params = yaml.safe_load((dst / "params.yaml").read_text())
    params["algorithms"]["fedddpm"]["server_lr"] = 1e-4
    (dst / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    proc = sh(["dvc", "repro"], dst, env)
    # no partition, warm-up, generation or server data; plan re-runs and changes nothing downstream
    assert ran(proc) == {"plan", "federate_ddpm@fedddpm-0", "report"}


def test_changing_generation_keeps_warmup(workdir):
    dst, env = workdir
    params = yaml.safe_load((dst / "params.yaml").read_text())
    params["generate"]["sampler"] = "ddim"
    params["generate"]["ddim_steps"] = 5
    (dst / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    proc = sh(["dvc", "repro"], dst, env)
    study = params["study"]
    assert ran(proc) == {"plan", "report"} | {
        f"{st}@{s}" for st in ("generate", "aux_quality") for s in study["seeds"]} | {
        f"federate_ddpm@{a}-{s}" for a in study["diffusion_algorithms"] for s in study["seeds"]}
    # no classification method reads the auxiliary set (study.server_data_from: partition): its
    # server data and runs are not redone
    assert not {s.split("@")[0] for s in ran(proc)} & {"partition", "warmup", "feature_extractor",
                                                         "server_data", "evaluate"}
    assert not any(s.startswith("federate@") for s in ran(proc))


def test_exp_run_with_hydra_override_gives_new_partition(workdir):
    """`dvc exp run -S partition=dirichlet -S partition.alpha=0.05` composes the config group and
    the key with Hydra; run to the partition stage only (`dvc exp run <target>`: what follows it is
    the repro tests' business), it gives a new partition and shows it in `dvc exp show`."""
    dst, env = workdir
    sh(["git", "add", "-A"], dst, env)
    sh(["git", "commit", "-qm", "lock", "--allow-empty"], dst, env)
    before = (dst / "data/partition/seed_0/partition.safetensors").read_bytes()
    before_emd = json.loads((dst / "data/partition/seed_0/metrics.json").read_text())["emd_mean"]
    proc = sh(["dvc", "exp", "run", "-S", "partition=dirichlet", "-S", "partition.alpha=0.05",
               "partition@0"], dst, env)
    assert ran(proc) == {"plan", "partition@0"}
    assert yaml.safe_load((dst / "params.yaml").read_text())["partition"]["alpha"] == 0.05
    assert (dst / "data/partition/seed_0/partition.safetensors").read_bytes() != before
    after_emd = json.loads((dst / "data/partition/seed_0/metrics.json").read_text())["emd_mean"]
    assert after_emd != before_emd
    show = sh(["dvc", "exp", "show", "--json"], dst, env).stdout
    assert "emd_mean" in show


def test_classification_only_study_skips_the_diffusion_side(workdir):
    """A study without diffusion-track methods or generated server data pays for no warm-up: the
    plan skips feature_extractor, warmup, generate and aux_quality (placeholders only), the report
    still comes out, and an input of a skipped stage fails with one line."""
    dst, env = workdir
    params = yaml.safe_load((dst / "params.yaml").read_text())
    params["study"] = {**params["study"], "algorithms": ["fedavg"], "diffusion_algorithms": []}
    (dst / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    proc = sh(["dvc", "repro"], dst, env)
    for stage in ("feature_extractor", "warmup@0", "generate@0", "aux_quality@0"):
        assert f"{stage}: skipped" in proc.stdout
    assert json.loads((dst / "data/plan/diffusion.json").read_text()) == {"run": False}
    assert not list((dst / "data/warmup/seed_0/models").glob("client_*.safetensors"))
    assert (dst / "data/warmup/seed_0/models/SKIPPED.json").is_file()
    assert not any(s.startswith("federate_ddpm@") for s in ran(proc))
    assert "| fedavg |" in (dst / "data/report/report.md").read_text()
    bad = subprocess.run([str(BIN / "python"), "-c", "from fedpipe.cli import run_stage; "
                          "from fedpipe.io import load_tensors; "
                          "run_stage(lambda: load_tensors('data/generate/seed_0/aux.safetensors'))"],
                         cwd=dst, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "was not built" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
