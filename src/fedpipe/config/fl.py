"""Federated-training params: sections ``model``, ``fl`` (round loop and local training) and ``study``.
Algorithm hyperparameters live next to each algorithm (``fedpipe.algorithms``) and are built with the
same strict :func:`build`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from fedpipe.config.core import ConfigError, build, check, check_finite_tree, one_of, section

OPTIMIZERS = ("sgd", "adam")
AGGREGATIONS = ("weighted", "uniform")
EXECUTORS = ("serial", "batched", "ray")
PAPER_KEYS = ("fedddpm", "baselines", "fedptr", "equitable", "fednh", "perada")
"""The papers ``study.papers`` names: one module of ``fedpipe.claims`` each (defined here, so that
validating a study does not import the claims)."""


def check_optimization(cfg: Any, p: str) -> None:
    """The checks shared by every section that trains a model with an optimizer (``fl.local``,
    ``diffusion_fl.local``, ``warmup``): ``epochs``, ``steps``, ``batch_size``, ``optimizer``, ``lr``,
    ``weight_decay`` and ``grad_clip`` under the prefix ``p``."""
    check(cfg.epochs >= 1, f"{p}.epochs", cfg.epochs, "an integer >= 1")
    if cfg.steps is not None:
        check(cfg.steps >= 1, f"{p}.steps", cfg.steps, "null or an integer >= 1")
    check(cfg.batch_size >= 1, f"{p}.batch_size", cfg.batch_size, "an integer >= 1")
    one_of(f"{p}.optimizer", cfg.optimizer, OPTIMIZERS)
    check(cfg.lr > 0, f"{p}.lr", cfg.lr, "a number > 0")
    check(cfg.weight_decay >= 0, f"{p}.weight_decay", cfg.weight_decay, "a number >= 0")
    if cfg.grad_clip is not None:
        check(cfg.grad_clip > 0, f"{p}.grad_clip", cfg.grad_clip, "null or a number > 0")


@dataclass(frozen=True)
class LocalTrainConfig:
    """Local training of one client in one round.

    ``epochs`` passes over the local data, or exactly ``steps`` minibatch steps when set (epochs then
    ignored; the data is cycled). ``lr`` is multiplied by ``lr_decay`` every round (lr_r = lr *
    lr_decay^r). ``grad_clip``: max global L2 norm of the gradient (null = off).
    """

    epochs: int = 1
    steps: int | None = None
    batch_size: int = 32
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float | None = None
    lr_decay: float = 1.0

    def validate(self, p: str) -> None:
        check_optimization(self, p)
        check(0 <= self.momentum < 1, f"{p}.momentum", self.momentum, "a number in [0, 1)")
        check(0 < self.lr_decay <= 1, f"{p}.lr_decay", self.lr_decay, "a number in (0, 1]")

    def lr_at(self, round_: int) -> float:
        return self.lr * self.lr_decay ** round_


@dataclass(frozen=True)
class RayConfig:
    """The Ray executor (``fl.executor: ray``, :mod:`fedpipe.fl.ray_executor`): ``address`` of an
    existing cluster (``host:port`` as printed by ``ray start --head``, ``ray://host:port`` for Ray
    Client, or ``auto`` for the cluster this machine belongs to); null starts a local instance,
    whose session (sockets, logs, spilled objects) is kept in a folder of the user's alone,
    ``<temp>/fedpipe-ray-<uid>/ray`` (``fedpipe-ray-<uid>``: mode 0700; ``<temp>``: ``$TMPDIR``
    or ``/tmp``), not in Ray's default
    ``/tmp/ray``, which any user of the machine may write (``RAY_TMPDIR`` set: Ray's default under
    it; :func:`fedpipe.fl.ray_executor.private_temp_dir`). ``gpus_per_client``: GPUs reserved by
    each client's task (fractions share a GPU; 0 = CPU)."""

    address: str | None = None
    gpus_per_client: float = 0.0

    def validate(self, p: str) -> None:
        if self.address is not None:
            check(self.address == "auto"
                  or re.fullmatch(r"(ray://)?[A-Za-z0-9.\-]+:\d{1,5}", self.address) is not None,
                  f"{p}.address", self.address, "null (a local instance), auto, host:port or "
                  "ray://host:port")
        check(self.gpus_per_client >= 0, f"{p}.gpus_per_client", self.gpus_per_client,
              "a number >= 0")


@dataclass(frozen=True)
class FLConfig:
    """The round loop: ``rounds``; ``participation`` ratio p (n = max(round(N p), 1) clients sampled
    without replacement per round); ``aggregation`` weighted by sample count or uniform;
    evaluation every ``eval_every`` rounds; a checkpoint every ``checkpoint_every`` rounds, and
    after any round that ends ``checkpoint_seconds`` or more after the last checkpoint (0 = by
    rounds only), so that a killed run loses at most that much work;
    ``executor`` runs the clients' work (``serial``; ``ray``: Ray tasks, set up by ``ray``);
    ``divergence_factor``: a client's local loss more than this many times (in magnitude) the
    initial model's loss (measured on round 1's clients before they train, kept in the checkpoint)
    stops the run as diverged, like a non-finite loss does (:func:`fedpipe.fl.engine.guard_growth`,
    whose docstring gives the margins the default was chosen with)."""

    rounds: int = 20
    participation: float = 1.0
    aggregation: str = "weighted"
    eval_every: int = 1
    checkpoint_every: int = 5
    checkpoint_seconds: float = 60.0
    executor: str = "serial"
    divergence_factor: float = 1.0e4
    local: LocalTrainConfig = field(default_factory=LocalTrainConfig)
    ray: RayConfig = field(default_factory=RayConfig)

    def validate(self, p: str) -> None:
        check(self.rounds >= 1, f"{p}.rounds", self.rounds, "an integer >= 1")
        check(0 < self.participation <= 1, f"{p}.participation", self.participation,
              "a number in (0, 1]")
        one_of(f"{p}.aggregation", self.aggregation, AGGREGATIONS)
        check(self.eval_every >= 1, f"{p}.eval_every", self.eval_every, "an integer >= 1")
        check(self.checkpoint_every >= 1, f"{p}.checkpoint_every", self.checkpoint_every,
              "an integer >= 1")
        check(0 <= self.checkpoint_seconds < float("inf"), f"{p}.checkpoint_seconds",
              self.checkpoint_seconds, "a number of seconds >= 0 (0 = checkpoint by rounds only)")
        one_of(f"{p}.executor", self.executor, EXECUTORS)
        check(1 < self.divergence_factor < float("inf"), f"{p}.divergence_factor",
              self.divergence_factor, "a finite number > 1 (a local loss this many times the "
              "initial loss stops the run as diverged)")

    def clients_per_round(self, num_clients: int) -> int:
        return max(round(num_clients * self.participation), 1)


def fl_config(data: dict[str, Any] | None, prefix: str = "fl") -> FLConfig:
    if data is not None and not isinstance(data, dict):
        raise ConfigError(prefix, data, "a mapping of round-loop settings with a local mapping")
    data = dict(data or {})
    local = build(LocalTrainConfig, section(data, "local", prefix), f"{prefix}.local")
    ray = build(RayConfig, section(data, "ray", prefix), f"{prefix}.ray")
    data.pop("local", None)
    data.pop("ray", None)
    cfg = build(FLConfig, data, prefix)
    return FLConfig(**{**cfg.__dict__, "local": local, "ray": ray})


@dataclass(frozen=True)
class ModelConfig:
    """``name`` from the model registry; ``kwargs`` passed to its builder (e.g. width, hidden)."""

    name: str = "cnn_fednh"
    kwargs: dict = field(default_factory=dict)


def model_config(data: dict[str, Any] | None, prefix: str = "model") -> ModelConfig:
    if data is not None and not isinstance(data, dict):
        raise ConfigError(prefix, data, "a mapping with a name and kwargs")
    data = dict(data or {})
    if not isinstance(data.get("name"), str):
        raise ConfigError(f"{prefix}.name", data.get("name"), "a model name (string)")
    kwargs = data.pop("kwargs", None)
    kwargs = {} if kwargs is None else kwargs  # kwargs: null = no builder arguments
    if not isinstance(kwargs, dict):
        raise ConfigError(f"{prefix}.kwargs", kwargs, "a mapping of builder arguments")
    check_finite_tree(f"{prefix}.kwargs", kwargs)
    unknown = sorted(set(data) - {"name"})
    if unknown:
        raise ConfigError(f"{prefix}.{unknown[0]}", data[unknown[0]], "known keys are name, kwargs")
    return ModelConfig(name=data["name"], kwargs=dict(kwargs))


SERVER_DATA_FROM = ("partition", "generate")


INIT_KEYS = ("backbone", "pretrain_rounds")
"""The keys of an ``algorithms.<name>`` section that say where the method's model starts
(:class:`InitConfig`); the rest of the section is the algorithm's own config."""


@dataclass(frozen=True)
class InitConfig:
    """Where a classification method's model starts, for every algorithm (keys ``backbone`` and
    ``pretrain_rounds`` of its ``algorithms.<name>`` section; read by the federate stage, not by the
    algorithm). PerAda's paper starts every method from the same ImageNet ResNet-18 (Sec. 7,
    "Baselines"): a study compares methods fairly by giving each the same ``backbone``.

    ``backbone``: ``none`` (the model-init stream's random weights), ``fedavg`` (the ``backbone``
    stage's output for the replicate: the plain model trained by FedAvg on the federation's data for
    ``pretrain_rounds`` rounds, null = ``fl.rounds``; the paper's Fig. 5 alternative to ImageNet
    weights), or the path of a safetensors state dict (never downloaded). Every entry but the head
    (and PerAda's adapters, which a backbone has none of) is copied from it
    (:func:`fedpipe.models.adapters.load_backbone`); the head keeps its random initialisation. The
    algorithms of a study with ``backbone: fedavg`` share the one backbone per replicate, so they
    must agree on ``pretrain_rounds``."""

    backbone: str = "none"
    pretrain_rounds: int | None = None

    def validate(self, p: str) -> None:
        check(self.backbone in ("none", "fedavg") or self.backbone.endswith(".safetensors"),
              f"{p}.backbone", self.backbone, "none, fedavg or the path of a .safetensors file")
        check(self.pretrain_rounds is None or self.pretrain_rounds >= 1, f"{p}.pretrain_rounds",
              self.pretrain_rounds, "null or an integer >= 1")


@dataclass(frozen=True)
class StudyConfig:
    """The algorithms compared by the pipeline: ``algorithms`` on the classification track (one
    ``federate@<name>-<seed>`` stage per algorithm and training seed of ``seeds``),
    ``diffusion_algorithms`` on the diffusion track (one ``federate_ddpm@<name>-<seed>`` stage each);
    the evaluation and the report give mean +- std over the seeds, and the claims are judged over
    them. A classification algorithm that declares server data (FedDDPM: the auxiliary set, which
    must then be labelled: ``diffusion.conditional: true``) gets it from the ``server_data`` stage.
    ``paper_reference`` (e.g. ``mnist/15_shard``) prints that column of the FedDDPM paper's
    Tables I-III beside our numbers in the report. ``corruptions`` (names of
    ``fedpipe.data.corruptions.CORRUPTIONS``, checked there by ``check_corruption_names`` when the
    study is planned or composed) adds accuracy on corrupted copies of the test set to the
    evaluation (mean over ``severities``, then over the corruptions; PerAda's CIFAR-10-C).
    ``papers``: whose claims the report judges (default: the papers whose arms the study runs)."""

    name: str = "default"
    algorithms: list[str] = field(default_factory=lambda: ["fedavg"])
    diffusion_algorithms: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [0])
    paper_reference: str | None = None
    corruptions: list[str] = field(default_factory=list)
    severities: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    papers: list[str] | None = None
    """The papers whose claims the report judges (:data:`PAPER_KEYS`); null: those whose
    arms the study runs (``fedpipe.claims.study_papers``)."""
    diffusion_seeds: list[int] | None = None
    """The replicates whose diffusion-track stages (``warmup``, ``generate``, ``aux_quality``,
    ``federate_ddpm`` @<seed>) are in the DVC graph: ``seeds`` (null means the same; ``conf/`` writes
    ``${study.seeds}``) or ``[]``, a classification-only study with no diffusion stage per replicate.
    DVC cannot derive a stage matrix from the algorithms' configs, so the study states it."""
    server_data_from: str = "partition"
    """The stage output ``server_data@<seed>`` depends on (``data/<server_data_from>/seed_<seed>``):
    ``generate`` when a classification method reads the generated auxiliary set (server data
    ``aux`` or ``distill``), else ``partition``, so that the classification track does not wait for
    the warm-up and the generation."""

    def check_graph(self, p: str = "study") -> None:
        """The keys that shape DVC's graph agree (checked by ``plan`` and ``make params``, where the
        graph is built; a stage that reads the study alone does not need them)."""
        check(self.diffusion_seeds in (None, [], list(self.seeds)), f"{p}.diffusion_seeds",
              self.diffusion_seeds, f"[] (classification only) or study.seeds {list(self.seeds)}")
        if self.diffusion_seeds == []:
            check(not self.diffusion_algorithms, f"{p}.diffusion_algorithms",
                  self.diffusion_algorithms, "[] when study.diffusion_seeds=[] (classification only)")
            check(self.server_data_from == "partition", f"{p}.server_data_from",
                  self.server_data_from, "partition when study.diffusion_seeds=[] (nothing is generated)")

    def validate(self, p: str) -> None:
        if self.papers is not None:
            check(isinstance(self.papers, list), f"{p}.papers", self.papers,
                  "null or a list of " + ", ".join(PAPER_KEYS))
            for name in self.papers:
                check(name in PAPER_KEYS, f"{p}.papers", name, "one of " + ", ".join(PAPER_KEYS))
            check(len(set(self.papers)) == len(self.papers), f"{p}.papers", self.papers,
                  "a list without duplicates")
        check(len(self.algorithms) >= 1, f"{p}.algorithms", self.algorithms, "a non-empty list")
        for key in ("algorithms", "diffusion_algorithms"):
            names = getattr(self, key)
            check(len(set(names)) == len(names), f"{p}.{key}", names, "a list without duplicates")
        check(len(self.seeds) >= 1 and len(set(self.seeds)) == len(self.seeds)
              and min(self.seeds) >= 0, f"{p}.seeds", self.seeds,
              "a non-empty list of distinct integers >= 0")
        check(self.server_data_from in SERVER_DATA_FROM, f"{p}.server_data_from",
              self.server_data_from, " or ".join(SERVER_DATA_FROM))
        if self.paper_reference is not None:
            from fedpipe.reference import COLUMNS, FEDDDPM_FID

            table, _, column = self.paper_reference.partition("/")
            check(table in FEDDDPM_FID and column in COLUMNS, f"{p}.paper_reference",
                  self.paper_reference, f"null or <{'|'.join(FEDDDPM_FID)}>/<{'|'.join(COLUMNS)}>")
