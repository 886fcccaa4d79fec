"""The fault fuzz (issue 17), table-driven: every bad param value, malformed params file, corrupt or
missing input file and non-finite setting gets one clear line (the key or the file, the value, what is
allowed or which `dvc repro` rebuilds it) and a non-zero exit, before any compute; a corrupt
persisted checkpoint is set aside and its stage starts fresh; a diverging warm-up or generation names
the client and never writes a non-finite model or sample set.

Every case is classified by :func:`classify` into one outcome:

- ``one_line``: rejected with a ConfigError/InputError of one line naming the expected key or file,
  before the stage's compute started (what every reject case must give);
- ``wrong_key``: one line, but it names another key than the one at fault;
- ``traceback``: an exception the stage entry point does not turn into one line;
- ``late``: the error came only after the stage's compute started (data loaded, models built);
- ``silent``: accepted, and nothing complained (or a non-finite result was written);
- ``recovered`` / ``diverged``: the wanted outcomes of the set-aside and divergence cases.

``python tests/test_fuzz.py`` prints the counts (run it on a checkout to measure before/after).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from fakes import default_params

from fedpipe.config import ConfigError, load_params
from fedpipe.pipeline.partition import partition_stage_config

REPO = Path(__file__).resolve().parents[1]
BASE = default_params()
INF, NAN = float("inf"), float("nan")
DELETE = object()
HANDLED = (ConfigError,)  # what fedpipe.cli.run_stage turns into one line and exit 2
try:
    from fedpipe.errors import InputError

    HANDLED = (ConfigError, InputError)
except ImportError:  # the code before issue 17
    pass
try:
    from fedpipe.errors import SkippedStageError

    HANDLED = (*HANDLED, SkippedStageError)
except ImportError:
    pass
try:
    from fedpipe.data import DatasetNotFoundError

    HANDLED = (*HANDLED, DatasetNotFoundError)
except ImportError:
    pass

from fedpipe.errors import DivergenceError  # noqa: E402


class ComputeStarted(Exception):
    """Raised by the spy on ``load_dataset``: the stage got past its checks into compute."""


def params_with(path: str, value: Any, base: dict | None = None) -> dict:
    """A deep copy of ``base`` (the repo's params.yaml) with dotted ``path`` set (or deleted)."""
    p = json.loads(json.dumps(base if base is not None else BASE))
    keys = path.split(".")
    d = p
    for k in keys[:-1]:
        if not isinstance(d.get(k), dict):
            d[k] = {}
        d = d[k]
    if value is DELETE:
        d.pop(keys[-1], None)
    else:
        d[keys[-1]] = value
    return p


def layered(**sections: dict) -> dict:
    p = json.loads(json.dumps(BASE))
    for s, v in sections.items():
        p[s] = v
    return p


DIRICHLET = layered(partition={"scheme": "dirichlet", "num_clients": 10, "alpha": 0.5})
SYNTHETIC = layered(dataset={"name": "synthetic"}, partition={"scheme": "iid", "num_clients": 4})
LABEL_BLOCKS = layered(partition={"scheme": "label_blocks", "num_clients": 10})


# -- validators (the composition/validation layer of each stage) and probes (what each stage does
#    next on acceptance: used only to tell a silent acceptance from an error after compute) --------
def v_partition(p):
    return partition_stage_config(p)


def v_federate(p, algorithm="fedavg"):
    from fedpipe.pipeline.common import train_config

    return train_config(p, algorithm, 0)


def v_ddpm(p, algorithm="fedavg"):
    from fedpipe.pipeline.federate_ddpm import ddpm_train_config

    return ddpm_train_config(p, algorithm, 0)


def v_diffusion(p):
    """What the diffusion stages check before compute: the config, then (first thing in each
    pipeline function, once the stage is known not to be skipped) the models' options."""
    from fedpipe.config.diffusion import check_diffusion_models
    from fedpipe.pipeline.diffusion import diffusion_stage_config

    cfg = diffusion_stage_config(p, "generate")
    check_diffusion_models(cfg.dataset, cfg.diffusion, cfg.fid)
    return cfg


def v_server_data(p):
    from fedpipe.pipeline.server_inputs import needed_kinds

    return needed_kinds(p)


def v_compose(p):
    """What composition (and the plan stage) checks: the study's names against the registries."""
    from fedpipe.pipeline.compose import check_composed

    return check_composed(p)


VALIDATORS = {"partition": v_partition, "federate": v_federate, "ddpm": v_ddpm,
              "diffusion": v_diffusion, "server_data": v_server_data, "compose": v_compose}


def p_partition(cfg, tmp):
    from fedpipe.pipeline.partition import partition_and_write

    partition_and_write(cfg, tmp / "probe_partition")


def p_federate(cfg, tmp):
    from fedpipe.algorithms import ALGORITHMS
    from fedpipe.data import load_dataset
    from fedpipe.pipeline.common import make_model

    ds = load_dataset(cfg.dataset)
    make_model(cfg, ds)
    s = ALGORITHMS[cfg.algorithm](None, lambda: make_model(cfg, ds), cfg.fl.local, cfg.algo_cfg)
    _check_finite_run(cfg.fl.local, s)


def _check_finite_run(local, strategy) -> None:
    """A non-finite setting that got through makes the run's numbers non-finite: silent."""
    vals = [local.lr, local.weight_decay, local.momentum, local.grad_clip or 0.0, local.lr_decay]
    vals += [v for v in vars(strategy.cfg).values() if isinstance(v, float)]
    if not all(math.isfinite(v) for v in vals):
        raise _Silent("non-finite setting accepted")


class _Silent(Exception):
    pass


def p_ddpm(cfg, tmp):
    from fedpipe.algorithms import ALGORITHMS
    from fedpipe.data import load_dataset
    from fedpipe.pipeline.diffusion import make_unet

    ds = load_dataset(cfg.dataset)
    make_unet(cfg.diffusion, ds.meta, 0, "probe")
    s = ALGORITHMS[cfg.algorithm](None, lambda: None, cfg.fl.local, cfg.algo_cfg)
    _check_finite_run(cfg.fl.local, s)


def p_diffusion(cfg, tmp):
    from fedpipe.data import load_dataset
    from fedpipe.pipeline.diffusion import make_task, make_unet
    from fedpipe.pipeline.fid_tools import build_classifier

    ds = load_dataset(cfg.dataset)
    make_unet(cfg.diffusion, ds.meta, 0, "probe")
    build_classifier(cfg.fid, ds.meta, 0)
    task = make_task(cfg.diffusion)
    if cfg.generate.sampler == "ddim":
        task.make_sampler("ddim", cfg.generate.ddim_steps)
    if cfg.fid.sampler == "ddim":
        task.make_sampler("ddim", cfg.fid.ddim_steps)
    w = cfg.warmup
    if not all(math.isfinite(v) for v in (w.lr, w.weight_decay, w.grad_clip or 0.0)):
        raise _Silent("non-finite setting accepted")


PROBES = {"partition": p_partition, "federate": p_federate, "ddpm": p_ddpm, "diffusion": p_diffusion}


# -- the cases ---------------------------------------------------------------------------------
@dataclass
class Case:
    id: str
    run: Callable[[Path], Any]
    expect: tuple[str, ...] = ()  # substrings of the one line
    want: str = "one_line"
    probe: Callable[[Any, Path], Any] | None = None
    setup: Callable[[Path], None] | None = None
    spy: tuple[str, ...] = ()  # modules whose load_dataset marks the start of compute
    check_after: Callable[[Path], str | None] | None = None  # recover/diverge: a problem or None
    tags: set = field(default_factory=set)


def config_case(stage: str, path: str, value: Any, key: str | None = None, base: dict | None = None,
                algorithm: str | None = None) -> Case:
    params = params_with(path, value, base)
    key = key or path
    validator = VALIDATORS[stage]
    run = (lambda tmp: validator(params, algorithm)) if algorithm else (lambda tmp: validator(params))
    return Case(f"{stage}:{path}={value!r}", run, (f"key:{key}",), probe=PROBES.get(stage))


CASES: list[Case] = []


def add(stage: str, path: str, values: list, **kw) -> None:
    for v in values:
        CASES.append(config_case(stage, path, v, **kw))


# dataset (partition stage validates it)
add("partition", "dataset.test_fraction", [0, -0.1, INF, NAN, "x", True, None])
add("partition", "dataset.split_seed", [-1, 1.5, "0"])
add("partition", "dataset.name", ["imagenet", 3, None])
add("partition", "dataset", [[1, 2], "digits"])
for k, vals in {"classes": [1, 0, INF, "x"], "channels": [2, 0], "image_size": [0, 100, 8.0],
                "train_per_class": [0, -3], "test_per_class": [0],
                "noise": [INF, NAN, -0.1, "x"], "generator_seed": [-1]}.items():
    add("partition", f"dataset.{k}", vals, base=SYNTHETIC)
# partition
add("partition", "partition.num_clients", [0, -1, INF, "ten", 2.5])
add("partition", "partition.min_size", [-1, 10 ** 6, NAN])
add("partition", "partition.local_test_size", [0, -5, "x"])
add("partition", "partition.local_test", ["all", 1, None])
add("partition", "partition.quantity_skew_sigma", [-1, INF, NAN, 6])
add("partition", "partition.feature_skew", ["blur", 1])
add("partition", "partition.feature_skew_values", [[1.0], "x"])  # with feature_skew none
add("partition", "partition.shards_per_client", [0, -2, 1000])
add("partition", "partition.alpha", [0, -1, INF, NAN, "x"], base=DIRICHLET)
add("partition", "partition.max_retries", [0, 10 ** 9], base=DIRICHLET)
add("partition", "partition.scheme", ["random", None])
add("partition", "partition.alpah", [0.1], base=DIRICHLET)
add("partition", "partition.groups", [[4, 5], [], [0, 10]], base=LABEL_BLOCKS)
CASES.append(config_case("partition", "partition.feature_skew_values", [NAN, 0.1],
                         base=params_with("partition.feature_skew", "noise")))
CASES.append(config_case("partition", "partition.feature_skew_values", [INF],
                         base=params_with("partition.feature_skew", "rotation")))
CASES.append(config_case("partition", "partition.feature_skew_values", [-0.1],
                         base=params_with("partition.feature_skew", "noise")))
add("partition", "partition", [[1], "iid"])
add("partition", "seed", [-1, 1.5, "0", None])
add("partition", "sed", [1])
# model (federate stage)
add("federate", "model.name", ["vgg", 3, None])
add("federate", "model.kwargs.hidden", [-5, "big", 0, INF, NAN, 1.5])
add("federate", "model.kwargs.norm", ["foo"], key="model.kwargs.norm")
CASES.append(config_case("federate", "model.kwargs.norm", "foo",
                         base=layered(model={"name": "resnet18", "kwargs": {}})))
CASES[-1].id += " (resnet18)"
CASES.append(config_case("federate", "model.kwargs.groups", 0, key="model.kwargs",
                         base=layered(model={"name": "resnet18", "kwargs": {"norm": "group"}})))
add("federate", "model.kwargs.mean", [[0.5]])
add("federate", "model.kwargs", [[1], "x"])
add("federate", "model.size", [3])
add("federate", "model", ["mlp"])
# fl and fl.local
add("federate", "fl.rounds", [0, -1, 2.5, "3", None])
add("federate", "fl.participation", [0, 1.5, INF, NAN])
add("federate", "fl.aggregation", ["median"])
add("federate", "fl.eval_every", [0])
add("federate", "fl.checkpoint_every", [0, -1])
add("federate", "fl.executor", ["dask"])
add("federate", "fl.ray.address", ["head:port", 5])
add("federate", "fl.ray.gpus_per_client", [-1, "one"])
add("federate", "fl.local.epochs", [0, -1, 1.5, "2", True])
add("federate", "fl.local.steps", [0, -1])
add("federate", "fl.local.batch_size", [0, -32, INF])
add("federate", "fl.local.optimizer", ["lbfgs", 1])
add("federate", "fl.local.lr", [0, -0.1, INF, NAN, "0.1", None])
add("federate", "fl.local.momentum", [1.0, -0.5, NAN])
add("federate", "fl.local.weight_decay", [-1, INF, NAN])
add("federate", "fl.local.grad_clip", [0, -1, INF, NAN])
add("federate", "fl.local.lr_decay", [0, 1.5, NAN])
add("federate", "fl.local.lrr", [0.1])
add("federate", "fl.local", [None, [1], "sgd"])
add("federate", "fl", ["fast"])
# algorithms
add("federate", "algorithms.fedprox.mu", [-1, INF, NAN, "x"], algorithm="fedprox")
add("federate", "algorithms.scaffold.global_lr", [0, INF, NAN], algorithm="scaffold")
add("federate", "algorithms.scaffold.control_variate", ["magic"], algorithm="scaffold")
add("federate", "algorithms.feddyn.alpha", [INF, NAN], algorithm="feddyn")
add("federate", "algorithms.mofedsam.rho", [INF, NAN], algorithm="mofedsam")
add("federate", "algorithms.fedrep.head_epochs", [-1, 1.5], algorithm="fedrep")
add("federate", "algorithms.fedavg_ft.ft_epochs", [-1], algorithm="fedavg_ft")
add("federate", "algorithms.fedddpm.server_lr", [INF, 0], algorithm="fedddpm")
add("federate", "algorithms.fedprox.muu", [0.1], algorithm="fedprox")
add("federate", "algorithms.ditto.backbone", ["w.pth", 3, None], algorithm="ditto")  # any method's
add("federate", "algorithms.fedrep.pretrain_rounds", [0, 1.5, "2"], algorithm="fedrep")
# every algorithms section is validated once, by the plan stage (as composition does), before any
# training stage runs; a training stage reads its own section only
add("compose", "algorithms.fedfoo", [{}])
add("compose", "algorithms.fedprox", [[1], "x"])
add("federate", "algorithms.fedavg", [[1], "x"])
add("federate", "algorithms", [["fedavg"], "fedavg"])
add("ddpm", "algorithms.fedddpm_plus.gamma", [INF, NAN], algorithm="fedddpm_plus")
add("ddpm", "algorithms.fedddpm_plus.test_every", [0], algorithm="fedddpm_plus")
add("server_data", "algorithms", [["fedavg"]])
# study
add("federate", "study.algorithms", [["fedfoo"], [], ["fedavg", "fedavg"], "fedavg", [1],
                                      ["x;touch PWNED;#"]])
add("federate", "study.seeds", [[], [-1], [0, 0], [1.5], "0"])
add("federate", "study.paper_reference", ["mnist/nope"])
add("ddpm", "study.diffusion_algorithms", [["fedfoo"], ["$(touch PWNED)"]])
add("server_data", "study.algorithms", [["fedfoo"]])
CASES.append(config_case("compose", "study.algorithms", ["x;touch PWNED;#"],
                         base=params_with("algorithms.x;touch PWNED;#", {})))
CASES.append(config_case("compose", "study.diffusion_algorithms", ["a b"]))
CASES.append(config_case("compose", "study.corruptions", ["fog"]))
CASES.append(config_case("compose", "study.severities", [0, 1],
                         base=params_with("study.corruptions", ["jpeg"])))
# device and accel (every stage that computes reads them)
add("federate", "device", ["tpu", 1, None])
add("diffusion", "device", ["gpu"])
add("federate", "accel.bf16_autocast", ["yes"])
add("federate", "accel.fp8", [True])
add("federate", "accel", [[1]])
# diffusion_fl (federate_ddpm stage)
add("ddpm", "diffusion_fl.rounds", [0])
add("ddpm", "diffusion_fl.local.lr", [INF, NAN, 0])
add("ddpm", "diffusion_fl.local.weight_decay", [INF])
add("ddpm", "diffusion_fl.local", [None])
# diffusion, warmup, generate, fid (diffusion stages)
add("diffusion", "diffusion.unet", ["big", None])
add("diffusion", "diffusion.unet_kwargs.foo", [1])
add("diffusion", "diffusion.unet_kwargs.block_out_channels", [[-16, 32], [16], "x", [0, 32]])
add("diffusion", "diffusion.unet_kwargs.norm_num_groups", [5, 0])
add("diffusion", "diffusion.unet_kwargs.dropout", [INF])
add("diffusion", "diffusion.unet_kwargs", [[1], None])
add("diffusion", "diffusion.num_train_timesteps", [1, 0, -5, 2.5])
add("diffusion", "diffusion.beta_start", [0, -1e-4, INF, NAN])
CASES.append(config_case("diffusion", "diffusion.beta_start", 0.5, key="diffusion.beta_end"))
CASES[-1].expect += ("diffusion.beta_start = 0.5",)  # the pair is wrong: both are named
add("diffusion", "diffusion.beta_end", [1.5, 1e-5, INF, NAN])
add("diffusion", "diffusion.ema_decay", [1.5, 0, INF, NAN])
add("diffusion", "diffusion.device", ["tpu"])
add("diffusion", "diffusion.conditional", ["yes"])
add("diffusion", "warmup.epochs", [0, -1, 1.5])
add("diffusion", "warmup.batch_size", [0])
add("diffusion", "warmup.lr", [0, -1, INF, NAN])
add("diffusion", "warmup.weight_decay", [INF, -1])
add("diffusion", "warmup.grad_clip", [INF, 0])
add("diffusion", "warmup.optimizer", ["lbfgs"])
add("diffusion", "warmup", [[1]])
add("diffusion", "generate.ratio", [0, 11, INF, NAN])
add("diffusion", "generate.sampler", ["euler"])
add("diffusion", "generate.ddim_steps", [0])
add("diffusion", "generate.ddim_steps", [501, 10 ** 6], base=params_with("generate.sampler", "ddim"))
add("diffusion", "generate.batch_size", [0])
add("diffusion", "fid.extractor", ["clip"])
add("diffusion", "fid.num_samples", [1, 0])
add("diffusion", "fid.classifier_lr", [INF, NAN, 0])
add("diffusion", "fid.ddim_steps", [501], base=params_with("fid.sampler", "ddim"))
add("diffusion", "fid.classifier.kwargs.padding", [-3, "x"])
add("diffusion", "fid.classifier.name", ["vgg"])
add("diffusion", "fid.classifier", [None, "lenet"])
add("diffusion", "fid.curve_samples", [1])


# -- malformed params.yaml -------------------------------------------------------------------------
def params_text_case(name: str, text: str) -> Case:
    def run(tmp: Path):
        f = tmp / "params.yaml"
        f.write_text(text)
        return load_params(f)
    return Case(f"params_file:{name}", run, ("params.yaml",))


for name, text in {"unclosed_bracket": "seed: 0\nstudy:\n  algorithms: [fedavg\n",
                   "tab": "seed: 0\ndataset:\n\tname: digits\n",
                   "bad_indent": "seed: 0\n dataset: x\n  name: y\n",
                   "top_level_list": "- seed\n- 0\n",
                   "binary": "\x00\x01\x02: [",
                   "duplicate_anchor": "a: *nothere\n"}.items():
    CASES.append(params_text_case(name, text))
CASES.append(Case("params_file:missing", lambda tmp: load_params(tmp / "nope.yaml"), ("nope.yaml",)))


# -- corrupt, truncated, garbage and missing input files -------------------------------------------
TINY = {"partition": {"scheme": "iid", "num_clients": 2}, "diffusion": {"num_train_timesteps": 10},
        "warmup": {"epochs": 1, "batch_size": 128}, "generate": {"ratio": 0.02},
        "fid": {"classifier_epochs": 1, "num_samples": 20, "curve_samples": 20, "sampler": "ddpm"},
        "fl": {"rounds": 1, "local": {"epochs": 1}},
        "diffusion_fl": {"rounds": 1, "eval_every": 1, "local": {"epochs": 1, "optimizer": "adam",
                                                                  "lr": 1e-3}}}


def tiny_params(**extra) -> dict:
    p = json.loads(json.dumps(BASE))
    for layer in (TINY, extra):
        for s, v in layer.items():
            p[s] = {**p[s], **v} if isinstance(p.get(s), dict) and isinstance(v, dict) else v
    p["partition"].pop("shards_per_client", None)
    return p


def _write_valid_inputs(tmp: Path) -> None:
    """Valid input files of every kind (a real partition; readable stand-ins for the rest: the
    stage's checks must fire before anything reads their contents)."""
    from fedpipe.io import save_tensors
    from fedpipe.pipeline.partition import partition_and_write

    partition_and_write(partition_stage_config(tiny_params()), tmp / "partition")
    z = torch.zeros(2)
    for cid in range(2):
        save_tensors(tmp / "warmup" / "models" / f"client_{cid:03d}.safetensors", {"w": z})
    aux = {"images": torch.zeros(4, 1, 8, 8), "labels": torch.zeros(4, dtype=torch.int64),
           "client": torch.zeros(4, dtype=torch.int64)}
    save_tensors(tmp / "generate" / "aux.safetensors", aux)
    save_tensors(tmp / "fid" / "classifier.safetensors", {"w": z},
                 {"fedpipe.fid_classifier": json.dumps({"model": "lenet"})})
    save_tensors(tmp / "fid" / "reference.safetensors", {"w": z},
                 {"fedpipe.fid_reference": json.dumps({"extractor": "classifier:lenet"})})
    save_tensors(tmp / "server_data" / "aux.safetensors",
                 {"images": aux["images"], "labels": aux["labels"]})


def corrupt(path: Path, how: str) -> None:
    if how == "missing":
        path.unlink()
    elif how == "truncated":
        b = path.read_bytes()
        path.write_bytes(b[: len(b) // 2])
    elif how == "garbage":
        path.write_bytes(os.urandom(64) + b"not a safetensors file")
    elif how == "empty":
        path.write_bytes(b"")


def _stage_call(stage: str, tmp: Path):
    """Call the pipeline function of ``stage`` on the files under ``tmp``."""
    part = tmp / "partition" / "partition.safetensors"
    if stage == "warmup":
        from fedpipe.pipeline.diffusion import diffusion_stage_config
        from fedpipe.pipeline.warmup import warmup

        return warmup(diffusion_stage_config(tiny_params(), "warmup"), tmp / "warmup", part,
                      progress=False)
    if stage == "generate":
        from fedpipe.pipeline.diffusion import diffusion_stage_config
        from fedpipe.pipeline.generate import generate

        return generate(diffusion_stage_config(tiny_params(), "generate"), tmp / "generate_out",
                        tmp / "warmup", part, progress=False)
    if stage == "aux_quality":
        from fedpipe.pipeline.aux_quality import aux_quality
        from fedpipe.pipeline.diffusion import diffusion_stage_config

        return aux_quality(diffusion_stage_config(tiny_params(), "aux_quality"), tmp / "aq",
                           aux_path=tmp / "generate" / "aux.safetensors", fid_dir=tmp / "fid")
    if stage == "federate_ddpm":
        from fedpipe.pipeline.federate_ddpm import ddpm_train_config, federate_ddpm

        cfg = ddpm_train_config(tiny_params(), "fedddpm", 0)
        return federate_ddpm(cfg, tmp / "fd", part, tmp / "generate" / "aux.safetensors",
                             tmp / "fid", progress=False)
    if stage == "federate":
        from fedpipe.pipeline.common import train_config
        from fedpipe.pipeline.federate import federate

        cfg = train_config(tiny_params(), "fedddpm", 0)
        return federate(cfg, tmp / "fed", part, progress=False,
                        server_data_dir=tmp / "server_data")
    if stage == "server_data":
        from fedpipe.pipeline.server_data import write_server_data

        return write_server_data({"aux": ["fedddpm"]}, tmp / "generate" / "aux.safetensors",
                                 tmp / "sd_out")
    raise AssertionError(stage)


SPY = {"warmup": ("fedpipe.pipeline.warmup",), "generate": ("fedpipe.pipeline.generate",),
       "aux_quality": ("fedpipe.pipeline.aux_quality",),
       "federate_ddpm": ("fedpipe.pipeline.training",),  # the training skeleton loads the data
       "federate": ("fedpipe.pipeline.training",), "server_data": ()}

# (file under tmp, the stage that makes it, the stages that read it)
FILES = [
    ("partition/partition.safetensors", "partition", ("warmup", "generate", "federate",
                                                      "federate_ddpm")),
    ("warmup/models/client_001.safetensors", "warmup", ("generate",)),
    ("generate/aux.safetensors", "generate", ("federate_ddpm", "aux_quality", "server_data")),
    ("fid/classifier.safetensors", "feature_extractor", ("federate_ddpm", "aux_quality")),
    ("fid/reference.safetensors", "feature_extractor", ("federate_ddpm",)),
    ("server_data/aux.safetensors", "server_data", ("federate",)),
]
for rel, maker, readers in FILES:
    for reader in readers:
        for how in ("truncated", "garbage", "missing"):
            if how != "missing" and reader in ("federate_ddpm",) and rel.startswith("partition"):
                continue  # the same loader as federate's; one reader of each kind suffices
            CASES.append(Case(
                f"file:{how}:{rel}->{reader}",
                (lambda r: lambda tmp: _stage_call(r, tmp))(reader),
                (Path(rel).name, f"dvc repro {maker}"),
                setup=(lambda rel_, how_: lambda tmp: (_write_valid_inputs(tmp),
                                                       corrupt(tmp / rel_, how_)))(rel, how),
                spy=SPY[reader], tags={"file"}))
CASES.append(Case("file:empty:generate/aux.safetensors->server_data",
                  lambda tmp: _stage_call("server_data", tmp),
                  ("aux.safetensors", "dvc repro generate"),
                  setup=lambda tmp: (_write_valid_inputs(tmp),
                                     corrupt(tmp / "generate" / "aux.safetensors", "empty")),
                  tags={"file"}))


def _placeholder_aux(tmp: Path) -> None:
    from fedpipe.pipeline.skip import write_placeholder

    _write_valid_inputs(tmp)
    write_placeholder(tmp / "generate" / "aux.safetensors", "stage generate is not used")


for reader in ("server_data", "federate_ddpm", "aux_quality"):
    CASES.append(Case(f"file:skipped-placeholder:generate/aux.safetensors->{reader}",
                      (lambda r: lambda tmp: _stage_call(r, tmp))(reader),
                      ("aux.safetensors", "was not built"), setup=_placeholder_aux,
                      spy=SPY[reader], tags={"file"}))


# -- persisted checkpoints: set aside and start fresh ---------------------------------------------
def _resume_dir(out: Path, *parts: str) -> Path:
    """Where a stage keeps its resume state (its own folder before the lead's data/checkpoints/)."""
    try:
        from fedpipe.pipeline.inputs import checkpoint_dir
    except ImportError:
        return out.joinpath(*parts, "checkpoint") if parts[-1] != "models" else out / "models"
    return checkpoint_dir(out, *parts)


def _ckpt_setup(tmp: Path) -> None:
    from fedpipe.pipeline.partition import partition_and_write

    partition_and_write(partition_stage_config(tiny_params()), tmp / "partition")
    d = _resume_dir(tmp / "fed", "fedavg", "seed_0")
    d.mkdir(parents=True)
    (d / "server.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")


def _ckpt_run(tmp: Path):
    from fedpipe.pipeline.common import train_config
    from fedpipe.pipeline.federate import federate

    cfg = train_config(tiny_params(), "fedavg", 0)
    return federate(cfg, tmp / "fed", tmp / "partition" / "partition.safetensors", progress=False)


def _ckpt_after(tmp: Path) -> str | None:
    out = tmp / "fed" / "fedavg" / "seed_0"
    if not (out / "model.safetensors").is_file():
        return "no model written"
    d = _resume_dir(tmp / "fed", "fedavg", "seed_0")
    aside = list(d.parent.glob(f"{d.name}.corrupt*"))
    return None if aside else "the corrupt checkpoint was not set aside"


def _warm_setup(tmp: Path) -> None:
    from fedpipe.pipeline.partition import partition_and_write

    partition_and_write(partition_stage_config(tiny_params()), tmp / "partition")
    f = _resume_dir(tmp / "warmup", "models") / "client_000.safetensors"
    f.parent.mkdir(parents=True)
    f.write_bytes(b"garbage")


def _warm_after(tmp: Path) -> str | None:
    from fedpipe.io import load_tensors

    f = tmp / "warmup" / "models" / "client_000.safetensors"
    if not f.is_file():
        return "no model"
    load_tensors(f)
    aside = list(tmp.rglob("client_000*.corrupt*"))
    return None if aside else "the corrupt model was not set aside"


CASES.append(Case("checkpoint:federate garbage", _ckpt_run, want="recovered", setup=_ckpt_setup,
                  check_after=_ckpt_after, tags={"compute"}))
CASES.append(Case("checkpoint:warmup garbage", lambda tmp: _stage_call("warmup", tmp),
                  want="recovered", setup=_warm_setup, check_after=_warm_after, tags={"compute"}))


# -- divergence: warm-up and generation ------------------------------------------------------------
def _diverge_warmup(tmp: Path):
    from fedpipe.pipeline.diffusion import diffusion_stage_config
    from fedpipe.pipeline.partition import partition_and_write
    from fedpipe.pipeline.warmup import warmup

    p = tiny_params(warmup={"epochs": 2, "batch_size": 128, "lr": 1e6})
    partition_and_write(partition_stage_config(p), tmp / "partition")
    return warmup(diffusion_stage_config(p, "warmup"), tmp / "warmup",
                  tmp / "partition" / "partition.safetensors", progress=False)


def _diverge_warmup_after(tmp: Path) -> str | None:
    models = list(tmp.rglob("client_*.safetensors"))
    if models:
        return f"wrote {[m.name for m in models]}"
    m = tmp / "warmup" / "metrics.json"
    return "wrote metrics.json" if m.is_file() else None


def _diverge_generate(tmp: Path):
    from fedpipe.data import load_dataset
    from fedpipe.io import save_tensors
    from fedpipe.pipeline.diffusion import diffusion_stage_config, make_unet
    from fedpipe.pipeline.generate import generate
    from fedpipe.pipeline.partition import partition_and_write

    p = tiny_params()
    partition_and_write(partition_stage_config(p), tmp / "partition")
    cfg = diffusion_stage_config(p, "generate")
    meta = load_dataset(cfg.dataset).meta
    for cid in range(2):
        w = make_unet(cfg.diffusion, meta, 0, "warmup-init", cid).state_dict()
        if cid == 1:
            w = {k: torch.full_like(v, NAN) if v.is_floating_point() else v for k, v in w.items()}
        save_tensors(tmp / "warmup" / "models" / f"client_{cid:03d}.safetensors", w)
    return generate(cfg, tmp / "gen", tmp / "warmup", tmp / "partition" / "partition.safetensors",
                    progress=False)


def _diverge_generate_after(tmp: Path) -> str | None:
    return "wrote aux.safetensors" if (tmp / "gen" / "aux.safetensors").is_file() else None


# both clients diverge; with worker processes either may be the first reported
CASES.append(Case("diverge:warmup lr 1e6", _diverge_warmup,
                  ("warm-up diverged: client ", ", epoch ", "warmup.lr=1000000.0"),
                  want="diverged", check_after=_diverge_warmup_after, tags={"compute"}))
CASES.append(Case("diverge:generate NaN warm-up model", _diverge_generate, ("client 1",),
                  want="diverged", check_after=_diverge_generate_after, tags={"compute"}))


def names(expected: str, msg: str) -> bool:
    """``key:<k>`` = the line names key k or an item or sub-key of it; else a plain substring."""
    if expected.startswith("key:"):
        return re.search(re.escape(expected[4:]) + r"[=\[.]", msg) is not None
    return expected in msg


# -- classification --------------------------------------------------------------------------------
def classify(case: Case, tmp: Path, monkeypatch=None) -> tuple[str, str]:
    """(outcome, detail) of one case, run in the empty folder ``tmp``."""
    if case.setup is not None:
        case.setup(tmp)
    patches = []
    if case.spy:
        import importlib

        def spy(*a, **k):
            raise ComputeStarted()
        for mod in case.spy:
            m = importlib.import_module(mod)
            patches.append((m, m.load_dataset))
            m.load_dataset = spy
    try:
        try:
            cfg = case.run(tmp)
        finally:
            for m, f in patches:
                m.load_dataset = f
    except ComputeStarted:
        return "late", "compute started before the fault was found"
    except DivergenceError as e:
        msg = str(e)
        if case.want != "diverged":
            return "late", msg
        if "\n" in msg or not all(s in msg for s in case.expect):
            return "wrong_key", msg
        problem = case.check_after(tmp) if case.check_after else None
        return ("silent", problem) if problem else ("diverged", msg)
    except HANDLED as e:
        msg = str(e)
        if "\n" in msg:
            return "traceback", msg
        if not all(names(s, msg) for s in case.expect):
            return "wrong_key", msg
        return "one_line", msg
    except _Silent as e:
        return "silent", str(e)
    except Exception as e:  # noqa: BLE001 (anything else is a traceback at the stage)
        return "traceback", f"{type(e).__name__}: {str(e)[:200]}"
    if case.want in ("recovered", "diverged"):
        problem = case.check_after(tmp) if case.check_after else None
        if case.want == "diverged":
            return "silent", problem or "no divergence reported"
        return ("silent", problem) if problem else ("recovered", "")
    if case.probe is None:
        return "silent", "accepted"
    try:
        case.probe(cfg, tmp)
    except _Silent as e:
        return "silent", str(e)
    except Exception as e:  # noqa: BLE001
        return "late", f"{type(e).__name__}: {str(e)[:200]}"
    return "silent", "accepted and ran"


IDS = [c.id for c in CASES]
assert len(set(IDS)) == len(IDS), [i for i in IDS if IDS.count(i) > 1]


def test_every_params_section_is_refused_malformed_by_a_stage_that_reads_it(tmp_path, monkeypatch):
    """Every top-level key of the repository's params.yaml, given a value of the wrong type (a list),
    is refused with a ConfigError naming that key by at least one stage's validator, and by no
    other exception; and every validator refuses some section (none accepts everything). A section
    added to params.yaml that no stage checks, or a validator that lets a malformed section through
    to a TypeError, fails here."""
    monkeypatch.chdir(tmp_path)
    refused: dict[str, set[str]] = {}
    for section in BASE:
        bad = params_with(section, ["not", "a", "section"])
        for stage, validate in VALIDATORS.items():
            try:
                validate(bad)
            except ConfigError as e:
                if e.key == section or str(e.key).startswith(f"{section}."):
                    refused.setdefault(section, set()).add(stage)
    assert set(BASE) - set(refused) == set(), refused
    assert set(VALIDATORS) - set().union(*refused.values()) == set(), refused


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_fault(case: Case, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outcome, detail = classify(case, tmp_path)
    assert outcome == case.want, f"{case.id}: {outcome}: {detail}"


# -- through the stage scripts: exit code 2 and a single stderr line -------------------------------
def run_script(tmp: Path, script: str, params_text: str, *args: str) -> subprocess.CompletedProcess:
    (tmp / "params.yaml").write_text(params_text)
    env = {**os.environ, "FEDPIPE_TRACKING": "off", "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, str(REPO / "stages" / script), *args], cwd=tmp,
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("script,params_text,args,expect", [
    ("federate.py", yaml.safe_dump(params_with("fl.local.lr", INF)), ("fedavg", "0"),
     "fl.local.lr=inf"),
    ("warmup.py", "seed: 0\ndataset:\n\tname: digits\n", ("0",), "params.yaml"),
    ("federate.py", yaml.safe_dump(BASE), ("fedavg", "0"), "dvc repro partition"),
])
def test_stage_script_one_line_exit_2(tmp_path, script, params_text, args, expect):
    proc = run_script(tmp_path, script, params_text, *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], lines
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").rglob("*.safetensors"))


def count(cases: list[Case] | None = None) -> Counter:
    import tempfile

    out: Counter = Counter()
    rows = []
    for c in cases or CASES:
        with tempfile.TemporaryDirectory() as d:
            cwd = os.getcwd()
            os.chdir(d)
            try:
                outcome, detail = classify(c, Path(d))
            finally:
                os.chdir(cwd)
        out[outcome] += 1
        rows.append((c.id, c.want, outcome, detail))
    return out, rows


if __name__ == "__main__":
    import logging

    logging.disable(logging.WARNING)
    counts, rows = count()
    for cid, want, outcome, detail in rows:
        if outcome != want:
            print(f"{outcome:10s} {cid}  | {detail[:160]}")
    print(f"total {len(rows)}: {dict(counts)}")


# -- params never reach a shell --------------------------------------------------------------------
def test_matrix_values_from_dvc_stage(monkeypatch):
    from fedpipe.cli import matrix_values, stage_arguments

    assert matrix_values("federate@fedavg_ft-12", 2) == ["fedavg_ft", "12"]
    assert matrix_values("dvc.yaml:federate_ddpm@x;touch PWNED;#-0", 2) == ["x;touch PWNED;#", "0"]
    with pytest.raises(ConfigError, match="DVC_STAGE"):
        matrix_values("report", 2)
    monkeypatch.setenv("DVC_STAGE", "federate@fedprox-3")
    assert stage_arguments(["federate.py"], "algorithm", "seed") == ["fedprox", "3"]
    assert stage_arguments(["federate.py", "fedavg", "0"], "algorithm", "seed") == ["fedavg", "0"]


def test_dvc_commands_hold_no_params():
    """No ``${...}`` in any command of dvc.yaml: DVC runs ``cmd`` through a shell."""
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    cmds = {name: s.get("cmd", "") for name, s in dvc["stages"].items()}
    assert cmds and not {n: c for n, c in cmds.items() if "${" in str(c)}


@pytest.mark.slow
def test_dvc_repro_never_runs_a_param_as_shell(tmp_path):
    """``study.algorithms: ["x;touch PWNED;#"]`` with a matching ``algorithms`` key: ``dvc repro``
    of the real federate stages (their matrix and cmd from dvc.yaml) creates no file; the
    stage itself refuses the name in one line."""
    import shutil

    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    bad = "x;touch PWNED;#"
    stages = {}
    for name in ("federate", "federate_ddpm"):
        s = dvc["stages"][name]
        stages[name] = {"matrix": s["matrix"], "cmd": s["cmd"], "deps": [f"stages/{name}.py"]}
    (tmp_path / "stages").mkdir()
    for name in stages:
        shutil.copy(REPO / "stages" / f"{name}.py", tmp_path / "stages")
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    params = json.loads(json.dumps(BASE))
    params["study"] = {**params["study"], "algorithms": [bad], "diffusion_algorithms": [bad],
                       "seeds": [0]}
    params["algorithms"][bad] = {}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "FEDPIPE_TRACKING": "off", "PYTHONPATH": str(REPO / "src"),
           "PATH": bindir + os.pathsep + os.environ.get("PATH", ""), "DVC_NO_ANALYTICS": "1"}
    dvc_cmd = [sys.executable, "-m", "dvc"]
    subprocess.run([*dvc_cmd, "init", "--no-scm", "-q"], cwd=tmp_path, env=env, check=True,
                   timeout=60)
    proc = subprocess.run([*dvc_cmd, "repro"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert not list(tmp_path.rglob("PWNED")), proc.stdout + proc.stderr
    assert proc.returncode != 0
    out = proc.stderr + proc.stdout
    assert "error: invalid config: study." in out and "='x;touch PWNED;#'; allowed: one of" in out


# -- divergence names what is known ----------------------------------------------------------------
def test_divergence_names_the_section_and_the_algorithm_settings():
    from fedpipe.algorithms.fedprox import FedProx, FedProxConfig
    from fedpipe.config.fl import LocalTrainConfig
    from fedpipe.fl.engine import _guard_losses, settings_in_play
    from fedpipe.fl.state import ClientUpdate

    s = FedProx(None, lambda: None, LocalTrainConfig(lr=0.5, weight_decay=0.1), FedProxConfig(mu=1e9))
    hint = settings_in_play(s, "diffusion_fl")
    u = ClientUpdate(client_id=3, weights={}, num_samples=1, metrics={"loss": NAN})
    with pytest.raises(DivergenceError) as info:
        _guard_losses((u,), 4, hint)
    msg = str(info.value)
    assert msg.startswith("diverged: round 5, client 3: non-finite local loss (nan); ")
    assert "diffusion_fl.local.lr=0.5" in msg and "diffusion_fl.local.weight_decay=0.1" in msg
    assert "algorithms.fedprox (mu=1000000000.0)" in msg
    assert re.search(r"(?<!diffusion_)fl\.local", msg) is None  # never the classification track's
    assert "lower" not in msg  # names the settings, guesses at none


def test_metrics_json_never_holds_bare_nan(tmp_path):
    from fedpipe.io import write_json

    write_json(tmp_path / "m.json", {"a": NAN, "b": [1.0, INF], "c": {"d": -INF}, "e": 2.5})
    text = (tmp_path / "m.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"a": None, "b": [1.0, None], "c": {"d": None}, "e": 2.5}
