"""The study plan: which stages a study uses, and what a skipped stage leaves behind."""

import json

import pytest
import torch
import yaml

from fedpipe.errors import SkippedStageError
from fedpipe.io import load_tensors, save_tensors
from fedpipe.pipeline.plan import DDPM_TRACK_PLAN, uses_diffusion, write_plan
from fedpipe.pipeline.skip import (
    DIFFUSION_PLAN,
    SERVER_DATA_PLAN,
    SKIPPED_FILE,
    skip_if_unused,
    stage_outputs,
)
from fedpipe.pipeline.stage_params import STAGE_PARAMS


def params(algorithms, diffusion, **algo_sections):
    return {"study": {"algorithms": algorithms, "diffusion_algorithms": diffusion, "seeds": [0, 1]},
            "algorithms": {a: {} for a in algorithms + diffusion} | algo_sections}


def test_the_diffusion_side_is_used_by_a_diffusion_method_or_by_generated_server_data():
    assert not uses_diffusion(params(["fedavg", "fedper"], []))
    assert uses_diffusion(params(["fedavg"], ["fedavg"]))
    # FedDDPM on the classification track declares the auxiliary set as its server data
    aux = params(["fedavg", "fedddpm"], [])
    aux["study"]["server_data_from"] = "generate"
    assert uses_diffusion(aux)


def test_write_plan_writes_the_decision_and_the_track(tmp_path):
    plan = write_plan(params(["fedavg"], []), tmp_path)
    assert plan["diffusion"] is False
    assert json.loads((tmp_path / DIFFUSION_PLAN).read_text()) == {"run": False}
    assert json.loads((tmp_path / DDPM_TRACK_PLAN).read_text()) == {"algorithms": [], "seeds": [0, 1]}
    # changing the seeds or the classification methods leaves the decision file byte-identical
    before = (tmp_path / DIFFUSION_PLAN).read_bytes()
    write_plan(params(["fedavg", "local"], []), tmp_path)
    assert (tmp_path / DIFFUSION_PLAN).read_bytes() == before


def test_server_data_plan_holds_the_kinds_and_ignores_other_settings(tmp_path, repo_root):
    """server_data@<seed> depends on data/plan/server_data.json, not on the algorithms section: the
    file names each declared kind's users and stays byte-identical when another setting changes."""
    def with_generated(p):
        p["study"].update(server_data_from="generate", diffusion_seeds=[0, 1])
        return p

    write_plan(with_generated(params(["fedavg", "feddf"], [])), tmp_path)
    assert json.loads((tmp_path / SERVER_DATA_PLAN).read_text()) == {"distill": ["feddf"]}
    before = (tmp_path / SERVER_DATA_PLAN).read_bytes()
    write_plan(with_generated(params(["fedavg", "feddf"], [], fedavg={"keep_local_model": True})),
               tmp_path)
    assert (tmp_path / SERVER_DATA_PLAN).read_bytes() == before
    write_plan(params(["fedavg"], []), tmp_path)
    assert json.loads((tmp_path / SERVER_DATA_PLAN).read_text()) == {}
    stage = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]["server_data"]
    assert str(SERVER_DATA_PLAN) in [d.split("#")[0].strip() for d in stage["deps"]]
    assert "params" not in stage and STAGE_PARAMS["server_data"] == ("dataset",)
    assert "data/plan/stages/server_data.json" in [d.split("#")[0].strip() for d in stage["deps"]]


def test_stage_outputs_reads_every_declared_output(repo_root):
    outs = stage_outputs("warmup", repo_root / "dvc.yaml", {"seed": 2})  # warmup@2, replicate 2
    assert outs == ["data/warmup/seed_2/models", "data/warmup/seed_2/losses.png",
                    "data/warmup/seed_2/losses.csv", "data/warmup/seed_2/metrics.json"]


@pytest.fixture
def fake_stage(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dvc = {"stages": {"gen": {"cmd": "x", "outs": ["out/aux.safetensors", "out/grids", "out/a.png",
                                                    {"out/notes.md": {"cache": False}}],
                              "metrics": [{"out/metrics.json": {"cache": False}}],
                              "plots": [{"out/curve.csv": {"cache": False}}]}}}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(dvc))
    DIFFUSION_PLAN.parent.mkdir(parents=True)
    return tmp_path


def test_a_skipped_stage_writes_marked_placeholders(fake_stage):
    DIFFUSION_PLAN.write_text(json.dumps({"run": False}))
    (fake_stage / "out/grids").mkdir(parents=True)
    (fake_stage / "out/grids/client_000.png").write_bytes(b"stale")
    assert skip_if_unused("gen") is True
    out = fake_stage / "out"
    assert json.loads((out / "grids" / SKIPPED_FILE).read_text())["skipped"].startswith("stage gen")
    assert not (out / "grids/client_000.png").exists()  # a folder out is replaced whole
    assert "skipped" in json.loads((out / "metrics.json").read_text())
    assert (out / "curve.csv").read_text() == "skipped\n"
    assert (out / "a.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "notes.md").read_text().startswith("skipped: stage gen")
    with pytest.raises(SkippedStageError, match="out/aux.safetensors was not built"):
        load_tensors(out / "aux.safetensors")


def test_a_used_stage_runs_and_clears_its_folder_placeholder(fake_stage):
    DIFFUSION_PLAN.write_text(json.dumps({"run": False}))
    skip_if_unused("gen")
    DIFFUSION_PLAN.write_text(json.dumps({"run": True}))
    assert skip_if_unused("gen") is False
    assert not (fake_stage / "out/grids" / SKIPPED_FILE).exists()
    save_tensors(fake_stage / "out/aux.safetensors", {"x": torch.ones(2)})
    assert load_tensors(fake_stage / "out/aux.safetensors")["x"].tolist() == [1.0, 1.0]


def test_without_a_plan_the_stage_runs_as_asked(fake_stage):
    assert skip_if_unused("gen") is False
    assert not (fake_stage / "out").exists()


def test_plan_refuses_a_method_on_a_track_it_cannot_train(tmp_path):
    """FedNH's prototype head on the diffusion track (a UNet) would fail after the warm-up: the plan
    refuses it with one line naming the key, the method and the methods that can."""
    from fedpipe.config import ConfigError
    from fedpipe.pipeline.plan import write_plan

    params = {"study": {"algorithms": ["fedavg"], "diffusion_algorithms": ["fedavg", "fednh"],
                        "seeds": [0]},
              "algorithms": {m: {} for m in ("fedavg", "fednh", "scaffold", "mofedsam", "fedddpm")}}
    with pytest.raises(ConfigError) as info:
        write_plan(params, tmp_path)
    assert info.value.key == "study.diffusion_algorithms[1]" and "fednh" in str(info.value)
    assert "fedddpm" in str(info.value) and "fedprox" in str(info.value)
    assert not (tmp_path / "data/plan/diffusion.json").exists()  # refused before writing anything
    params["study"]["diffusion_algorithms"] = ["fedavg", "scaffold", "mofedsam", "fedddpm"]
    write_plan(params, tmp_path)
    del params["algorithms"]["scaffold"]  # a hand-edited params.yaml without a method's section
    with pytest.raises(ConfigError, match=r"algorithms\.scaffold=None"):
        write_plan(params, tmp_path)


@pytest.mark.parametrize("section, key, value", [
    ("fl", "rounds", "abc"), ("partition", "num_clients", 0), ("model", "name", "vgg"),
    ("warmup", "epochs", -1), ("diffusion_fl", "rounds", 0)])
def test_plan_checks_every_section_before_any_stage_computes(tmp_path, section, key, value):
    """`-S fl.rounds=abc` used to pass plan, partition, backbone and server data (27 s) before the
    first training stage refused it: plan, the first stage DVC runs, now checks every section."""
    from fakes import default_params

    from fedpipe.config import ConfigError
    from fedpipe.pipeline.plan import check_every_section, check_study

    params = default_params()
    check_every_section(params, check_study(params))  # the default study passes
    params[section][key] = value
    with pytest.raises(ConfigError, match=rf"{section}\.{key}"):
        check_every_section(params, check_study(params))


def test_each_stage_reads_its_params_from_one_file_the_plan_writes(tmp_path, repo_root):
    """issue 43: a stage's params are in its one plan file (data/plan/stages/<stage>.json, per method
    for the training stages, with its code), not values in its dvc.lock entry. The plan writes the
    values each stage reads; the same params give the same bytes; a change re-writes exactly the
    files of the stages that read the changed value; a method's section reaches its own training
    stages' files only. In dvc.yaml every stage but plan depends on its file and lists no params,
    and plan lists every section any stage reads (so that `dvc params diff` / `dvc exp show` show
    every param)."""
    from fakes import default_params

    from fedpipe.cli import STAGE_FILES_DIR, stage_file
    from fedpipe.pipeline.stage_params import PER_METHOD, PLAN_SECTIONS

    base = default_params()
    base["study"] |= {"algorithms": ["fedavg", "fedprox"], "diffusion_algorithms": ["fedavg"]}
    write_plan(base, tmp_path)

    def snapshot():  # each file's bytes, and its params as bytes (written with sorted keys)
        files = {p.relative_to(tmp_path / STAGE_FILES_DIR).as_posix(): p.read_bytes()
                 for p in sorted((tmp_path / STAGE_FILES_DIR).rglob("*.json"))}
        return files, {k: json.dumps(json.loads(v)["params"], sort_keys=True).encode()
                       for k, v in files.items()}

    whole, first = snapshot()
    assert set(first) == ({f"{s}.json" for s in STAGE_PARAMS if s not in PER_METHOD}
                          | {"federate/fedavg.json", "federate/fedprox.json",
                             "federate_ddpm/fedavg.json"})
    fed = json.loads(first["federate/fedprox.json"])
    assert json.loads(whole["federate/fedprox.json"])["inputs"] == {}
    assert fed["fl"] == base["fl"] and fed["algorithms.fedprox"] == base["algorithms"]["fedprox"]
    assert set(fed) == {"dataset", "model", "fl", "algorithms.fedprox", "device", "accel"}
    fe = json.loads(first["feature_extractor.json"])
    assert fe["fid.extractor"] == base["fid"]["extractor"] and "fid" not in fe
    write_plan(base, tmp_path)
    assert snapshot()[0] == whole  # byte-identical: nothing downstream re-runs

    def changed(**edit) -> set[str]:
        p = json.loads(json.dumps(base))
        for dotted, value in edit.items():
            *path, last = dotted.split("__")
            node = p
            for part in path:
                node = node[part]
            node[last] = value
        write_plan(p, tmp_path)
        now = snapshot()[1]
        write_plan(base, tmp_path)
        return {k for k in now if now[k] != first.get(k)}

    assert changed(fl__rounds=base["fl"]["rounds"] + 1) == {
        "backbone.json", "federate/fedavg.json", "federate/fedprox.json"}
    assert changed(algorithms__fedprox=base["algorithms"]["fedprox"] | {"mu": 0.123}) == {
        "federate/fedprox.json", "report.json"}
    assert changed(fid__classifier_epochs=base["fid"]["classifier_epochs"] + 1) == {
        "feature_extractor.json", "aux_quality.json", "federate_ddpm/fedavg.json"}
    # a method leaving the study takes its file with it
    write_plan(base | {"study": base["study"] | {"algorithms": ["fedavg"]}}, tmp_path)
    assert not stage_file("federate@fedprox-0", tmp_path).exists()
    assert stage_file("federate@fedavg-0", tmp_path).exists()

    stages = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]
    assert set(stages) == set(STAGE_PARAMS) | {"plan"}
    for name, body in stages.items():
        if name == "plan":
            continue
        assert "params" not in body, name
        want = (STAGE_FILES_DIR / (f"{name}/${{item.algorithm}}.json" if name in PER_METHOD
                                   else f"{name}.json")).as_posix()
        assert want in [d.split("#")[0].strip() for d in body["deps"]], name
    assert stages["plan"]["params"] == list(PLAN_SECTIONS)
    assert {k.split(".")[0] for ks in STAGE_PARAMS.values() for k in ks} <= set(PLAN_SECTIONS)
    assert STAGE_FILES_DIR.as_posix() in [o.split("#")[0].strip() for o in stages["plan"]["outs"]]
