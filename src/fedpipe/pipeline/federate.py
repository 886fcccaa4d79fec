"""The federate stage: train one algorithm of the study in one replicate (its seed, one of
``study.seeds``) on that replicate's partition, with
checkpoints and resume; write the final global model, the clients' own models (methods that have
them), the per-round history (CSV for `dvc plots`), the per-client accuracies of every evaluated
round (``clients.csv``: generic and personalized, so sigma_acc is a curve too) and final metrics."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedpipe.algorithms import ALGORITHMS
from fedpipe.cli import keep_on_interrupt
from fedpipe.config import ConfigError
from fedpipe.data import ClientData, load_dataset
from fedpipe.errors import InputError, SkippedStageError
from fedpipe.fl import RunResult, run_federated
from fedpipe.fl.state import Weights
from fedpipe.io import (
    load_tensors,
    md5_file,
    save_figure,
    write_json,
)
from fedpipe.metrics import client_disagreement, per_client_accuracy, per_client_loss, sigma_acc
from fedpipe.models.adapters import load_backbone
from fedpipe.pipeline.common import (
    FEDERATE_DIR,
    TrainConfig,
    clients_of,
    fingerprint_of,
    load_partition,
    make_model,
)
from fedpipe.pipeline.inputs import (
    BACKBONE_DIR,
    backbone_path,
    checkpoint_dir,
    partition_file,
    replicate_dir,
)
from fedpipe.pipeline.outputs import final_metrics, plot_history, run_dir, save_run
from fedpipe.pipeline.server_inputs import SERVER_DATA_DIR, check_server_data, load_server_data
from fedpipe.tasks import ClassificationTask

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FederateOutputs:
    result: RunResult
    out_dir: Path
    final: dict[str, float]
    inputs: dict[str, str]
    outputs: dict[str, str]


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
             backbone_dir: str | Path = BACKBONE_DIR) -> FederateOutputs:
    """Run the federate stage for ``cfg.algorithm`` in replicate ``cfg.seed`` into
    ``<out_root>/<algorithm>/seed_<seed>``; resumes from its checkpoint
    (:func:`~fedpipe.pipeline.inputs.checkpoint_dir`) if present. By default it reads the
    replicate's partition (``data/partition/seed_<seed>``); a method that declares server data gets
    it from ``server_data_dir`` (default ``data/server_data/seed_<seed>``, the ``server_data@<seed>``
    stage); one with ``backbone: fedavg`` (any algorithm: :func:`initial_model`) its backbone from
    ``backbone_dir`` (``backbone@<seed>``)."""
    out = run_dir(out_root, cfg.algorithm, cfg.seed)
    partition_path = partition_path or partition_file(cfg.seed)
    server_data_dir = server_data_dir or replicate_dir(SERVER_DATA_DIR, cfg.seed)
    part = load_partition(partition_path, cfg.seed)
    method = ALGORITHMS[cfg.algorithm]
    if method.needs_client_groups and "groups" not in part.meta:
        raise ConfigError("partition.scheme", part.meta["scheme"],
                          f"label_blocks ({cfg.algorithm} needs each client's planted group)")
    method.check_clients(cfg.algo_cfg, part.num_clients, cfg.fl.clients_per_round(part.num_clients))
    kind = method.server_data_kind(cfg.algo_cfg)
    if kind != "none":  # every input is readable before any compute
        check_server_data(kind, server_data_dir, f"server_data@{cfg.seed}")
    ds = load_dataset(cfg.dataset)
    device = cfg.device.torch  # everything below lives there (on the CPU: as it always did)
    clients = [c.to(device) for c in clients_of(ds, part)]
    task = ClassificationTask(cfg.device.accel.bf16_autocast, cfg.device.accel.compile)
    model, read = initial_model(cfg, ds, backbone_dir)
    strategy = method(
        task, lambda: make_model(cfg, ds).to(device), cfg.fl.local, cfg.algo_cfg,
        aggregation=cfg.fl.aggregation, num_clients=part.num_clients,
        client_groups=part.meta.get("groups"))  # label_blocks' planted groups: GIFAIR, NMI
    inputs = {str(partition_path): md5_file(partition_path)} | read
    server_data = None
    if kind != "none":
        server_data = load_server_data(kind, cfg.algorithm, server_data_dir, f"server_data@{cfg.seed}")
        server_data = replace(server_data, data=server_data.data.to(device))
        if kind == "aux" and not server_data.labelled:
            raise ConfigError("diffusion.conditional", False,
                              f"true: {cfg.algorithm} trains a classifier on the auxiliary set, "
                              "which must be labelled (class-conditional warm-up)")
        sd_path = Path(server_data_dir) / f"{kind}.safetensors"
        inputs[str(sd_path)] = md5_file(sd_path)
    evaluate = client_evaluator(task, strategy.model_of, ds.test.x.to(device), ds.test.y.to(device),
                                [c.to(device) for c in clients_of(ds, part, "test")], cfg.seed,
                                global_model=method.has_global_model())
    ckpt = checkpoint_dir(out_root, cfg.algorithm, f"seed_{cfg.seed}")
    keep_on_interrupt(f"checkpoint (every fl.checkpoint_every rounds) kept in {ckpt}")
    result = run_federated(strategy, model, clients, cfg.fl, cfg.seed, evaluate=evaluate,
                           checkpoint_dir=ckpt,
                           fingerprint=fingerprint_of(cfg.params_read, *inputs),
                           stop_after=stop_after, server_data=server_data, on_round=on_round,
                           progress=progress)
    participant_disagreement(result.history, result.client_history)
    save_run(out, result, {"algorithm": cfg.algorithm, "model": cfg.model.name})
    final = final_metrics(result.history, result.rounds_done)
    write_json(out / "metrics.json", final)
    metric = ("test_accuracy", "global test accuracy") if method.has_global_model() else (
        "test_personal_mean", "clients' own models: mean local test accuracy (no global model)")
    save_figure(out / "curves.png", plot_history(result.history, f"{cfg.algorithm} on {cfg.dataset.name}",
                                                 *metric))
    log.info("%s (seed %d): %d rounds, %s", cfg.algorithm, cfg.seed, result.rounds_done,
             ", ".join(f"{k} {final[k]:.4f}" for k in ("test_accuracy", "personal_acc_mean")
                       if k in final))
    return FederateOutputs(result, out, final, inputs,
                           {str(out / "model.safetensors"): md5_file(out / "model.safetensors")})
