"""Federate/evaluate stage scripts: bad params give one line and exit 2 before any data is loaded;
a run writes its outputs; an interrupted federate resumes from its checkpoint."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fakes import default_params, with_changes

from fedpipe.config import ConfigError
from fedpipe.pipeline.common import train_config

REPO = Path(__file__).resolve().parents[1]
PARAMS = default_params()


def params_with(**changes) -> dict:
    return with_changes(PARAMS, **changes)


@pytest.mark.parametrize("changes,algo,expected", [
    ({"fl/rounds": 0}, "fedavg", "fl.rounds=0"),
    ({"fl/participation": 1.5}, "fedavg", "fl.participation=1.5"),
    ({"fl/local/optimizer": "lbfgs"}, "fedavg", "fl.local.optimizer='lbfgs'"),
    ({"fl/local/lr": -0.1}, "fedavg", "fl.local.lr=-0.1"),
    ({"fl/local/epohcs": 2}, "fedavg", "fl.local.epohcs=2"),
    ({"model/name": "vgg"}, "fedavg", "model.name='vgg'"),
    ({"model/kwargs": {"widht": 3}}, "fedavg", "model.kwargs.widht=3"),
    ({"study/algorithms": ["fedavg", "fedsgd"]}, "fedavg", "study.algorithms[1]='fedsgd'"),
    ({}, "fedfoo", "algorithm argument='fedfoo'"),
])
def test_bad_train_params(changes, algo, expected):
    with pytest.raises(ConfigError) as info:
        train_config(params_with(**changes), algo)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_bad_algorithm_hyperparameter():
    algo, key = "fedprox", "mu"  # in the default study (params.yaml holds its methods only)
    assert algo in PARAMS["algorithms"]
    with pytest.raises(ConfigError, match=rf"algorithms\.{algo}\.{key}=-1\.0"):
        train_config(params_with(**{f"algorithms/{algo}/{key}": -1.0}), algo)


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FEDPIPE_TRACKING": "off"}
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, env=env)


def test_federate_stage_bad_input_exit_2_and_outputs_kept(tmp_path):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params_with(**{"fl/rounds": -3})))
    out = tmp_path / "data" / "federate" / "fedavg" / "seed_0"
    out.mkdir(parents=True)
    (out / "metrics.json").write_text("{}\n")
    proc = run(tmp_path, str(REPO / "stages" / "federate.py"), "fedavg", "0")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: invalid config: fl.rounds=-3; allowed: an integer >= 1"]
    assert (out / "metrics.json").read_text() == "{}\n"
    # no partition yet: one line naming the file
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    proc = run(tmp_path, str(REPO / "stages" / "federate.py"), "fedavg", "x")
    assert proc.returncode == 2 and "seed argument='x'" in proc.stderr
    proc = run(tmp_path, str(REPO / "stages" / "federate.py"), "fedavg", "0")
    assert proc.returncode == 2 and "data/partition/seed_0/partition.safetensors" in proc.stderr
    assert "dvc repro partition@0" in proc.stderr  # the replicate's own partition stage
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("algorithm", ["fedavg", "fedper", "fedavg_ft", "fedrep"])
def test_federate_resume_matches_uninterrupted(tmp_path, algorithm):
    """Interrupt federate after round 2 of 4, re-run: same final model, personal models, history and
    per-client accuracies, bit for bit (personalized methods too)."""
    from fedpipe.pipeline.federate import federate
    from fedpipe.pipeline.partition import partition_and_write, partition_stage_config

    p = params_with(**{"fl/rounds": 4, "fl/checkpoint_every": 1, "fl/local/epochs": 1,
                       "algorithms/fedrep": {"head_epochs": 1, "body_epochs": 1},
                       "algorithms/fedavg_ft": {"ft_epochs": 1}})
    part_dir = tmp_path / "partition"
    partition_and_write(partition_stage_config(p), part_dir)
    part = part_dir / "partition.safetensors"
    cfg = train_config(p, algorithm, 1)
    federate(cfg, tmp_path / "a", part, progress=False)
    stopped = federate(cfg, tmp_path / "b", part, stop_after=2, progress=False)
    assert stopped.result.rounds_done == 2
    ckpt = tmp_path / "checkpoints" / "b" / algorithm / "seed_1"  # checkpoint_dir: not an output
    assert (ckpt / "server.safetensors").is_file()
    assert not any("checkpoint" in f.name for f in (tmp_path / "b").rglob("*"))
    resumed = federate(cfg, tmp_path / "b", part, progress=False)
    assert resumed.result.resumed_from == 2
    a, b = tmp_path / "a" / algorithm / "seed_1", tmp_path / "b" / algorithm / "seed_1"
    files = sorted(f.relative_to(a) for f in a.rglob("*") if f.is_file() and f.suffix != ".png")
    assert Path("model.safetensors") in files and Path("clients.csv") in files
    personal = [f for f in files if f.parts[0] == "personal" and f.suffix == ".safetensors"]
    assert len(personal) == (0 if algorithm == "fedavg" else p["partition"]["num_clients"])
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_evaluate_over_seeds_with_generic_and_personalized_columns(tmp_path):
    """Two algorithms x two replicates: seeds.json holds every run, metrics.json their mean and sample
    std; a method with personal models gets personalized columns, one without does not. Each
    replicate's runs train and are evaluated on that replicate's own partition."""
    from fedpipe.io import read_json
    from fedpipe.pipeline.evaluate import evaluate_study
    from fedpipe.pipeline.federate import federate
    from fedpipe.pipeline.inputs import partition_file
    from fedpipe.pipeline.partition import partition_and_write, partition_stage_config

    p = params_with(**{"fl/rounds": 2, "fl/local/epochs": 1,
                       "study/algorithms": ["fedavg", "fedper"], "study/seeds": [0, 3]})
    parts = tmp_path / "partition"
    for s in (0, 3):  # partition@0, partition@3
        partition_and_write(partition_stage_config(p, s), parts / f"seed_{s}")
    assert partition_file(0, parts).read_bytes() != partition_file(3, parts).read_bytes()
    cfgs = [train_config(p, a, s) for a in ("fedavg", "fedper") for s in (0, 3)]
    for cfg in cfgs:
        federate(cfg, tmp_path / "fed", partition_file(cfg.seed, parts), progress=False)
    out = evaluate_study(cfgs, tmp_path / "fed", parts, tmp_path / "eval")
    seeds = read_json(tmp_path / "eval" / "seeds.json")
    assert set(seeds) == {"fedavg", "fedper"} and set(seeds["fedavg"]) == {"0", "3"}
    a, b = (seeds["fedavg"][s]["test_accuracy"] for s in ("0", "3"))
    assert a != b  # the seed changes the run
    m = out.metrics["fedavg"]
    assert m["seeds"] == 2 and abs(m["test_accuracy"] - (a + b) / 2) < 1e-12
    assert abs(m["test_accuracy_std"] - abs(a - b) / 2 ** 0.5) < 1e-12  # sample std of two values
    assert "personal_acc_mean" in out.metrics["fedper"] and "personal_acc_mean" not in m
    assert 0 <= out.metrics["fedper"]["pm_v_mean"] <= 1 and 0 <= out.metrics["fedper"]["pm_l_mean"] <= 1
    assert "PM(V)" in out.table and "±" in out.table
    # each seed's final model is the one federate wrote (the metrics agree with its own final eval)
    final = read_json(tmp_path / "fed" / "fedper" / "seed_3" / "metrics.json")
    assert abs(final["test_accuracy"] - seeds["fedper"]["3"]["test_accuracy"]) < 1e-12
    assert abs(final["personal_acc_mean"] - seeds["fedper"]["3"]["personal_acc_mean"]) < 1e-12


def test_local_has_no_global_model_metrics_anywhere(tmp_path):
    """Local (every module personal) has no global model: its run's metrics.json, the evaluate
    stage's seeds/metrics JSON, history.csv, clients.csv and comparison table show the global
    model's metrics as absent, never as the untrained server model's numbers; its own models' are
    there. FedAvg beside it keeps every column. One evaluation (eval_every = rounds)."""
    import csv

    from fedpipe.io import read_json
    from fedpipe.pipeline.evaluate import evaluate_study
    from fedpipe.pipeline.federate import federate
    from fedpipe.pipeline.inputs import partition_file
    from fedpipe.pipeline.partition import partition_and_write, partition_stage_config

    p = params_with(**{"fl/rounds": 2, "fl/eval_every": 2, "fl/local/epochs": 1,
                       "study/algorithms": ["fedavg", "local"], "study/seeds": [0]})
    parts = tmp_path / "partition"
    partition_and_write(partition_stage_config(p, 0), parts / "seed_0")
    cfgs = [train_config(p, a, 0) for a in ("fedavg", "local")]
    for cfg in cfgs:
        federate(cfg, tmp_path / "fed", partition_file(0, parts), progress=False)
    run = read_json(tmp_path / "fed" / "local" / "seed_0" / "metrics.json")
    assert "test_accuracy" not in run and "best_test_accuracy" not in run
    assert 0 < run["personal_acc_mean"] <= 1 and run["rounds"] == 2
    assert "test_accuracy" in read_json(tmp_path / "fed" / "fedavg" / "seed_0" / "metrics.json")
    out = evaluate_study(cfgs, tmp_path / "fed", parts, tmp_path / "eval")
    generic = ("test_accuracy", "test_accuracy_last5", "test_loss", "client_acc_mean",
               "client_acc_std", "sigma_acc_global", "sigma_acc_std")
    local = read_json(tmp_path / "eval" / "seeds.json")["local"]["0"]
    assert not set(generic) & set(local) and not set(generic) & set(out.metrics["local"])
    assert 0 < local["personal_acc_mean"] <= 1 and "pm_v_mean" in local
    assert set(generic) <= set(out.metrics["fedavg"])
    row = next(line for line in out.table.splitlines() if line.startswith("| local |"))
    head = next(line for line in out.table.splitlines() if line.startswith("| algorithm |"))
    cells = dict(zip(head.split("|")[2:-1], row.split("|")[2:-1], strict=True))
    assert cells[" global acc "].strip() == "–" and cells[" client mean "].strip() == "–"
    assert cells[" personal mean "].strip() != "–"
    with open(tmp_path / "eval" / "history.csv") as f:
        hist = list(csv.DictReader(f))
    assert {h["algorithm"] for h in hist} == {"fedavg"} and [h["round"] for h in hist] == ["2"]
    with open(tmp_path / "eval" / "clients.csv") as f:
        clients = [r for r in csv.DictReader(f) if r["algorithm"] == "local"]
    assert clients and all(r["accuracy"] == "" and r["personal_accuracy"] != "" for r in clients)
