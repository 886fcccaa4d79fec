"""The diffusion track end to end on CPU-tiny settings: warm-up -> auxiliary set -> FID extractor ->
federated DDPM with FedAvg, FedDDPM and FedDDPM+ -> report (with the paper's numbers beside ours)."""

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_diffusion_stages import tiny_params

from fedpipe.config import ConfigError
from fedpipe.io import read_json
from fedpipe.pipeline.aux import load_aux
from fedpipe.pipeline.diffusion import diffusion_stage_config
from fedpipe.pipeline.feature_extractor import feature_extractor
from fedpipe.pipeline.federate_ddpm import ddpm_train_config, federate_ddpm
from fedpipe.pipeline.generate import generate
from fedpipe.pipeline.outputs import run_dir
from fedpipe.pipeline.partition import partition_and_write, partition_stage_config
from fedpipe.pipeline.report import build_report, mean_std
from fedpipe.pipeline.warmup import warmup
from fedpipe.reference import paper_fid

TINY_FL = {
    "diffusion_fl": {"rounds": 4, "participation": 0.5, "eval_every": 2, "checkpoint_every": 1,
                     "local": {"epochs": 1, "batch_size": 64, "optimizer": "adam", "lr": 1e-3}},
    "fid": {"classifier_epochs": 2, "num_samples": 30, "curve_samples": 20},
}


def with_algorithms(params: dict) -> dict:
    p = yaml.safe_load(yaml.safe_dump(params))
    p["algorithms"]["fedddpm"] = {**p["algorithms"]["fedddpm"], "server_batch_size": 16}
    # a threshold no FID change can miss: QuickTest fires at its second check (round 4)
    p["algorithms"]["fedddpm_plus"] = {**p["algorithms"]["fedddpm_plus"], "test_every": 2,
                                       "test_size": 20, "threshold": 1e9, "correction_epochs": 2,
                                       "server_batch_size": 16}
    p["study"] = {**p["study"], "diffusion_algorithms": ["fedavg", "fedddpm", "fedddpm_plus"],
                  "seeds": [0, 1], "paper_reference": "mnist/15_shard"}
    return p


@pytest.fixture(scope="module")
def track(tmp_path_factory):
    root = tmp_path_factory.mktemp("track")
    params = with_algorithms(tiny_params(**TINY_FL))
    partition_and_write(partition_stage_config(params), root / "partition")
    part = root / "partition" / "partition.safetensors"
    cfg = diffusion_stage_config(params, "aux_quality")
    warmup(cfg, root / "warmup", part, progress=False)
    generate(cfg, root / "gen", root / "warmup", part, progress=False)
    feature_extractor(cfg, root / "fid", progress=False)
    return root, params


def run(track, algo: str, seed: int = 0, **kw):
    root, params = track
    cfg = ddpm_train_config(params, algo, seed)
    return federate_ddpm(cfg, root / "fed", root / "partition" / "partition.safetensors",
                         root / "gen" / "aux.safetensors", root / "fid", progress=False, **kw)


def test_bad_params_name_the_key():
    params = with_algorithms(tiny_params(**TINY_FL))
    with pytest.raises(ConfigError, match=r"diffusion_fl\.local\.lr=-1"):
        ddpm_train_config({**params, "diffusion_fl": {**params["diffusion_fl"],
                                                       "local": {"lr": -1}}}, "fedavg")
    with pytest.raises(ConfigError, match=r"algorithms\.fedddpm\.server_lr"):
        ddpm_train_config({**params, "algorithms": {**params["algorithms"],
                                                     "fedddpm": {"server_lr": -1.0}}}, "fedddpm")
    with pytest.raises(ConfigError, match="seed argument"):
        ddpm_train_config(params, "fedavg", "x")
    with pytest.raises(ConfigError, match=r"study\.paper_reference='mnist/99_shard'"):
        ddpm_train_config({**params, "study": {**params["study"],
                                               "paper_reference": "mnist/99_shard"}}, "fedavg")


def test_fedavg_fedddpm_and_plus_through_the_engine(track):
    root, params = track
    aux_n = len(load_aux(root / "gen" / "aux.safetensors").images)
    out = {a: run(track, a) for a in ("fedavg", "fedddpm", "fedddpm_plus")}
    for a, o in out.items():
        d = run_dir(root / "fed", a, 0)
        for name in ("model.safetensors", "history.csv", "metrics.json", "quicktest.json",
                     "curves.png", "samples.png"):
            assert (d / name).is_file(), (a, name)
        assert np.isfinite(o.final["fid"]) and o.final["fid"] > 0
        assert o.final["fid_samples"] == 30 and o.final["extractor"] == "classifier:lenet"
    assert out["fedavg"].final["server_steps"] == 0 and out["fedavg"].final["rounds"] == 4
    # FedDDPM: one server epoch on A after each of the 4 aggregations
    assert out["fedddpm"].final["server_steps"] == 4 * math.ceil(aux_n / 16)
    assert out["fedddpm"].final["fid"] != out["fedavg"].final["fid"]
    # FedDDPM+: QuickTest at rounds 2 and 4, fires at 4 (threshold 1e9), one 2-epoch correction
    plus = out["fedddpm_plus"].final
    assert plus["stopped_at"] == 4 and plus["server_steps"] == 2 * math.ceil(aux_n / 16)
    trace = read_json(run_dir(root / "fed", "fedddpm_plus", 0) / "quicktest.json")["trace"]
    assert len(trace) == 2
    hist = (run_dir(root / "fed", "fedavg", 0) / "history.csv").read_text().splitlines()
    assert hist[0].split(",")[:2] == ["round", "train_loss"] and "test_fid" in hist[0]


def test_resume_matches_uninterrupted(track, tmp_path):
    root, _ = track
    first = run(track, "fedddpm", seed=1, stop_after=2)
    assert first.final["rounds"] == 2
    resumed = run(track, "fedddpm", seed=1)
    assert resumed.final["resumed_from"] == 2
    metrics = (run_dir(root / "fed", "fedddpm", 1) / "metrics.json").read_bytes()
    straight = run(track, "fedddpm", seed=1)  # resumes from the finished checkpoint: same model
    assert resumed.outputs == straight.outputs
    # no time or resume point in the DVC-hashed metrics: a resumed run's file is a fresh run's
    assert (run_dir(root / "fed", "fedddpm", 1) / "metrics.json").read_bytes() == metrics
    assert b"seconds" not in metrics and b"resumed_from" not in metrics


def test_report_mean_std_and_paper_column(track):
    root, params = track
    for a in ("fedavg", "fedddpm", "fedddpm_plus"):
        for s in (0, 1):
            if not (run_dir(root / "fed", a, s) / "metrics.json").is_file():
                run(track, a, s)
    from fedpipe.config.core import build
    from fedpipe.config.fl import StudyConfig
    from fedpipe.io import write_json

    acc = {"test_accuracy": 0.8, "client_acc_mean": 0.7, "client_acc_worst10": 0.5}
    write_json(root / "eval" / "metrics.json", {"fedavg": {**acc, "seeds": 1}})
    write_json(root / "eval" / "seeds.json", {"fedavg": {"0": acc}})
    study = build(StudyConfig, params["study"], "study")
    rep = build_report(study, "tiny", root / "fed", root / "eval", root / "report")
    fids = [read_json(run_dir(root / "fed", "fedavg", s) / "metrics.json")["fid"] for s in (0, 1)]
    assert rep.summary["fedavg"]["fid_mean"] == pytest.approx(np.mean(fids))
    assert rep.summary["fedavg"]["fid_std"] == pytest.approx(np.std(fids, ddof=1))
    assert f"{paper_fid('mnist/15_shard')['fedddpm']:.3f}" in rep.text and "Table I" in rep.text
    assert "| fedavg | 80.00 | — | 70.00 | — | 50.00 | — |" in rep.text
    assert (root / "report" / "fid_curves.png").is_file()
    # two training seeds: every claim with both arms in the study is shown, but not judged
    claims = {c["key"]: c for c in read_json(root / "report" / "claims.json")["claims"]}
    main = claims["fedddpm/fid/fedddpm-lt-fedavg"]
    assert main["status"] == "not judged" and main["held"] is False and main["n"] == 2
    assert main["values"]["fedavg"] == {str(s): f for s, f in enumerate(fids)}


def test_mean_std_hand_values():
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(math.sqrt(2)))
    assert mean_std([5.0]) == (5.0, 0.0)


@pytest.mark.parametrize("preset,table", [("fedddpm_mnist", "mnist"), ("fedddpm_cifar10", "cifar10"),
                                          ("fedddpm_cifar100", "cifar100")])
def test_paper_study_presets_compose_and_validate(tmp_path, preset, table):
    from fedpipe.pipeline.common import train_config
    from fedpipe.pipeline.compose import compose_params

    repo = Path(__file__).resolve().parents[1]
    out = compose_params(repo, [f"study={preset}"], output=str(tmp_path / "params.yaml"))
    params = yaml.safe_load(out.read_text())
    assert params["partition"]["num_clients"] == 100
    assert params["study"]["paper_reference"] == f"{table}/15_shard"
    for algo in params["study"]["diffusion_algorithms"]:
        cfg = ddpm_train_config(params, algo)
        assert cfg.fl.aggregation == "uniform" and cfg.fl.local.lr == 2e-4
    # the paper's warm-up (Section VI-A): 200 epochs on MNIST, 400 on CIFAR-10, 600 on CIFAR-100
    assert diffusion_stage_config(params, "warmup").warmup.epochs == {"mnist": 200, "cifar10": 400,
                                                                       "cifar100": 600}[table]
    train_config(params, "fedavg")
    assert paper_fid(params["study"]["paper_reference"])["fedddpm"] < paper_fid(
        params["study"]["paper_reference"])["fedavg"]


def test_classifier_calibration_needs_a_labelled_aux_set(track, tmp_path):
    from fedpipe.data import Partition
    from fedpipe.pipeline.common import train_config
    from fedpipe.pipeline.federate import federate

    root, params = track
    p = yaml.safe_load(yaml.safe_dump(params))
    p["fl"] = {**p["fl"], "rounds": 2}
    cfg = train_config(p, "fedddpm")
    part = root / "partition" / "partition.safetensors"
    from fedpipe.pipeline.server_data import write_server_data
    from fedpipe.pipeline.server_inputs import needed_kinds

    p["study"] = {**p["study"], "algorithms": ["fedavg", "fedddpm"], "server_data_from": "generate"}
    kinds = needed_kinds(p)
    assert kinds == {"aux": ["fedddpm"]}  # declared by the method's config, not named by the pipeline
    write_server_data(kinds, root / "gen" / "aux.safetensors", tmp_path / "sd_a")
    with pytest.raises(ConfigError, match=r"diffusion\.conditional=False"):  # A is unlabelled here
        federate(cfg, tmp_path / "a", part, server_data_dir=tmp_path / "sd_a", progress=False)
    # a labelled A (here: real images with their labels, written in the generate stage's format)
    from fedpipe.config import dataset_config
    from fedpipe.data import load_dataset
    from fedpipe.io import save_tensors

    ds = load_dataset(dataset_config(p["dataset"]))
    n = len(Partition.load(part).sizes())
    save_tensors(tmp_path / "aux.safetensors", {"images": ds.train.x[:40], "labels": ds.train.y[:40],
                                                 "client": __import__("torch").zeros(40, dtype=int)})
    write_server_data(kinds, tmp_path / "aux.safetensors", tmp_path / "sd_b")
    out = federate(cfg, tmp_path / "b", part, server_data_dir=tmp_path / "sd_b", progress=False)
    assert out.final["rounds"] == 2 and n == 4
    assert out.result.state.meta["server_steps"] == 2 * math.ceil(40 / 16)
    assert str(tmp_path / "sd_b" / "aux.safetensors") in out.inputs
    assert write_server_data({}, tmp_path / "missing.safetensors", tmp_path / "sd_b") == {"kinds": {}}
    assert not (tmp_path / "sd_b" / "aux.safetensors").exists()  # a kind no method needs is removed
