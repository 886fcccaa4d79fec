"""Replicates of the whole experiment (docs/replicates.md): replicate r of ``study.seeds`` draws its own
partition, initial models, warm-up DDPMs, auxiliary set, server data and training streams from r;
replicate 0 is the run the pipeline made before replicates existed (root seed 0, ``study.seeds: [0]``),
bit for bit; adding a seed to ``study.seeds`` runs only the new replicate's stages under DVC."""

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
import repo_copy
import torch
import yaml
from fakes import STAND_IN_OUTPUTS, default_params, with_changes
from repo_copy import sh

from fedpipe.io import load_tensors
from fedpipe.pipeline.inputs import partition_file
from fedpipe.pipeline.partition import partition_and_write, partition_stage_config

REPO = Path(__file__).resolve().parents[1]
PARAMS = default_params()

# Recorded from the code before replicates (main at 37e1f45), on the CPU with one torch thread: a
# tiny warm-up and auxiliary set (4 IID clients, T = 10, 1 epoch) from root seed 0.
BEFORE = {
    "warmup_client0_tensors": "19756956b016f7434dd2e9faf118b48359b70c8cc22f297492ac6bc3224a076c",
    "generate_aux_tensors": "63caaf1038dc4c030f7b8294ad529959967d30f61943aee66e0e505606ea3324",
}

# The tensors (client train / test indices) of the default partition at replicates 0 and 1 and of a
# tiny IID one (4 clients, replicate 0), recorded from main at 344f2e4, whose partition files had
# the bytes of 37e1f45 (replicate 0's MD5 was the one dvc.lock held for the root-seed partition): a
# partition file's metadata holds the partition params, so a new partition key (local_test) changes
# its bytes but not its draw.
BEFORE_TENSORS = {
    "partition_seed0": "74925c5f46a3c3df455268cc284d04f88a314838aedfeb842fa3f42c75f1bcb7",
    "partition_seed1": "8bf9c811181ca9df848683dc03700ac255793e712317f2eedc7ab932e60cd46a",
    "partition_tiny_iid_seed0": "58d9db42ac0f3d3bb3ae6a2c8a1ba8b861b1af125ca6eeea4eececa3338736de",
    # the tensors of a 2-round FedAvg run with training seed 0 on the seed-0 partition, from the
    # same main, whose model file still had 37e1f45's bytes (files now carry a content hash too)
    "federate_fedavg_seed0_model": "603347ebe9ad79ada1e4191bc41fca3a950e616220b8bcd8093068d150283dee",
}


# The same three files' tensors as summaries (sum, norm, a position-weighted sum per tensor), from
# the same code (main at e087c4a, whose bits equal 37e1f45's where the bits above were recorded) on
# a CPU with AVX-512 kernels: trained floats differ in their last bits between CPUs (kernels, MKL
# paths), so a CPU whose bits differ is held to these within 1e-4 of each tensor's norm.
SUMMARIES = json.loads((Path(__file__).parent / "fixtures" / "replicate_summaries.json").read_text())


def summary(path: Path) -> dict[str, list[float]]:
    out = {}
    for k, x in sorted(load_tensors(path).items()):
        x = x.double().flatten()
        w = torch.linspace(-1, 1, x.numel(), dtype=torch.float64)
        out[k] = [float(x.sum()), float(x.norm()), float((w * x).sum())]
    return out


def same_run(path: Path, key: str, bits: str) -> bool:
    """``path`` holds the recorded run's tensors: its bits, or on another CPU its summaries within
    1e-4 of each tensor's norm (names, and so shapes' count, exactly)."""
    if tensors_sha(path) == bits:
        return True
    got, want = summary(path), SUMMARIES[key]
    assert sorted(got) == sorted(want), (key, sorted(got))
    for name, (s, n, m) in want.items():
        tol = 1e-4 * max(n, 1.0)
        g = got[name]
        assert abs(g[0] - s) <= tol and abs(g[1] - n) <= tol and abs(g[2] - m) <= tol, (key, name, g,
                                                                                     (s, n, m))
    return True


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tensors_sha(path: Path) -> str:
    """The tensors of a safetensors file (not its metadata, which holds a code-version fingerprint)."""
    t = load_tensors(path)
    h = hashlib.sha256()
    for k in sorted(t):
        h.update(k.encode())
        h.update(t[k].contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the fixture's thread count: float sums are bit-identical only at it
    yield
    torch.set_num_threads(before)


def test_replicate_zero_is_the_run_before_replicates(tmp_path, one_thread):
    """partition@0, federate@fedavg-0, warmup@0 and generate@0 write, bit for bit, what the root-seed
    pipeline wrote for its default run; the root seed no longer moves a replicate's partition."""
    from fedpipe.pipeline.common import train_config
    from fedpipe.pipeline.diffusion import diffusion_stage_config
    from fedpipe.pipeline.federate import federate
    from fedpipe.pipeline.generate import generate
    from fedpipe.pipeline.warmup import warmup

    parts = tmp_path / "partition"
    for root_seed in (0, 7):  # the root seed seeds only what replicates share
        partition_and_write(partition_stage_config(with_changes(PARAMS, seed=root_seed), 0),
                            parts / f"root{root_seed}" / "seed_0")
        assert tensors_sha(partition_file(0, parts / f"root{root_seed}")) == BEFORE_TENSORS["partition_seed0"]
    partition_and_write(partition_stage_config(PARAMS, 1), parts / "seed_1")
    assert tensors_sha(partition_file(1, parts)) == BEFORE_TENSORS["partition_seed1"]  # seed 1's draw

    p = with_changes(PARAMS, **{"fl/rounds": 2, "fl/local/epochs": 1})
    cfg = train_config(p, "fedavg", 0)
    federate(cfg, tmp_path / "fed", partition_file(0, parts / "root0"), progress=False)
    assert same_run(tmp_path / "fed/fedavg/seed_0/model.safetensors", "federate_fedavg_seed0_model",
                    BEFORE_TENSORS["federate_fedavg_seed0_model"])

    q = json.loads(json.dumps(PARAMS))
    for section, values in {"partition": {"scheme": "iid", "num_clients": 4},
                            "diffusion": {"num_train_timesteps": 10},
                            "warmup": {"epochs": 1, "batch_size": 64},
                            "generate": {"ratio": 0.05, "sampler": "ddpm"},
                            "fid": {"sampler": "ddpm"}}.items():
        q[section] = {**q.get(section, {}), **values}
    q["partition"].pop("shards_per_client", None)
    dp = tmp_path / "dpart"
    partition_and_write(partition_stage_config(q, 0), dp / "seed_0")
    assert tensors_sha(partition_file(0, dp)) == BEFORE_TENSORS["partition_tiny_iid_seed0"]
    warmup(diffusion_stage_config(q, "warmup", 0), tmp_path / "warmup", partition_file(0, dp),
           progress=False, workers=1)
    assert same_run(tmp_path / "warmup/models/client_000.safetensors", "warmup_client0_tensors",
                    BEFORE["warmup_client0_tensors"])
    generate(diffusion_stage_config(q, "generate", 0), tmp_path / "gen", tmp_path / "warmup",
             partition_file(0, dp), progress=False)
    assert same_run(tmp_path / "gen/aux.safetensors", "generate_aux_tensors",
                    BEFORE["generate_aux_tensors"])


def test_each_replicate_draws_its_own_partition_and_warmup(tmp_path):
    """Replicates 0 and 1 get different partitions and different warm-up initialisations; a
    replicate's stage config records its own seed, whatever the root seed."""
    from fedpipe.data import load_dataset
    from fedpipe.pipeline.diffusion import diffusion_stage_config, make_unet

    for r in (0, 1):
        partition_and_write(partition_stage_config(with_changes(PARAMS, seed=5), r), tmp_path / f"seed_{r}")
    a, b = (load_tensors(partition_file(r, tmp_path)) for r in (0, 1))
    assert not torch.equal(a["train_indices"], b["train_indices"])
    cfgs = [diffusion_stage_config(with_changes(PARAMS, seed=5), "warmup", r) for r in (0, 1)]
    assert [c.seed for c in cfgs] == [0, 1] and [c.params_read["seed"] for c in cfgs] == [0, 1]
    assert diffusion_stage_config(with_changes(PARAMS, seed=5), "feature_extractor").seed == 5  # shared
    meta = load_dataset(cfgs[0].dataset).meta
    w0, w1 = (next(iter(make_unet(c.diffusion, meta, c.seed, "warmup-init", 0).parameters()))
              for c in cfgs)
    assert not torch.equal(w0, w1)


# -- DVC: adding a replicate runs only its stages -----------------------------------------------------
STAND_IN = """\
import os, sys
from pathlib import Path
import yaml
from fedpipe.cli import matrix_values
from fedpipe.pipeline.skip import stage_outputs
""" + STAND_IN_OUTPUTS + """
stage = os.environ["DVC_STAGE"]
name = stage.split("@")[0]
spec = yaml.safe_load(Path("dvc.yaml").read_text())["stages"][name]
keys = list(spec.get("matrix") or {})
item = dict(zip(keys, matrix_values(stage, len(keys)))) if keys else None
write_outputs(stage, stage_outputs(name, "dvc.yaml", item))
"""


def pipeline_copy(dst: Path, seeds: list[int]) -> dict:
    """The project's dvc.yaml with its code deps (and code files) dropped: the real partition and plan
    stages, every other stage a stand-in that writes its declared outputs (named after the stage);
    params.yaml with a small study."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name, spec in stages.items():
        spec["deps"] = [d for d in spec.get("deps", [])
                        if not str(d).startswith(("src/", "stages/"))]
        if not spec["deps"]:
            del spec["deps"]
        spec["cmd"] = (f"{sys.executable} {REPO / 'stages' / name}.py" if name in ("partition", "plan")
                       else f"{sys.executable} stand_in.py")
    (dst / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    (dst / "stand_in.py").write_text(STAND_IN)
    params = with_changes(PARAMS, **{"study/algorithms": ["fedavg", "fedprox"],
                              "study/diffusion_algorithms": ["fedavg"], "study/seeds": seeds,
                              "study/diffusion_seeds": seeds})
    (dst / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(REPO / "src"),
            "DVC_NO_ANALYTICS": "1", "HOME": str(dst), "FEDPIPE_TRACKING": "off",
            "OMP_NUM_THREADS": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


@pytest.mark.slow
def test_adding_a_seed_runs_only_the_new_replicate(tmp_path):
    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent))
    env = pipeline_copy(tmp_path, [0])

    def run(*cmd: str) -> str:
        return sh(list(cmd), tmp_path, env).stdout

    def repro() -> set[str]:
        return repo_copy.repro(tmp_path, env)

    run("git", "init", "-q")
    run(dvc, "init", "-q")
    first = repro()
    assert {"partition@0", "warmup@0", "generate@0", "aux_quality@0", "server_data@0",
            "backbone@0", "federate@fedavg-0", "federate@fedprox-0", "federate_ddpm@fedavg-0",
            "feature_extractor", "evaluate", "report", "plan"} == first
    assert (tensors_sha(tmp_path / "data/partition/seed_0/partition.safetensors")
            == BEFORE_TENSORS["partition_seed0"])
    assert repro() == {"plan"}  # always_changed; nothing else

    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["study"]["seeds"] = params["study"]["diffusion_seeds"] = [0, 1]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    new = {"partition@1", "warmup@1", "generate@1", "aux_quality@1", "server_data@1", "backbone@1",
           "federate@fedavg-1", "federate@fedprox-1", "federate_ddpm@fedavg-1"}
    # evaluate and report aggregate over replicates; the shared feature extractor stays cached
    assert repro() == new | {"plan", "evaluate", "report"}
    assert (tensors_sha(tmp_path / "data/partition/seed_1/partition.safetensors")
            == BEFORE_TENSORS["partition_seed1"])
    # the new replicate read its own upstream files (the stand-ins name the stage that wrote them)
    assert (tmp_path / "data/server_data/seed_1/made_by.txt").read_text() == "server_data@1\n"

    # dropping the seed again: replicate 0 is still cached, nothing of it re-runs
    params["study"]["seeds"] = params["study"]["diffusion_seeds"] = [0]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert not {s for s in repro() if s.endswith("@0") or s.endswith("-0")}


@pytest.mark.parametrize("study", sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf/study")
                                         .glob("*_smoke.yaml")))
def test_every_smoke_replicate_draws_a_valid_partition(tmp_path, study):
    """Each replicate of a smoke study draws its own partition: every seed of study.seeds must find
    one its settings allow (Dir(0.01) with min_size 10 found one within 100 draws for seed 0 only)."""
    from fedpipe.config import dataset_config
    from fedpipe.config.core import load_params
    from fedpipe.data import load_dataset
    from fedpipe.data.partition import make_partition
    from fedpipe.pipeline.compose import compose_params

    root = Path(__file__).resolve().parents[1]
    p = load_params(compose_params(root, [f"study={study}"], output=str(tmp_path / "params.yaml")))
    ds = load_dataset(dataset_config(p["dataset"]))
    sizes = set()
    for seed in p["study"]["seeds"]:
        cfg = partition_stage_config(p, seed)
        part = make_partition(ds.train.y.numpy(), ds.test.y.numpy(), ds.meta.num_classes,
                              cfg.partition, cfg.seed, cfg.dataset.name)
        sizes.add(hashlib.sha256(b"".join(c.tobytes() for c in part.train)).hexdigest())
    assert len(sizes) == len(p["study"]["seeds"])  # every replicate its own draw of the clients
