"""Nothing silently wrong (issue 30): every artifact a stage reads back, corrupted four ways, gives
one line naming the file (and the ``dvc repro`` that rebuilds it) or, for resume state, is set aside
and never resumed; every method's keys and the settings that cannot go together are refused before
any data loads; no setting is clamped.

The readers are called directly on tiny files (no stage runs); the counts of the closing note are
:data:`ARTIFACTS` x :data:`CORRUPTIONS` and the two config tables.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from fakes import default_params

from fedpipe.algorithms import ALGORITHMS
from fedpipe.config import ConfigError  # noqa: F401 (below)
from fedpipe.config.fl import FLConfig, LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.errors import InputError
from fedpipe.io import content_hash, load_tensors, save_tensors, write_csv, write_json
from fedpipe.pipeline.partition import partition_stage_config

REPO = Path(__file__).resolve().parents[1]
BASE = default_params()


# -- corruptions -----------------------------------------------------------------------------------
def same_size(path: Path) -> None:
    """Bytes overwritten in place, the size and (for safetensors) the header intact: the last 8 bytes
    inverted (tensor data), or for a text file 4 bytes in the middle replaced by 0xFF."""
    b = bytearray(path.read_bytes())
    if path.suffix == ".safetensors":
        b[-8:] = bytes(x ^ 0xFF for x in b[-8:])
    else:
        mid = len(b) // 2
        b[mid:mid + 4] = b"\xff" * 4
    path.write_bytes(bytes(b))


def truncated(path: Path) -> None:
    b = path.read_bytes()
    path.write_bytes(b[: len(b) // 2])


def garbage(path: Path) -> None:
    path.write_bytes(os.urandom(48) + b"not what this file should be")


def absent(path: Path) -> None:
    path.unlink()


CORRUPTIONS: dict[str, Callable[[Path], None]] = {
    "same_size": same_size, "truncated": truncated, "garbage": garbage, "absent": absent}


# -- one tiny valid file of each kind, and the reader that a stage calls on it ---------------------
def _w() -> dict[str, torch.Tensor]:
    return {"layer.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7,
            "layer.bias": torch.ones(3)}


def _partition(tmp: Path) -> Path:
    from fedpipe.pipeline.partition import partition_and_write

    p = json.loads(json.dumps(BASE))
    p["partition"] = {"scheme": "iid", "num_clients": 2}
    partition_and_write(partition_stage_config(p), tmp / "partition")
    return tmp / "partition" / "partition.safetensors"


def _run(tmp: Path) -> Path:
    """A federate run's folder as save_run writes it: model (2 rounds), one client's own model,
    the personal index, the history."""
    run = tmp / "fed" / "fedper" / "seed_0"
    save_tensors(run / "model.safetensors", _w(),
                 {"fedpipe.model": json.dumps({"algorithm": "fedper", "rounds": 2})})
    save_tensors(run / "personal" / "0.safetensors", {"layer.bias": torch.zeros(3)},
                 {"fedpipe.personal": json.dumps({"client": 0, "entries": 1})})
    write_json(run / "personal" / "index.json", {"clients": {"0": ["layer.bias"]}})
    write_csv(run / "history.csv", ["round", "train_loss", "test_accuracy"],
              [[1, 2.25, 0.5], [2, 1.75, 0.625]])
    return run


def _check_run(tmp: Path) -> None:
    from fedpipe.pipeline.evaluate import check_run

    check_run(tmp / "fed" / "fedper" / "seed_0", "federate@fedper-0")


def _aux(tmp: Path) -> Path:
    path = tmp / "generate" / "aux.safetensors"
    save_tensors(path, {"images": torch.rand(4, 1, 8, 8), "labels": torch.arange(4),
                        "client": torch.zeros(4, dtype=torch.int64)},
                 {"fedpipe.aux": json.dumps({"samples": 4})})
    return path


def _server_data(tmp: Path) -> Path:
    path = tmp / "sd" / "aux.safetensors"
    save_tensors(path, {"images": torch.rand(4, 1, 8, 8), "labels": torch.arange(4)})
    return path


def _fid_reference(tmp: Path) -> Path:
    from fedpipe.metrics.fid import save_reference

    path = tmp / "fid" / "reference.safetensors"
    f = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    save_reference(path, {"real_features_sum": f.sum(0), "real_features_cov_sum": f.T @ f,
                          "real_features_num_samples": torch.tensor(2)}, "classifier:lenet")
    return path


def _evaluate_json(name: str) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        d = tmp / "evaluate"
        write_json(d / "metrics.json", {"fedavg": {"test_accuracy": 0.5, "seeds": 1.0}})
        write_json(d / "seeds.json", {"fedavg": {"0": {"test_accuracy": 0.5}}})
        return d / name
    return make


def _ddpm_run(name: str) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        d = tmp / "fd" / "fedavg" / "seed_0"
        write_json(d / "metrics.json", {"fid": 12.5, "stopped_at": 2, "server_steps": 0,
                                        "train_seconds_now": 1.0})
        write_csv(d / "history.csv", ["round", "train_loss", "test_fid"], [[1, 0.5, 20.0],
                                                                           [2, 0.25, 12.5]])
        return d / name
    return make


def _read_ddpm(tmp: Path) -> None:
    from fedpipe.config.fl import StudyConfig
    from fedpipe.pipeline.report import read_diffusion_runs

    read_diffusion_runs(StudyConfig(diffusion_algorithms=["fedavg"], seeds=[0]), tmp / "fd")


def _plan(tmp: Path) -> Path:
    write_json(tmp / "plan" / "diffusion.json", {"run": False})
    return tmp / "plan" / "diffusion.json"


def _read_plan(tmp: Path) -> None:
    from fedpipe.pipeline.skip import skip_if_unused

    os.chdir(tmp)  # placeholders land under tmp
    (tmp / "dvc.yaml").write_text(yaml.safe_dump(
        {"stages": {"feature_extractor": {"cmd": "x", "outs": ["out/classifier.safetensors"]}}}))
    skip_if_unused("feature_extractor", tmp / "plan" / "diffusion.json", tmp / "dvc.yaml")


def _mlflow_db(tmp: Path) -> Path:
    import sqlite3

    path = tmp / "mlflow.db"
    with sqlite3.connect(path) as db:
        db.execute("create table runs (id text, name text)")
        db.executemany("insert into runs values (?, ?)", [(str(i), "r" * 200) for i in range(200)])
    return path


def _check_db(tmp: Path) -> None:
    from fedpipe.tracking import check_db

    if not (tmp / "mlflow.db").is_file():  # absent: MLflow makes a new one (nothing to check)
        raise InputError(tmp / "mlflow.db", "missing (a new one would be made)", None)
    check_db(f"sqlite:///{tmp / 'mlflow.db'}")


@dataclasses.dataclass
class Artifact:
    """A file kind: ``make`` writes a valid one under tmp and returns its path; ``read`` is the
    reader a stage calls; ``stage`` is what its one line must name (None: no stage rebuilds it)."""

    make: Callable[[Path], Path]
    read: Callable[[Path], object]
    stage: str | None
    skip: tuple[str, ...] = ()  # corruptions that do not apply (and why, in a comment)


ARTIFACTS: dict[str, Artifact] = {
    "partition": Artifact(_partition, lambda t: __import__(
        "fedpipe.pipeline.inputs", fromlist=["x"]).load_partition(
            t / "partition" / "partition.safetensors", 0), "partition@0"),
    "model": Artifact(lambda t: _run(t) / "model.safetensors", _check_run, "federate@fedper-0"),
    "personal model": Artifact(lambda t: _run(t) / "personal" / "0.safetensors", _check_run,
                               "federate@fedper-0"),
    "personal index": Artifact(lambda t: _run(t) / "personal" / "index.json", _check_run,
                               "federate@fedper-0"),
    "history.csv": Artifact(lambda t: _run(t) / "history.csv", _check_run, "federate@fedper-0"),
    "auxiliary set": Artifact(_aux, lambda t: __import__(
        "fedpipe.pipeline.aux", fromlist=["x"]).load_aux(t / "generate" / "aux.safetensors", 0),
        "generate@0"),
    "warm-up model": Artifact(
        lambda t: (save_tensors(t / "warmup" / "client_000.safetensors", _w(),
                                {"fedpipe.warmup": json.dumps({"client": 0})}),
                   t / "warmup" / "client_000.safetensors")[1],
        lambda t: load_tensors(t / "warmup" / "client_000.safetensors", "warmup@0"), "warmup@0"),
    "server data": Artifact(_server_data, lambda t: __import__(
        "fedpipe.pipeline.server_inputs", fromlist=["x"]).load_server_data(
            "aux", "fedddpm", t / "sd", "server_data@0"), "server_data@0"),
    "backbone": Artifact(
        lambda t: (save_tensors(t / "backbone.safetensors", _w()), t / "backbone.safetensors")[1],
        lambda t: load_tensors(t / "backbone.safetensors", "backbone@0"), "backbone@0"),
    "FID reference": Artifact(_fid_reference, lambda t: __import__(
        "fedpipe.metrics.fid", fromlist=["x"]).load_reference(t / "fid" / "reference.safetensors"),
        "feature_extractor"),
    "evaluate metrics.json": Artifact(_evaluate_json("metrics.json"), lambda t: __import__(
        "fedpipe.pipeline.report", fromlist=["x"]).read_classification(t / "evaluate"), "evaluate"),
    "evaluate seeds.json": Artifact(_evaluate_json("seeds.json"), lambda t: __import__(
        "fedpipe.pipeline.report", fromlist=["x"]).read_classification(t / "evaluate"), "evaluate"),
    "federate_ddpm metrics.json": Artifact(_ddpm_run("metrics.json"), _read_ddpm,
                                           "federate_ddpm@fedavg-0"),
    "federate_ddpm history.csv": Artifact(_ddpm_run("history.csv"), _read_ddpm,
                                          "federate_ddpm@fedavg-0"),
    "plan file": Artifact(_plan, _read_plan, "plan",
                          skip=("absent",)),  # absent: the stage was run by hand, and runs
    # SQLite keeps no checksum of row contents: a same-size change to a value reads as that value
    # (only its structure is checked: PRAGMA quick_check)
    "mlflow.db": Artifact(_mlflow_db, _check_db, None, skip=("same_size",)),
}
TABLE = [(a, c) for a in ARTIFACTS for c in CORRUPTIONS if c not in ARTIFACTS[a].skip]


def test_every_artifact_kind_reads_back_when_intact(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, art in ARTIFACTS.items():
        d = tmp_path / name.replace(" ", "_")
        d.mkdir()
        art.make(d)
        art.read(d)  # no error


@pytest.mark.parametrize("artifact,corruption", TABLE, ids=[f"{a}-{c}" for a, c in TABLE])
def test_a_corrupt_artifact_is_one_line_naming_the_file(artifact, corruption, tmp_path,
                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    art = ARTIFACTS[artifact]
    path = art.make(tmp_path)
    CORRUPTIONS[corruption](path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(InputError) as info:
        art.read(tmp_path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg, msg
    if art.stage is not None:
        assert msg.endswith(f"run `dvc repro {art.stage}` to rebuild it"), msg
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p in before}
    assert after == before  # nothing overwritten


def test_the_hash_covers_names_dtypes_shapes_values_and_metadata():
    w = _w()
    h = content_hash(w, "{}")
    assert content_hash(dict(reversed(list(w.items()))), "{}") == h  # order of the dict: no matter
    assert content_hash(w, '{"a": 1}') != h
    assert content_hash({**w, "layer.bias": torch.ones(3, dtype=torch.float64)}, "{}") != h
    assert content_hash({**w, "layer.bias": torch.ones(1, 3)}, "{}") != h
    assert content_hash({"layer.b": w["layer.bias"], "layer.weight": w["layer.weight"]}, "{}") != h
    nudged = w["layer.bias"].clone()
    nudged[1] = torch.nextafter(nudged[1], torch.tensor(2.0))  # one ulp
    assert content_hash({**w, "layer.bias": nudged}, "{}") != h


def test_a_hashed_file_is_byte_identical_across_writes(tmp_path):
    for i in range(2):
        save_tensors(tmp_path / f"{i}.safetensors", _w(), {"k": json.dumps({"b": 1, "a": [2]})})
    assert (tmp_path / "0.safetensors").read_bytes() == (tmp_path / "1.safetensors").read_bytes()


def test_a_user_file_without_a_hash_is_read_only_when_asked(tmp_path):
    from safetensors.torch import save_file

    save_file(_w(), str(tmp_path / "bb.safetensors"))
    with pytest.raises(InputError, match="has no content hash"):
        load_tensors(tmp_path / "bb.safetensors", "backbone@0")
    assert torch.equal(load_tensors(tmp_path / "bb.safetensors", None, verify=False)["layer.bias"],
                       torch.ones(3))


# -- resume state: a checkpoint that does not verify, or is not finite, is set aside ---------------
def _engine_run(tmp: Path, rounds: int, stop_after: int | None = None):
    from fedpipe.fl import run_federated
    from fedpipe.tasks import ClassificationTask

    g = torch.Generator().manual_seed(0)
    clients = [ClientData(torch.randn(12, 4, generator=g), torch.randint(0, 3, (12,), generator=g))
               for _ in range(3)]
    local = LocalTrainConfig(epochs=1, batch_size=6, lr=0.1)

    def model():
        torch.manual_seed(0)
        return torch.nn.Linear(4, 3)

    strategy = ALGORITHMS["scaffold"](ClassificationTask(), model, local,
                                      ALGORITHMS["scaffold"].config_class(), num_clients=3)
    fl = FLConfig(rounds=rounds, participation=1.0, checkpoint_every=1, local=local)
    return run_federated(strategy, model(), clients, fl, 0, checkpoint_dir=tmp / "ckpt",
                         fingerprint="fp", stop_after=stop_after, progress=False)


def _nan_server(path: Path) -> None:
    from fedpipe.io import read_tensors

    tensors, meta = read_tensors(path)
    tensors = {k: torch.full_like(v, float("nan")) if k.startswith("w/") else v
               for k, v in tensors.items()}
    save_tensors(path, tensors, {"fedpipe.checkpoint": json.dumps(meta)})  # a valid hash


RESUME = {"server same_size": ("server.safetensors", same_size),
          "server truncated": ("server.safetensors", truncated),
          "server garbage": ("server.safetensors", garbage),
          "server non-finite": ("server.safetensors", _nan_server),
          "client same_size": ("client", same_size),
          "client truncated": ("client", truncated),
          "client garbage": ("client", garbage),
          "client absent": ("client", absent)}


@pytest.mark.parametrize("case", list(RESUME))
def test_a_corrupt_checkpoint_is_set_aside_and_never_resumed(case, tmp_path, caplog):
    whole = _engine_run(tmp_path / "whole", 3)
    _engine_run(tmp_path, 3, stop_after=2)  # killed after round 2
    name, how = RESUME[case]
    ckpt = tmp_path / "ckpt"
    path = (ckpt / name if name != "client"
            else sorted((ckpt / "clients").glob("*.safetensors"))[0])
    how(path)
    with caplog.at_level("WARNING"):
        res = _engine_run(tmp_path, 3)
    assert res.resumed_from == 0  # started afresh ...
    for k, v in whole.state.weights.items():  # ... and reached the uninterrupted run's model
        assert torch.equal(res.state.weights[k], v), k
    aside = list(tmp_path.glob("ckpt.corrupt-*"))
    assert len(aside) == 1 and (aside[0] / "server.safetensors").is_file()
    lines = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    assert len(lines) == 1 and path.name in lines[0] and "\n" not in lines[0], lines


def test_an_intact_checkpoint_resumes(tmp_path):
    _engine_run(tmp_path, 3, stop_after=2)
    assert _engine_run(tmp_path, 3).resumed_from == 2


def test_checkpoints_are_also_written_by_time(tmp_path, monkeypatch):
    """checkpoint_every larger than the run, checkpoint_seconds 0 vs tiny: only the time-based
    cadence checkpoints after round 1 of 3."""
    from fedpipe.fl import engine

    saved: list[int] = []
    real = engine.save_checkpoint
    monkeypatch.setattr(engine, "save_checkpoint",
                        lambda d, r, *a, **k: (saved.append(r), real(d, r, *a, **k))[1])
    clock = iter(range(0, 1000, 100))  # every call to the clock: 100 s later
    monkeypatch.setattr(engine.time, "monotonic", lambda: float(next(clock)))
    from fedpipe.fl import run_federated
    from fedpipe.tasks import ClassificationTask

    local = LocalTrainConfig(epochs=1, batch_size=4, lr=0.1)
    data = [ClientData(torch.randn(8, 4), torch.randint(0, 3, (8,)))]
    for seconds, want in ((0.0, [3]), (60.0, [1, 2, 3])):
        saved.clear()
        fl = FLConfig(rounds=3, participation=1.0, checkpoint_every=100, checkpoint_seconds=seconds,
                      local=local)
        run_federated(ALGORITHMS["fedavg"](ClassificationTask(), lambda: torch.nn.Linear(4, 3),
                                           local, num_clients=1),
                      torch.nn.Linear(4, 3), data, fl, 0, checkpoint_dir=tmp_path / str(seconds),
                      fingerprint="fp", progress=False)
        assert saved == want, (seconds, saved)


def test_smoke_studies_checkpoint_at_least_every_5_rounds():
    for f in sorted((REPO / "conf" / "study").glob("*_smoke.yaml")):
        study = yaml.safe_load(f.read_text())
        for section in ("fl", "diffusion_fl"):
            every = (study.get(section) or {}).get("checkpoint_every", 5)
            assert every <= 5, (f.name, section, every)


# -- every method's keys: a value of the wrong type and a misspelt key, one line naming the key ----
def _bad_value(field: dataclasses.Field) -> object:
    """A value of the wrong type for ``field``: a mapping where a scalar or list is expected, a
    list where a mapping is."""
    return ["x"] if "dict" in str(field.type) else {"not": "this"}


METHOD_KEYS = [(name, f.name) for name, cls in sorted(ALGORITHMS.items())
               for f in dataclasses.fields(cls.config_class)]


def _validate(params: dict, algorithm: str):
    """What runs before any compute: the plan stage's check of every algorithms section, then the
    training stage's own (which reads its own section only)."""
    from fedpipe.pipeline.common import train_config
    from fedpipe.pipeline.plan import check_study

    check_study(params)
    return train_config(params, algorithm, 0)


@pytest.mark.parametrize("algorithm,key", METHOD_KEYS, ids=[f"{a}.{k}" for a, k in METHOD_KEYS])
def test_every_method_key_is_checked(algorithm, key):
    field = next(f for f in dataclasses.fields(ALGORITHMS[algorithm].config_class) if f.name == key)
    p = json.loads(json.dumps(BASE))
    p.setdefault("algorithms", {})[algorithm] = {key: _bad_value(field)}
    with pytest.raises(ConfigError) as info:
        _validate(p, "fedavg")  # every section is checked (by plan), not only the run's own
    assert f"algorithms.{algorithm}.{key}" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_a_misspelt_method_key_is_an_error(algorithm):
    p = json.loads(json.dumps(BASE))
    p.setdefault("algorithms", {})[algorithm] = {"learning_rate_typo": 0.1}
    with pytest.raises(ConfigError, match=rf"algorithms\.{algorithm}\.learning_rate_typo"):
        _validate(p, "fedavg")


# -- pairs of settings that cannot go together: refused before any data loads ---------------------
class ComputeStarted(Exception):
    pass


def _federate_until_data(params: dict, algorithm: str, tmp: Path, monkeypatch) -> None:
    """The federate stage's checks on a real partition file, stopped where data would load."""
    from fedpipe.pipeline import federate as fed
    from fedpipe.pipeline import training
    from fedpipe.pipeline.partition import partition_and_write

    partition_and_write(partition_stage_config(params), tmp / "partition")
    cfg = _validate(params, algorithm)

    def spy(*a, **k):
        raise ComputeStarted()
    monkeypatch.setattr(training, "load_dataset", spy)  # the training skeleton loads the data
    fed.federate(cfg, tmp / "fed", tmp / "partition" / "partition.safetensors", progress=False,
                 server_data_dir=tmp / "sd")


def _with(**sections) -> dict:
    p = json.loads(json.dumps(BASE))
    for dotted, v in sections.items():
        d = p
        *head, last = dotted.split("__")
        for k in head:
            d = d.setdefault(k, {})
        d[last] = v
    return p


IID4 = {"scheme": "iid", "num_clients": 4}
PAIRS = {
    # method x model
    "perada x mlp": (_with(), "perada", "model.name", "train_config"),
    "perada_nokd x mlp": (_with(), "perada_nokd", "model.name", "train_config"),
    "fedbn x mlp": (_with(), "fedbn", "model.name", "train_config"),
    "fedalt adapter x mlp": (_with(algorithms__fedalt={"part": "adapter"}), "fedalt", "model.name",
                             "train_config"),
    # method x server data
    "feddf holdout x no holdout": (_with(algorithms__feddf={"server_data": "holdout"}), "feddf",
                                   "dataset.holdout_fraction", "train_config"),
    "feddf public x no public set": (_with(algorithms__feddf={"server_data": "public"}), "feddf",
                                     "dataset.public_dataset", "train_config"),
    # executor x hardware
    "ray GPUs x no GPU": (_with(fl__executor="ray", fl__ray={"gpus_per_client": 1}), "fedavg",
                          "fl.ray.gpus_per_client", "train_config"),
    # method x partition
    "gifair x iid": (_with(partition=IID4), "gifair", "partition.scheme", "federate"),
    "pow_d candidates < per round": (_with(partition=IID4, fl__participation=1.0,
                                           algorithms__pow_d={"candidates": 2}), "pow_d",
                                     "algorithms.pow_d.candidates", "federate"),
    "pow_d candidates > clients": (_with(partition=IID4, fl__participation=0.5,
                                         algorithms__pow_d={"candidates": 5}), "pow_d",
                                   "algorithms.pow_d.candidates", "federate"),
    "equitable_fl clusters > per round": (_with(partition=IID4, fl__participation=0.5,
                                                algorithms__equitable_fl={"num_clusters": 3}),
                                          "equitable_fl", "algorithms.equitable_fl.num_clusters",
                                          "federate"),
}


@pytest.mark.parametrize("case", list(PAIRS))
def test_settings_that_cannot_go_together_are_refused_before_data(case, tmp_path, monkeypatch):
    params, algorithm, key, where = PAIRS[case]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same on a GPU machine
    with pytest.raises(ConfigError) as info:
        if where == "train_config":
            _validate(params, algorithm)
        else:
            _federate_until_data(params, algorithm, tmp_path, monkeypatch)
    msg = str(info.value)
    assert f"{key}=" in msg and "\n" not in msg, msg


@pytest.mark.parametrize("key,names", [("study.diffusion_algorithms", ["fedddpm_pluss"]),
                                       ("study.algorithms", ["fedavgg"])])
def test_plan_checks_both_tracks_names_before_any_stage(key, names, tmp_path):
    from fedpipe.pipeline.plan import write_plan

    p = json.loads(json.dumps(BASE))
    p["study"][key.split(".")[1]] = names
    with pytest.raises(ConfigError, match=rf"{key}\[0\]='{names[0]}'"):
        write_plan(p, tmp_path)
    assert not (tmp_path / "data").exists()  # nothing written


def test_pow_d_honours_every_candidate_count_it_accepts():
    """d = r selects uniformly (no probe needed to pick), d = N probes all: never raised or cut."""
    from fedpipe.algorithms.pow_d import PowD
    from fedpipe.rng import numpy_rng

    asked: list[list[int]] = []

    def probe(c):
        asked.append(list(c))
        return {i: {"loss": float(i)} for i in c}
    for d in (2, 3, 4):
        s = PowD(None, lambda: None, LocalTrainConfig(), PowD.config_class(candidates=d),
                 num_clients=4)
        PowD.check_clients(s.cfg, 4, 2)
        picked = s.select_clients(None, 0, [0, 1, 2, 3], 2, numpy_rng(0, "t"), probe)
        assert len(picked) == 2
    assert [len(a) for a in asked] == [3, 4]  # d = 2 = r: nothing to choose among, no probe
