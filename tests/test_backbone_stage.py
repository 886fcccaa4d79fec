"""The backbone stage (``backbone@<seed>``): PerAda's FedAvg-pretrained backbone built once per training
seed for every algorithm of the study with ``backbone: fedavg``, bit-identical to the one each of them
pretrained inside its federate stage before; a placeholder when no algorithm asks for it; the federate
stages depend on it and load it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from fakes import default_params

from fedpipe.config import ConfigError
from fedpipe.errors import InputError, SkippedStageError
from fedpipe.io import load_tensors, md5_file
from fedpipe.pipeline.common import train_config
from fedpipe.pipeline.inputs import backbone_path
from fedpipe.pipeline.plan import backbone_users, write_plan
from fedpipe.pipeline.skip import BACKBONE_PLAN

REPO = Path(__file__).resolve().parents[1]
PARAMS = default_params()


def study(algorithms, **sections) -> dict:
    return {"study": {"algorithms": algorithms, "diffusion_algorithms": [], "seeds": [0, 1]},
            "algorithms": {a: {"server_data": "holdout"} if a.startswith("perada") else {}
                           for a in algorithms} | sections}


def test_plan_decides_the_backbone_stage_and_refuses_two_different_backbones(tmp_path):
    plan = write_plan(study(["fedavg", "fedper"]), tmp_path)
    assert plan["backbone"] == []
    assert json.loads((tmp_path / BACKBONE_PLAN).read_text()) == {"run": False,
                                                                  "pretrain_rounds": None,
                                                                  "users": []}
    plan = write_plan(study(["perada", "fedavg", "perada_nokd"]), tmp_path)
    assert plan["backbone"] == ["perada", "perada_nokd"]
    assert json.loads((tmp_path / BACKBONE_PLAN).read_text()) == {
        "run": True, "pretrain_rounds": None, "users": ["perada", "perada_nokd"]}
    # a backbone given as a file, or none, needs no stage
    assert backbone_users(study(["perada"], perada={"backbone": "none",
                                                    "server_data": "holdout"})) == ([], None)
    same = {"server_data": "holdout", "pretrain_rounds": 7}
    assert backbone_users(study(["perada", "perada_nokd"], perada=same, perada_nokd=same)) == (
        ["perada", "perada_nokd"], 7)
    with pytest.raises(ConfigError, match=r"algorithms\.perada_nokd\.pretrain_rounds=3; allowed: 7"):
        write_plan(study(["perada", "perada_nokd"], perada=same,
                         perada_nokd={**same, "pretrain_rounds": 3}), tmp_path)


def test_dvc_yaml_runs_the_stage_per_seed_before_every_federate_stage():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    bb = stages["backbone"]
    assert bb["matrix"] == {"seed": "${study.seeds}"}
    assert str(BACKBONE_PLAN) in bb["deps"] and str(BACKBONE_PLAN) in stages["plan"]["outs"]
    model = "data/backbone/seed_${item.seed}/model.safetensors"
    assert bb["outs"] == [model] and model in stages["federate"]["deps"]
    assert str(backbone_path("${item.seed}")) == model  # where federate's backbone_of reads it


def old_pretrain_backbone(cfg, ds, clients, out):
    """The FedAvg backbone as the federate stage pretrained it before the backbone stage existed
    (``fedpipe.pipeline.federate.pretrain_backbone``, verbatim but for ``progress``)."""
    from fedpipe.fl import Strategy, run_federated
    from fedpipe.pipeline.common import fingerprint_of, make_model
    from fedpipe.rng import torch_seed
    from fedpipe.tasks import ClassificationTask

    plain = replace(cfg, algorithm="fedavg", algo_cfg=None)
    rounds = cfg.init.pretrain_rounds or cfg.fl.rounds  # then PerAda's config's, now any method's
    device, accel = cfg.device.torch, cfg.device.accel
    strategy = Strategy(ClassificationTask(accel.bf16_autocast, accel.compile),
                        lambda: make_model(plain, ds).to(device), cfg.fl.local,
                        aggregation=cfg.fl.aggregation, num_clients=len(clients))
    result = run_federated(strategy, make_model(plain, ds).to(device), clients,
                           replace(cfg.fl, rounds=rounds),
                           torch_seed(cfg.seed, "backbone-pretrain"),
                           checkpoint_dir=out / "pretrain",
                           fingerprint=fingerprint_of({**cfg.params_read, "pretrain": rounds}),
                           progress=False)
    return result.state.weights


def tiny_params(pretrain_rounds=2) -> dict:
    p = yaml.safe_load(yaml.safe_dump(PARAMS))
    p["model"] = {"name": "resnet8", "kwargs": {}}
    p["fl"] |= {"rounds": 3, "participation": 0.3, "checkpoint_every": 1}
    p["fl"]["local"] |= {"epochs": 1}
    p["study"] |= {"algorithms": ["fedavg", "perada_nokd", "perada"], "seeds": [1],
                   "diffusion_seeds": [1]}
    for a in ("perada", "perada_nokd"):
        p["algorithms"].setdefault(a, {}).update(backbone="fedavg", pretrain_rounds=pretrain_rounds)
    return p


def test_the_stage_writes_the_backbone_each_user_pretrained_before_bit_for_bit(tmp_path):
    from fedpipe.data import load_dataset
    from fedpipe.pipeline.backbone import backbone_config, build_backbone
    from fedpipe.pipeline.common import clients_of, load_partition
    from fedpipe.pipeline.federate import backbone_of
    from fedpipe.pipeline.partition import partition_and_write, partition_stage_config
    from fedpipe.pipeline.plan import backbone_plan

    p = tiny_params()
    partition_and_write(partition_stage_config(p), tmp_path / "partition")
    part = tmp_path / "partition" / "partition.safetensors"
    bcfg = backbone_config(p, "1", backbone_plan(p))
    assert (bcfg.train.seed, bcfg.rounds, bcfg.users) == (1, 2, ("perada_nokd", "perada"))
    out = build_backbone(bcfg, tmp_path / "backbone", part, progress=False)
    path = backbone_path(1, tmp_path / "backbone")
    assert out["outputs"] == {str(path): md5_file(path)}
    assert json.loads((path.parent / "metrics.json").read_text())["rounds"] == 2
    stage = load_tensors(path)

    ds = load_dataset(bcfg.train.dataset)
    clients = clients_of(ds, load_partition(part))
    for algorithm in ("perada", "perada_nokd"):
        cfg = train_config(p, algorithm, 1)
        before = old_pretrain_backbone(cfg, ds, clients, tmp_path / algorithm)
        assert sorted(before) == sorted(stage)
        assert all(torch.equal(before[k], stage[k]) for k in before), algorithm
        # the federate stage now reads exactly that file (and records it as an input)
        loaded, read = backbone_of(cfg, tmp_path / "backbone")
        assert all(torch.equal(loaded[k], before[k]) for k in before)
        assert read == {str(path): md5_file(path)}
    # the settings are the backbone's own: another pretrain_rounds gives another backbone
    other = build_backbone(backbone_config(tiny_params(1), 1, backbone_plan(tiny_params(1))),
                           tmp_path / "other", part,
                           progress=False)
    assert next(iter(other["outputs"].values())) != md5_file(path)


def test_federate_without_the_backbone_fails_with_one_line(tmp_path):
    from fedpipe.pipeline.federate import backbone_of
    from fedpipe.pipeline.skip import write_placeholder

    cfg = train_config(tiny_params(), "perada", 1)
    with pytest.raises(InputError, match=r"run `dvc repro backbone@1`") as info:
        backbone_of(cfg, tmp_path)
    assert "missing" in str(info.value) and "\n" not in str(info.value)
    write_placeholder(backbone_path(1, tmp_path), "unused")
    with pytest.raises(InputError, match=r"a placeholder.*`dvc repro backbone@1`"):
        backbone_of(cfg, tmp_path)
    assert backbone_of(train_config(tiny_params(), "fedavg", 1), tmp_path) == (None, {})


def test_an_unused_backbone_stage_writes_marked_placeholders_quickly(tmp_path):
    """A study without ``backbone: fedavg``: ``backbone@<seed>`` (seed from DVC_STAGE, as under DVC)
    writes placeholders only; reading the model fails with one line."""
    shutil.copy(REPO / "dvc.yaml", tmp_path / "dvc.yaml")
    params = yaml.safe_load(yaml.safe_dump(PARAMS))
    params["study"] |= {"algorithms": ["fedavg"], "seeds": [3], "diffusion_seeds": [3]}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    write_plan(params, tmp_path)
    env = {**os.environ, "FEDPIPE_TRACKING": "off", "DVC_STAGE": "backbone@3",
           "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, str(REPO / "stages/backbone.py")], cwd=tmp_path,
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "backbone@3: skipped" in proc.stdout
    model = tmp_path / "data/backbone/seed_3/model.safetensors"
    with pytest.raises(SkippedStageError, match="was not built"):
        load_tensors(model)
    metrics = json.loads((model.parent / "metrics.json").read_text())
    assert metrics["skipped"].startswith("stage backbone@3 is not used by this study (no algorithm "
                                         "with backbone: fedavg")
    assert not (tmp_path / "data/checkpoints").exists()
