"""The backbone stage: the offline backbone (PerAda's Fig. 5 alternative to ImageNet weights), the
plain model trained by FedAvg on the federation's own clients, once per replicate (its seed, on its
partition), for every algorithm of the study with ``backbone: fedavg`` (any algorithm may start from it:
:class:`fedpipe.config.fl.InitConfig`; in the PerAda studies every method does, as the paper starts
every method from the same ImageNet ResNet-18); the federate stages load it from
``data/backbone/seed_<seed>/model.safetensors`` (:func:`fedpipe.pipeline.federate.backbone_of`), and
DVC caches it. The file names no user: it is a function of the stage's params and partition alone.

Its settings are defined once: ``model``, ``fl``, ``dataset`` and the training seed as every federate
stage reads them, and ``pretrain_rounds`` (null = ``fl.rounds``) of the algorithms that use it, which
must agree (:func:`fedpipe.pipeline.plan.backbone_users`, checked by the plan stage). The result is
the one each of those algorithms pretrained inside its own federate stage before this stage existed,
bit for bit: the same model init stream, ``fl`` settings and seed stream ``(seed, "backbone-pretrain")``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fedpipe.config.fl import InitConfig
from fedpipe.data import ClientData, load_dataset
from fedpipe.errors import InputError
from fedpipe.fl import RunResult, Strategy, run_federated
from fedpipe.fl.state import Weights
from fedpipe.io import md5_file, read_json_input, save_tensors, write_json
from fedpipe.pipeline.common import (
    TrainConfig,
    clients_of,
    fingerprint_of,
    load_partition,
    make_model,
    train_config,
)
from fedpipe.pipeline.inputs import BACKBONE_DIR, backbone_path, checkpoint_dir, partition_file
from fedpipe.pipeline.skip import BACKBONE_PLAN
from fedpipe.rng import torch_seed
from fedpipe.tasks import ClassificationTask

log = logging.getLogger(__name__)

STREAM = "backbone-pretrain"


@dataclass(frozen=True)
class BackboneConfig:
    """What the backbone stage reads: the plain model's run (``train.algorithm`` is ``fedavg``, no
    algorithm config), its FedAvg rounds, and the algorithms it serves."""

    train: TrainConfig
    rounds: int
    users: tuple[str, ...]


def backbone_config(params: dict[str, Any], run_seed: int | str,
                    plan: dict[str, Any] | None = None) -> BackboneConfig:
    """Validate the params the backbone of ``run_seed`` reads (before any data is loaded). The
    algorithms it serves and their ``pretrain_rounds`` come from the plan stage
    (``data/plan/backbone.json``, :func:`fedpipe.pipeline.plan.backbone_users`), so that this stage
    loads no method but FedAvg, whose rounds train it; a plan with no user is an InputError (the
    stage skips itself then). ``plan``: that file's content, when the caller has it."""
    plan = read_json_input(BACKBONE_PLAN, "plan") if plan is None else plan
    users, pretrain_rounds = list(plan.get("users") or []), plan.get("pretrain_rounds")
    if not users:
        raise InputError(f"{BACKBONE_PLAN} names no algorithm with backbone: fedavg (the plan "
                         "stage skips this stage then): run `dvc repro plan` first")
    cfg = train_config(params, "fedavg", run_seed)
    read = {k: v for k, v in cfg.params_read.items() if not k.startswith("algorithms.")}
    rounds = pretrain_rounds or cfg.fl.rounds
    plain = replace(cfg, algorithm="fedavg", algo_cfg=None, init=InitConfig(),
                    params_read={**read, "backbone.pretrain_rounds": pretrain_rounds})
    return BackboneConfig(plain, rounds, tuple(users))


def pretrain_backbone(cfg: TrainConfig, rounds: int, ds, clients: list[ClientData],
                      checkpoint: Path | None = None, progress: bool = True
                      ) -> tuple[Weights, RunResult]:
    """The plain model (``cfg.algorithm`` fedavg, no algorithm preparation) trained by FedAvg on the
    federation's clients for ``rounds`` rounds, with the run's ``fl`` settings and the seed stream
    ``(seed, "backbone-pretrain")``; checkpointed in ``checkpoint`` (resumable)."""
    device, accel = cfg.device.torch, cfg.device.accel
    strategy = Strategy(ClassificationTask(accel.bf16_autocast, accel.compile),
                        lambda: make_model(cfg, ds).to(device), cfg.fl.local,
                        aggregation=cfg.fl.aggregation, num_clients=len(clients))
    result = run_federated(strategy, make_model(cfg, ds).to(device), clients,
                           replace(cfg.fl, rounds=rounds), torch_seed(cfg.seed, STREAM),
                           checkpoint_dir=checkpoint,
                           fingerprint=fingerprint_of({**cfg.params_read, "pretrain": rounds}),
                           progress=progress)
    return result.state.weights, result


def build_backbone(bcfg: BackboneConfig, out_root: str | Path = BACKBONE_DIR,
                   partition_path: str | Path | None = None, progress: bool = True
                   ) -> dict[str, Any]:
    """Run the backbone stage for replicate ``bcfg.train.seed`` on its partition (by default
    ``data/partition/seed_<seed>``): write ``model.safetensors`` and ``metrics.json`` under
    ``<out_root>/seed_<seed>``; return metrics, inputs and outputs."""
    cfg = bcfg.train
    path = backbone_path(cfg.seed, out_root)
    partition_path = partition_path or partition_file(cfg.seed)
    part = load_partition(partition_path, cfg.seed)
    ds = load_dataset(cfg.dataset)
    clients = [c.to(cfg.device.torch) for c in clients_of(ds, part)]
    weights, result = pretrain_backbone(cfg, bcfg.rounds, ds, clients,
                                        checkpoint_dir(out_root, f"seed_{cfg.seed}"), progress)
    save_tensors(path, {k: v.detach().cpu() for k, v in sorted(weights.items())},
                 {"fedpipe.backbone": json.dumps({"model": cfg.model.name, "rounds": bcfg.rounds,
                                                  "seed": cfg.seed}, sort_keys=True)})
    metrics = {"rounds": result.rounds_done, "final_train_loss": result.history[-1]["train_loss"],
               "tensors": len(weights), "numel": int(sum(v.numel() for v in weights.values()))}
    write_json(path.parent / "metrics.json", metrics)
    log.info("backbone (seed %d): %d FedAvg rounds for %s", cfg.seed, bcfg.rounds,
             ", ".join(bcfg.users))
    return {"metrics": metrics, "inputs": {str(partition_path): md5_file(partition_path)},
            "outputs": {str(path): md5_file(path)}}
