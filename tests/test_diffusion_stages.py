"""Diffusion-track stages: config errors, warm-up resume, auxiliary-set generation (exact counts,
labels, determinism), the FID feature extractor and the quality report of the auxiliary set."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from fakes import default_params
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpipe.config import ConfigError
from fedpipe.data import Partition
from fedpipe.errors import InputError
from fedpipe.fl.engine import SECONDS_FILE
from fedpipe.io import load_tensors, read_json
from fedpipe.pipeline.aux import aux_counts, load_aux, requested_labels
from fedpipe.pipeline.aux_quality import aux_quality
from fedpipe.pipeline.diffusion import client_path, diffusion_stage_config
from fedpipe.pipeline.feature_extractor import feature_extractor
from fedpipe.pipeline.fid_tools import load_fid_tools
from fedpipe.pipeline.generate import generate
from fedpipe.pipeline.partition import partition_and_write, partition_stage_config
from fedpipe.pipeline.warmup import warmup

REPO = Path(__file__).resolve().parents[1]
PARAMS = default_params()

# CPU-tiny settings: 4 IID clients, T = 10, 2 warm-up epochs, a 2-epoch FID classifier.
TINY = {
    "partition": {"scheme": "iid", "num_clients": 4},
    "diffusion": {"num_train_timesteps": 10},
    "warmup": {"epochs": 2, "batch_size": 64},
    "generate": {"ratio": 0.1, "sampler": "ddpm"},
    "fid": {"classifier_epochs": 2, "num_samples": 50, "sampler": "ddpm"},
}


def params_with(*layers: dict) -> dict:
    p = yaml.safe_load(yaml.safe_dump(PARAMS))
    for layer in layers:
        for section, values in layer.items():
            if isinstance(values, dict) and isinstance(p.get(section), dict):
                p[section] = {**p[section], **values}
            else:
                p[section] = values
    return p


def tiny_params(**sections) -> dict:
    p = params_with(TINY, sections)
    if p["partition"]["scheme"] == "iid":
        p["partition"].pop("shards_per_client", None)
    return p


@pytest.fixture
def tiny_partition(tmp_path) -> tuple[Path, dict]:
    params = tiny_params()
    partition_and_write(partition_stage_config(params), tmp_path / "partition")
    return tmp_path / "partition" / "partition.safetensors", params


# -- config -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("section,values,expected", [
    ("diffusion", {"unet": "big"}, "diffusion.unet='big'"),
    ("diffusion", {"num_train_timesteps": 1}, "diffusion.num_train_timesteps=1"),
    ("diffusion", {"beta_end": 1e-5}, "diffusion.beta_end=1e-05"),
    ("diffusion", {"ema_decay": 1.5}, "diffusion.ema_decay=1.5"),
    ("diffusion", {"device": "tpu"}, "diffusion.device='tpu'"),
    ("diffusion", {"unet_kwargs": [1]}, "diffusion.unet_kwargs=[1]"),
    ("warmup", {"epochs": 0}, "warmup.epochs=0"),
    ("warmup", {"optimizer": "lbfgs"}, "warmup.optimizer='lbfgs'"),
    ("warmup", {"epcohs": 3}, "warmup.epcohs=3"),
    ("warmup", {"steps": 0}, "warmup.steps=0"),
    ("generate", {"sampler": "euler"}, "generate.sampler='euler'"),
    ("generate", {"ratio": 0}, "generate.ratio=0"),
    ("fid", {"extractor": "clip"}, "fid.extractor='clip'"),
    ("fid", {"extractor": "inception"}, "fid.inception_weights=None"),
    ("fid", {"extractor": "inception", "inception_weights": "nowhere/pt_inception.pth"},
     "fid.inception_weights='nowhere/pt_inception.pth'"),
    ("fid", {"num_samples": 1}, "fid.num_samples=1"),
    ("fid", {"classifier": {"name": "lenet", "kwargs": "x"}}, "fid.classifier.kwargs='x'"),
])
def test_bad_diffusion_params(section, values, expected):
    with pytest.raises(ConfigError) as info:
        diffusion_stage_config(params_with({section: values}), "warmup")
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_stage_declares_only_its_sections():
    cfg = diffusion_stage_config(PARAMS, "warmup")
    assert set(cfg.params_read) == {"seed", "dataset", "diffusion", "warmup", "device", "accel"}
    assert "fl" not in diffusion_stage_config(PARAMS, "generate").params_read


def test_warmup_stage_bad_input_exit_2_and_outputs_kept(tmp_path):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params_with({"warmup": {"lr": -1}})))
    keep = tmp_path / "data" / "warmup" / "seed_0" / "models" / "client_000.safetensors"
    keep.parent.mkdir(parents=True)
    keep.write_bytes(b"finished client")
    env = {**os.environ, "FEDPIPE_TRACKING": "off"}
    proc = subprocess.run([sys.executable, str(REPO / "stages" / "warmup.py"), "0"], cwd=tmp_path,
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "warmup.lr=-1" in proc.stderr
    assert keep.read_bytes() == b"finished client"


# -- auxiliary-set counts ---------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5000), min_size=1, max_size=50), st.floats(0.01, 2.0))
def test_aux_counts_exact_total_and_proportional(sizes, ratio):
    sizes = np.array(sizes)
    counts = aux_counts(sizes, ratio)
    assert counts.sum() == round(ratio * sizes.sum())
    if sizes.sum() > 0:
        exact = round(ratio * sizes.sum()) * sizes / sizes.sum()
        assert np.all(np.abs(counts - exact) < 1)


def test_aux_counts_hand_example():
    # 0.1 * (135, 134, 133) = 40.2 -> 40 in total; exact shares 13.5, 13.4, 13.3 -> 14, 13, 13
    assert aux_counts(np.array([135, 134, 133]), 0.1).tolist() == [14, 13, 13]


def test_requested_labels_follow_class_counts():
    labels = requested_labels(10, np.array([6, 0, 3, 1]))
    assert labels.tolist() == [0] * 6 + [2] * 3 + [3]


# -- warm-up ----------------------------------------------------------------------------------------
def test_warmup_resumes_at_first_unfinished_client(tiny_partition, tmp_path):
    part_path, params = tiny_partition
    cfg = diffusion_stage_config(params, "warmup")
    first = warmup(cfg, tmp_path / "w1", part_path, stop_after=2, progress=False)
    assert first.trained == [0, 1]
    assert not (tmp_path / "w1" / "metrics.json").exists()  # unfinished: no stage metrics yet
    assert not (tmp_path / "w1" / "models").exists()  # nor models: they are copied when all are done
    resume = tmp_path / "checkpoints" / "w1" / "models"  # checkpoint_dir: not a DVC output
    stamp = client_path(resume, 0).stat().st_mtime_ns
    first_seconds = json.loads((resume / SECONDS_FILE).read_text())["processes"]
    second = warmup(cfg, tmp_path / "w1", part_path, progress=False)
    assert second.trained == [2, 3]
    assert client_path(resume, 0).stat().st_mtime_ns == stamp  # not redone
    # the whole warm-up's seconds: both processes' (MLflow's, never the hashed metrics.json)
    both = json.loads((resume / SECONDS_FILE).read_text())["processes"]
    assert both[:1] == first_seconds and len(both) == 2
    assert second.metrics["train_seconds_total"] == pytest.approx(
        first_seconds[0] + second.metrics["train_seconds_now"])
    assert 0 < first_seconds[0] <= first.metrics["train_seconds_now"]
    assert b"seconds" not in (tmp_path / "w1" / "metrics.json").read_bytes()
    straight = warmup(cfg, tmp_path / "w2", part_path, progress=False)
    for cid in range(4):
        a = load_tensors(client_path(tmp_path / "w1" / "models", cid))
        b = load_tensors(client_path(tmp_path / "w2" / "models", cid))
        assert all(torch.equal(a[k], b[k]) for k in a), cid
    assert second.losses == straight.losses
    assert len(straight.losses[0]) == 2 and all(np.isfinite(v) for v in straight.losses[0])
    rows = (tmp_path / "w2" / "losses.csv").read_text().splitlines()
    assert rows[0] == "client,epoch,loss" and len(rows) == 1 + 4 * 2
    # other params: the old checkpoints do not match and every client is trained again
    other = diffusion_stage_config(tiny_params(warmup={"epochs": 1, "batch_size": 64}), "warmup")
    assert warmup(other, tmp_path / "w1", part_path, progress=False).trained == [0, 1, 2, 3]


def test_warmup_in_worker_processes_gives_the_same_checkpoints(tiny_partition, tmp_path):
    """Two spawned one-thread workers train the clients side by side: the same weights and losses,
    bit for bit, as one after the other in this process; a resumed client is not redone."""
    part_path, params = tiny_partition
    cfg = diffusion_stage_config(params, "warmup")
    serial = warmup(cfg, tmp_path / "serial", part_path, progress=False, workers=1)
    warmup(cfg, tmp_path / "par", part_path, progress=False, workers=2, stop_after=1)
    par = warmup(cfg, tmp_path / "par", part_path, progress=False, workers=2)
    assert par.trained == [1, 2, 3]
    assert par.losses == serial.losses
    for cid in range(4):
        a = load_tensors(client_path(tmp_path / "serial" / "models", cid))
        b = load_tensors(client_path(tmp_path / "par" / "models", cid))
        assert all(torch.equal(a[k], b[k]) for k in a), cid


def test_workers_submit_ahead_and_let_each_result_go():
    """map_in_processes keeps at most ahead x workers jobs in flight and no result it has yielded: a
    paper-size warm-up's 100 UNets, all held, ran out of file descriptors (each tensor a
    shared-memory descriptor until freed) and memory."""
    import gc
    import weakref

    from fedpipe.pipeline.workers import map_in_processes

    pulled: list[int] = []

    def jobs():
        for i in range(10):
            pulled.append(i)
            yield 1000 + i

    refs, sizes = [], []
    for k, t in enumerate(map_in_processes(torch.zeros, jobs(), 2, ahead=2)):
        assert len(pulled) <= 4 + k + 1, (k, pulled)  # 4 in flight, refilled as each one is done
        sizes.append(t.numel())
        refs.append(weakref.ref(t))
        del t
        gc.collect()
        assert all(r() is None for r in refs[:-1]), k  # the results before are freed
    assert sorted(sizes) == list(range(1000, 1010))


def test_worker_count_reads_the_environment(monkeypatch):
    from fedpipe.config import ConfigError
    from fedpipe.pipeline.workers import worker_count

    monkeypatch.setenv("FEDPIPE_WORKERS", "3")
    assert worker_count() == 3
    monkeypatch.delenv("FEDPIPE_WORKERS")
    assert worker_count() >= 1
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("FEDPIPE_WORKERS", bad)
        with pytest.raises(ConfigError, match="FEDPIPE_WORKERS"):
            worker_count()


def test_warmup_ema_weights_differ_from_raw(tiny_partition, tmp_path):
    part_path, params = tiny_partition
    raw = warmup(diffusion_stage_config(params, "warmup"), tmp_path / "raw", part_path, progress=False)
    ema_params = tiny_params(diffusion={"num_train_timesteps": 10, "ema_decay": 0.9})
    ema = warmup(diffusion_stage_config(ema_params, "warmup"), tmp_path / "ema", part_path,
                 progress=False)
    assert raw.losses == ema.losses  # same training trajectory; only the kept weights differ
    a = load_tensors(client_path(tmp_path / "raw" / "models", 0))
    b = load_tensors(client_path(tmp_path / "ema" / "models", 0))
    assert any(not torch.equal(a[k], b[k]) for k in a if a[k].is_floating_point())


def test_warmup_step_cap(tiny_partition, tmp_path):
    """``warmup.steps`` stops each client at min(steps, its full steps), on the uncapped run's own
    draws: two epochs capped at one epoch's steps are the one-epoch run bit for bit (weights and
    losses); a cap above every client's full count changes nothing; a cap inside an epoch reports
    that epoch's part."""
    part_path, params = tiny_partition
    sizes = Partition.load(part_path).sizes()
    per_epoch = [-(-int(m) // 64) for m in sizes]  # batch 64 (TINY)
    assert len(set(per_epoch)) == 1, per_epoch  # the iid clients: one epoch is one step count

    def run(name: str, **warm) -> tuple:
        res = warmup(diffusion_stage_config(tiny_params(warmup=warm), "warmup"), tmp_path / name,
                     part_path, progress=False)
        w = [load_tensors(client_path(tmp_path / name / "models", c)) for c in range(len(sizes))]
        return res.losses, w

    def same(a, b) -> bool:
        return a[0] == b[0] and all(torch.equal(x[k], y[k]) for x, y in zip(a[1], b[1], strict=True)
                                    for k in x)

    one_epoch = run("one", epochs=1)
    assert same(run("cap", epochs=2, steps=per_epoch[0]), one_epoch)
    assert same(run("big", epochs=1, steps=10**6), one_epoch)
    assert not same(run("cut", epochs=2, steps=1), one_epoch)
    assert all(len(v) == 1 for v in run("cut2", epochs=2, steps=1)[0].values())


# -- generate + FID ---------------------------------------------------------------------------------
@pytest.mark.parametrize("conditional", [False, True])
def test_generate_and_aux_quality(tmp_path, conditional):
    params = tiny_params(diffusion={"num_train_timesteps": 10, "conditional": conditional})
    partition_and_write(partition_stage_config(params), tmp_path / "partition")
    part_path = tmp_path / "partition" / "partition.safetensors"
    cfg = diffusion_stage_config(params, "aux_quality")
    warmup(cfg, tmp_path / "warmup", part_path, progress=False)
    out = generate(cfg, tmp_path / "gen", tmp_path / "warmup", part_path, progress=False)
    aux = load_aux(tmp_path / "gen" / "aux.safetensors")
    sizes = Partition.load(part_path).sizes()
    assert len(aux.images) == round(0.1 * sizes.sum()) == out["metrics"]["samples"]
    on_disk = read_json(tmp_path / "gen" / "metrics.json")  # DVC hashes it: no wall time there
    assert "seconds" not in on_disk and out["metrics"]["seconds"] > 0
    assert on_disk == {k: v for k, v in out["metrics"].items() if k != "seconds"}
    assert aux.images.shape[1:] == (1, 8, 8) and 0 <= aux.images.min() and aux.images.max() <= 1
    sources = read_json(tmp_path / "gen" / "sources.json")
    for cid, s in sources.items():
        rows = aux.client[s["start"]:s["start"] + s["count"]]
        assert (rows == int(cid)).all() and s["count"] == aux_counts(sizes, 0.1)[int(cid)]
    assert aux.labelled == conditional
    assert len(list((tmp_path / "gen" / "grids").glob("client_*.png"))) == 4
    again = generate(cfg, tmp_path / "gen2", tmp_path / "warmup", part_path, progress=False)
    assert again["outputs"][str(tmp_path / "gen2" / "aux.safetensors")] == \
        out["outputs"][str(tmp_path / "gen" / "aux.safetensors")]  # bit-identical re-run
    if conditional:  # two worker processes: the same bits in the same client order
        import os

        os.environ["FEDPIPE_WORKERS"] = "2"
        try:
            par = generate(cfg, tmp_path / "gen3", tmp_path / "warmup", part_path, progress=False)
        finally:
            os.environ["FEDPIPE_WORKERS"] = "1"
        assert par["outputs"][str(tmp_path / "gen3" / "aux.safetensors")] == \
            out["outputs"][str(tmp_path / "gen" / "aux.safetensors")]
        assert read_json(tmp_path / "gen3" / "sources.json") == sources

    fe = feature_extractor(cfg, tmp_path / "fid", progress=False)
    assert fe["metrics"]["extractor"] == "classifier:lenet"
    assert fe["metrics"]["classifier_test_accuracy"] > 0.5
    q = aux_quality(cfg, tmp_path / "q", tmp_path / "gen" / "aux.safetensors", tmp_path / "fid")
    m = read_json(tmp_path / "q" / "metrics.json")
    assert m == q["metrics"] and m["samples"] == len(aux.images)
    # an untrained 2-epoch DDPM with T = 10 is far from real data; real test data of the same size is
    # much closer
    assert m["fid_aux"] > m["fid_real_test_same_n"] > 0
    assert ("class_accuracy" in m) == conditional
    tools = load_fid_tools(cfg.fid, load_dataset_meta(params), cfg.seed, tmp_path / "fid")
    assert tools.fid.name == m["extractor"]


def load_dataset_meta(params):
    from fedpipe.config import dataset_config
    from fedpipe.data import load_dataset

    return load_dataset(dataset_config(params["dataset"])).meta


def test_generate_needs_warmup_models(tiny_partition, tmp_path):
    part_path, params = tiny_partition
    cfg = diffusion_stage_config(params, "generate")
    with pytest.raises(InputError, match="run `dvc repro warmup@0`"):  # replicate 0's warm-up
        generate(cfg, tmp_path / "gen", tmp_path / "nowhere", part_path, progress=False)
    assert not (tmp_path / "gen" / "aux.safetensors").exists()

