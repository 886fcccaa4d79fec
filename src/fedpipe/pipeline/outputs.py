"""A training run's outputs, shared by the training stages and their readers: the run folder, the saved
run (model, history, per-client records), personal models, final metrics and the history plot.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from fedpipe.errors import InputError
from fedpipe.fl import RunResult
from fedpipe.fl.state import Weights
from fedpipe.io import (
    load_tensors,
    read_json_input,
    save_tensors,
    write_csv,
    write_json,
)


def history_columns(history: list[dict[str, float]]) -> list[str]:
    cols: list[str] = []
    for rec in history:
        cols += [k for k in rec if k not in cols]
    return cols


def run_dir(root: str | Path, algorithm: str, seed: int) -> Path:
    """The output folder of one run: ``<root>/<algorithm>/seed_<seed>``."""
    return Path(root) / algorithm / f"seed_{seed}"


def personal_dir(out: Path) -> Path:
    return out / "personal"


def save_personal(out: Path, personal: dict[int, Weights], global_weights: Weights) -> None:
    """Each client's own model as ``personal/<client>.safetensors``, holding only the entries that
    differ from the global model (a FedPer client stores its head, a Local client everything), and
    ``personal/index.json`` naming them (empty for a method without personal models, so the folder,
    a DVC output, always exists); no model file of an earlier run survives."""
    d = personal_dir(out)
    if d.is_dir():
        for f in d.glob("*.safetensors"):
            f.unlink()
    index = {}
    for cid, w in sorted(personal.items()):
        own = {k: v for k, v in w.items() if not torch.equal(v, global_weights[k])}
        save_tensors(d / f"{cid}.safetensors", dict(sorted(own.items())),
                     {"fedpipe.personal": json.dumps({"client": cid, "entries": len(own)})})
        index[str(cid)] = sorted(own)
    write_json(d / "index.json", {"clients": index})  # also for a method without personal models


def load_personal(out: Path, global_weights: Weights, stage: str | None = None
                  ) -> dict[int, Weights]:
    """The clients' own models saved by :func:`save_personal` ({} for a method without them): the
    files ``personal/index.json`` names, each verified against its content hash; a missing or
    corrupt file is an InputError naming it and ``dvc repro <stage>``."""
    d = personal_dir(out)
    if not d.is_dir():
        return {}
    index = read_json_input(d / "index.json", stage)
    clients = index.get("clients") if isinstance(index, dict) else None
    if not isinstance(clients, dict) or not all(str(c).isdigit() for c in clients):
        raise InputError(d / "index.json", "not a personal-model index (corrupt?)", stage)
    return {int(c): {**global_weights, **load_tensors(d / f"{c}.safetensors", stage)}
            for c in sorted(clients, key=int)}


def save_run(out: Path, result: RunResult, model_meta: dict) -> None:
    """The final global model (``model.safetensors``, with ``model_meta`` and the rounds done), the
    clients' own models (``personal/``, methods that have them), the per-round history
    (``history.csv``) and the per-client evaluations (``clients.csv``) of a federated run."""
    save_tensors(out / "model.safetensors", dict(sorted(result.state.weights.items())),
                 {"fedpipe.model": json.dumps({**model_meta, "rounds": result.rounds_done},
                                              sort_keys=True)})
    save_personal(out, result.personal or {}, result.state.weights)
    cols = history_columns(result.history)
    write_csv(out / "history.csv", cols, [[h.get(c, "") for c in cols] for h in result.history])
    if result.client_history:
        cols = history_columns(result.client_history)
        write_csv(out / "clients.csv", cols,
                  [[h.get(c, "") for c in cols] for h in result.client_history])


def final_metrics(history: list[dict[str, float]], rounds: int) -> dict[str, float]:
    """The run's ``metrics.json``: rounds, last train loss, the global model's accuracy and loss at
    the last evaluation and its best accuracy, and the clients' own models' mean accuracy; a metric
    the method does not have (the global model's, for Local) is absent, never a number."""
    final = {"rounds": rounds, "final_train_loss": history[-1]["train_loss"]}
    evals = [h for h in history if "test_accuracy" in h]
    if evals:
        final |= {"test_accuracy": evals[-1]["test_accuracy"], "test_loss": evals[-1]["test_loss"],
                  "best_test_accuracy": float(np.max([h["test_accuracy"] for h in evals]))}
    personal = [h for h in history if "test_personal_mean" in h]
    if personal:
        final["personal_acc_mean"] = personal[-1]["test_personal_mean"]
    return final


def round_axis(ax, first: float, last: float) -> None:
    """An x axis of rounds: integer ticks, spanning the run's rounds ``first``..``last`` (half a
    round either side), so that a run evaluated once shows its point at its round among the run's
    rounds, not alone on an axis of fractions around it."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlim(first - 0.5, last + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def plot_history(history: list[dict[str, float]], title: str, metric: str = "test_accuracy",
                 metric_label: str = "global test accuracy", loss_label: str = "cross-entropy loss"):
    """Train and test loss per round (left, y-label ``loss_label``), and the evaluated ``metric`` per
    round (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    r = [h["round"] for h in history]
    trained = [h for h in history if "train_loss" in h]  # none where no client trains (aux_only)
    if trained:
        axes[0].plot([h["round"] for h in trained], [h["train_loss"] for h in trained],
                     label="train loss (clients)")
    ev = [h for h in history if metric in h]
    tested = [h for h in history if "test_loss" in h]  # none without a global model (Local)
    if tested:
        axes[0].plot([h["round"] for h in tested], [h["test_loss"] for h in tested], marker=".",
                     label="test loss")
    axes[0].set_xlabel("round")
    axes[0].set_ylabel(loss_label)
    axes[0].legend()
    axes[1].plot([h["round"] for h in ev], [h[metric] for h in ev], marker="o", markersize=3)
    axes[1].set_xlabel("round")
    axes[1].set_ylabel(metric_label)
    for ax in axes:
        round_axis(ax, r[0], r[-1])
    fig.suptitle(title)
    fig.tight_layout()
    return fig
