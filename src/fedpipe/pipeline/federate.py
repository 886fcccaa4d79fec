"""The federate stage: train one algorithm of the study on the partition, with checkpoints and
resume; write the final model, the per-round history (CSV for `dvc plots`, JSON) and final metrics."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedpipe.algorithms import ALGORITHMS
from fedpipe.config import ConfigError
from fedpipe.data import ClientData, load_dataset
from fedpipe.fl import RunResult, run_federated
from fedpipe.io import md5_file, save_figure, save_tensors, write_csv, write_json
from fedpipe.pipeline.common import (
    FEDERATE_DIR,
    PARTITION_PATH,
    TrainConfig,
    clients_of,
    fingerprint_of,
    load_partition,
    make_model,
)
from fedpipe.tasks import ClassificationTask

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FederateOutputs:
    result: RunResult
    out_dir: Path
    final: dict[str, float]
    inputs: dict[str, str]
    outputs: dict[str, str]


def history_columns(history: list[dict[str, float]]) -> list[str]:
    cols: list[str] = []
    for rec in history:
        cols += [k for k in rec if k not in cols]
    return cols


def save_run(out: Path, result: RunResult, model_meta: dict) -> None:
    """The final global model (``model.safetensors``, with ``model_meta`` and the rounds done) and
    the per-round history (``history.csv``) of a federated run."""
    save_tensors(out / "model.safetensors", dict(sorted(result.state.weights.items())),
                 {"fedpipe.model": json.dumps({**model_meta, "rounds": result.rounds_done},
                                              sort_keys=True)})
    cols = history_columns(result.history)
    write_csv(out / "history.csv", cols, [[h.get(c, "") for c in cols] for h in result.history])


def plot_history(history: list[dict[str, float]], title: str, metric: str = "test_accuracy",
                 metric_label: str = "global test accuracy", loss_label: str | None = None):
    """Train and test loss per round (left), and the evaluated ``metric`` per round (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    r = [h["round"] for h in history]
    axes[0].plot(r, [h["train_loss"] for h in history], label="train loss (clients)")
    ev = [h for h in history if metric in h]
    axes[0].plot([h["round"] for h in ev], [h["test_loss"] for h in ev], marker=".",
                 label="test loss")
    axes[0].set_xlabel("round")
    if loss_label is not None:
        axes[0].set_ylabel(loss_label)
    axes[0].legend()
    axes[1].plot([h["round"] for h in ev], [h[metric] for h in ev], marker=".")
    axes[1].set_xlabel("round")
    axes[1].set_ylabel(metric_label)
    fig.suptitle(title)
    return fig


def federate(cfg: TrainConfig, out_root: str | Path = FEDERATE_DIR,
             partition_path: str | Path = PARTITION_PATH, stop_after: int | None = None,
             on_round: Callable[[dict[str, float]], None] | None = None,
             progress: bool = True, aux_path: str | Path | None = None) -> FederateOutputs:
    """Run the federate stage for ``cfg.algorithm``; resumes from ``<out>/checkpoint`` if present.
    With ``aux_path`` (the ``federate_aux`` stage), the strategy's server step gets the labelled
    auxiliary set."""
    out = Path(out_root) / cfg.algorithm
    part = load_partition(partition_path)
    ds = load_dataset(cfg.dataset)
    clients = clients_of(ds, part)
    task = ClassificationTask()
    model = make_model(cfg, ds)
    strategy = ALGORITHMS[cfg.algorithm](
        task, lambda: make_model(cfg, ds), cfg.fl.local, cfg.algo_cfg,
        aggregation=cfg.fl.aggregation, num_clients=part.num_clients)
    test_x, test_y = ds.test.x, ds.test.y

    def evaluate(state):
        m = strategy.global_model(state)
        res = task.evaluate(m, test_x, test_y)
        return {"loss": res["loss"], "accuracy": res["accuracy"]}

    ctx, inputs = None, {str(partition_path): md5_file(partition_path)}
    if aux_path is not None:  # FedDDPM on a classifier: calibration on the labelled auxiliary set
        from fedpipe.pipeline.generate import load_aux  # (imports diffusers: only when needed)

        aux = load_aux(aux_path)
        if not aux.labelled:
            raise ConfigError("diffusion.conditional", False,
                              f"true: {cfg.algorithm} calibrates a classifier on the auxiliary set, "
                              "which must be labelled (class-conditional warm-up)")
        ctx = {"aux": ClientData(aux.images, aux.labels), "seed": cfg.seed, "rounds": cfg.fl.rounds}
        inputs[str(aux_path)] = md5_file(aux_path)
    result = run_federated(strategy, model, clients, cfg.fl, cfg.seed, evaluate=evaluate,
                           checkpoint_dir=out / "checkpoint",
                           fingerprint=fingerprint_of(cfg.params_read, *inputs),
                           stop_after=stop_after, ctx=ctx, on_round=on_round, progress=progress)
    save_run(out, result, {"algorithm": cfg.algorithm, "model": cfg.model.name})
    last_eval = [h for h in result.history if "test_accuracy" in h][-1]
    final = {"rounds": result.rounds_done, "final_train_loss": result.history[-1]["train_loss"],
             "test_accuracy": last_eval["test_accuracy"], "test_loss": last_eval["test_loss"],
             "best_test_accuracy": float(np.max([h["test_accuracy"] for h in result.history
                                                 if "test_accuracy" in h]))}
    write_json(out / "metrics.json", final)
    save_figure(out / "curves.png", plot_history(result.history, f"{cfg.algorithm} on {cfg.dataset.name}"))
    log.info("%s: %d rounds, test accuracy %.4f", cfg.algorithm, result.rounds_done,
             final["test_accuracy"])
    return FederateOutputs(result, out, final, inputs,
                           {str(out / "model.safetensors"): md5_file(out / "model.safetensors")})


