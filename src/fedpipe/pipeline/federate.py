"""The federate stage: train one algorithm of the study in one replicate (its seed, one of
``study.seeds``) on that replicate's partition, with
checkpoints and resume; write the final global model, the clients' own models (methods that have
them), the per-round history (CSV for `dvc plots`), the per-client accuracies of every evaluated
round (``clients.csv``: generic and personalized, so sigma_acc is a curve too) and final metrics."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedpipe.algorithms import ALGORITHMS
from fedpipe.config import ConfigError
from fedpipe.data import ClientData
from fedpipe.errors import InputError, SkippedStageError
from fedpipe.fl import RunResult, ServerData
from fedpipe.fl.state import Weights
from fedpipe.io import load_tensors, md5_file
from fedpipe.metrics import client_disagreement, per_client_accuracy, per_client_loss, sigma_acc
from fedpipe.models.adapters import load_backbone
from fedpipe.pipeline.common import FEDERATE_DIR, TrainConfig, clients_of, make_model
from fedpipe.pipeline.inputs import BACKBONE_DIR, backbone_path, replicate_dir
from fedpipe.pipeline.outputs import final_metrics
from fedpipe.pipeline.server_inputs import SERVER_DATA_DIR, check_server_data, load_server_data
from fedpipe.pipeline.training import Setup, Track, TrainOutputs, train
from fedpipe.tasks import ClassificationTask

log = logging.getLogger(__name__)


def client_evaluator(task: ClassificationTask, model_of: Callable[[Weights], torch.nn.Module],
                     test_x: torch.Tensor, test_y: torch.Tensor, local_tests: list[ClientData],
                     seed: int, global_model: bool = True) -> Callable:
    """The engine's ``evaluate(state, personal)`` for a classifier: the global model on the global
    test set and on every client's local test split (generic: accuracy, loss, and the client
    disagreement CD of Equitable-FL's eq. 9 over the local losses), and each client's own model on
    its split (personalized); per-client vectors go to ``clients.csv``, summaries to the history.
    Without a ``global_model`` (Local: :meth:`Strategy.has_global_model`) the generic part is left
    out, so that no record shows the untrained server model's scores as the method's."""

    def evaluate(state, personal) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if global_model:
            m = model_of(state.weights)
            res = task.evaluate(m, test_x, test_y)
            generic = per_client_accuracy(m, local_tests, task, seed)
            losses = per_client_loss(m, local_tests, task, seed)
            finite = losses[np.isfinite(losses)]
            out |= {"loss": res["loss"], "accuracy": res["accuracy"],
                    "client_mean": float(np.nanmean(generic)),
                    "client_std": float(np.nanstd(generic)),
                    "client_disagreement": client_disagreement(finite)
                    if len(finite) > 1 else float("nan"),
                    "sigma_acc_global": sigma_acc(generic, res["accuracy"]),
                    "sigma_acc_std": sigma_acc(generic, reading="std"),
                    "generic_accuracy": generic.tolist(), "generic_loss": losses.tolist()}
        if personal is not None:
            models = [model_of(personal[c]) if c in personal else None
                      for c in range(len(local_tests))]
            own = per_client_accuracy(models, local_tests, task, seed)
            out |= {"personal_mean": float(np.nanmean(own)), "personal_std": float(np.nanstd(own)),
                    "personal_accuracy": own.tolist()}
        return out

    return evaluate


def participant_disagreement(history: list[dict[str, float]], client_history: list[dict]
                             ) -> None:
    """Add Equitable-FL's CD (eq. 9) over each evaluated round's participants to ``history``
    (``test_cd``: as printed; ``test_cd_pairs``: the unordered-pair mean), from the per-client rows
    (``generic_loss`` of the freshly aggregated model, ``participant`` flags from the engine)."""
    by_round: dict[float, list[float]] = {}
    for row in client_history:
        if row.get("participant") == 1.0 and np.isfinite(row.get("generic_loss", np.nan)):
            by_round.setdefault(float(row["round"]), []).append(float(row["generic_loss"]))
    for rec in history:
        losses = by_round.get(rec["round"])
        if losses is not None and len(losses) > 1:
            rec["test_cd"] = client_disagreement(np.array(losses))
            rec["test_cd_pairs"] = client_disagreement(np.array(losses), normalization="pairs")


def backbone_of(cfg: TrainConfig, backbone_dir: str | Path = BACKBONE_DIR
                ) -> tuple[Weights | None, dict[str, str]]:
    """The backbone an algorithm starts from (``cfg.init.backbone``, any algorithm: ``none``,
    ``fedavg``, the ``backbone`` stage's output for this seed, or a safetensors path) and the input
    files it read (for lineage)."""
    backbone = cfg.init.backbone
    if backbone == "none":
        return None, {}
    if backbone == "fedavg":
        path = backbone_path(cfg.seed, backbone_dir)
        stage = f"backbone@{cfg.seed}"
        if not path.is_file():
            raise InputError(path, f"missing (the FedAvg backbone of {cfg.algorithm}, seed "
                             f"{cfg.seed})", stage)
        try:
            return load_tensors(path, stage), {str(path): md5_file(path)}
        except SkippedStageError:
            raise InputError(path, "a placeholder: the plan skipped the backbone stage (no algorithm "
                             "with backbone: fedavg when it ran)", stage) from None
    if not Path(backbone).is_file():
        raise ConfigError(f"algorithms.{cfg.algorithm}.backbone", backbone,
                          "none, fedavg or an existing .safetensors file (never downloaded)")
    # a file the user made (``safetensors.torch.save_file``): no stage rebuilds it, no content hash
    return load_tensors(backbone, None, verify=False), {backbone: md5_file(backbone)}


def initial_model(cfg: TrainConfig, ds, backbone_dir: str | Path = BACKBONE_DIR
                  ) -> tuple[torch.nn.Module, dict[str, str]]:
    """The model ``cfg.algorithm`` starts from, on ``cfg.device``: the model-init stream's weights
    (:func:`~fedpipe.pipeline.common.make_model`), then its backbone's entries if it has one
    (:func:`backbone_of`: every algorithm, by ``algorithms.<name>.backbone``), and the files read."""
    model = make_model(cfg, ds).to(cfg.device.torch)
    backbone, read = backbone_of(cfg, backbone_dir)
    if backbone is not None:
        load_backbone(model, backbone)
    return model, read


def federate(cfg: TrainConfig, out_root: str | Path = FEDERATE_DIR,
             partition_path: str | Path | None = None, stop_after: int | None = None,
             on_round: Callable[[dict[str, float]], None] | None = None,
             progress: bool = True, server_data_dir: str | Path | None = None,
             backbone_dir: str | Path = BACKBONE_DIR) -> TrainOutputs:
    """Run the federate stage for ``cfg.algorithm`` in replicate ``cfg.seed`` into
    ``<out_root>/<algorithm>/seed_<seed>`` (the skeleton: :func:`~fedpipe.pipeline.training.train`).
    By default it reads the replicate's partition (``data/partition/seed_<seed>``); a method that
    declares server data gets it from ``server_data_dir`` (default ``data/server_data/seed_<seed>``,
    the ``server_data@<seed>`` stage); one with ``backbone: fedavg`` (any algorithm:
    :func:`initial_model`) its backbone from ``backbone_dir`` (``backbone@<seed>``)."""
    server_data_dir = server_data_dir or replicate_dir(SERVER_DATA_DIR, cfg.seed)
    stage = f"server_data@{cfg.seed}"
    has_global = ALGORITHMS[cfg.algorithm].has_global_model()

    def check_inputs(kind: str) -> None:
        if kind != "none":
            check_server_data(kind, server_data_dir, stage)

    def setup(ds, part) -> Setup:
        device = cfg.device.torch
        task = ClassificationTask(cfg.device.accel.bf16_autocast, cfg.device.accel.compile)
        model, read = initial_model(cfg, ds, backbone_dir)

        def evaluator(strategy) -> Callable:
            return client_evaluator(task, strategy.model_of, ds.test.x.to(device),
                                    ds.test.y.to(device),
                                    [c.to(device) for c in clients_of(ds, part, "test")], cfg.seed,
                                    global_model=has_global)

        def server_data(kind: str) -> tuple[ServerData, dict[str, str]]:
            data = load_server_data(kind, cfg.algorithm, server_data_dir, stage)
            if kind == "aux" and not data.labelled:
                raise ConfigError("diffusion.conditional", False,
                                  f"true: {cfg.algorithm} trains a classifier on the auxiliary set, "
                                  "which must be labelled (class-conditional warm-up)")
            path = Path(server_data_dir) / f"{kind}.safetensors"
            return replace(data, data=data.data.to(device)), {str(path): md5_file(path)}

        def finish(out: Path, result: RunResult, strategy) -> dict[str, float]:
            participant_disagreement(result.history, result.client_history)
            final = final_metrics(result.history, result.rounds_done)
            log.info("%s (seed %d): %d rounds, %s", cfg.algorithm, cfg.seed, result.rounds_done,
                     ", ".join(f"{k} {final[k]:.4f}" for k in ("test_accuracy", "personal_acc_mean")
                               if k in final))
            return final

        return Setup(task, lambda: make_model(cfg, ds).to(device), model, read, evaluator,
                     server_data, finish)

    curve = ("test_accuracy", "global test accuracy") if has_global else (
        "test_personal_mean", "clients' own models: mean local test accuracy (no global model)")
    return train(cfg, Track("fl", {"model": cfg.model.name}, f"{cfg.algorithm} on {cfg.dataset.name}",
                            curve, check_inputs, setup),
                 out_root, partition_path, stop_after, on_round, progress)
