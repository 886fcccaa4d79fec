"""The evaluate stage: global test accuracy and per-client local-test accuracies of every algorithm
of the study; metrics JSON, per-client CSV, learning-curve and client-accuracy plots, and a
markdown comparison table."""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedpipe.config import ConfigError
from fedpipe.data import load_dataset
from fedpipe.io import load_tensors, save_figure, write_csv, write_json, write_text
from fedpipe.metrics import client_accuracy_summary, per_client_accuracy
from fedpipe.pipeline.common import (
    FEDERATE_DIR,
    PARTITION_PATH,
    TrainConfig,
    clients_of,
    load_partition,
    make_model,
)
from fedpipe.tasks import ClassificationTask

log = logging.getLogger(__name__)

EVALUATE_DIR = "data/evaluate"


@dataclass(frozen=True)
class EvaluateOutputs:
    metrics: dict[str, dict[str, float]]
    table: str
    plots: list[Path]


def read_history(path: Path) -> list[dict[str, float]]:
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def comparison_table(metrics: dict[str, dict[str, float]], title: str) -> str:
    cols = [("test_accuracy", "global acc"), ("client_acc_mean", "client mean"),
            ("client_acc_std", "client std"), ("client_acc_worst10", "worst 10%"),
            ("client_acc_best10", "best 10%"), ("final_train_loss", "train loss")]
    lines = [f"# {title}", "", "| algorithm | " + " | ".join(c[1] for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    best = {k: max(m.get(k, -np.inf) for m in metrics.values()) for k, _ in cols[:2]}
    for algo, m in metrics.items():
        cells = []
        for k, _ in cols:
            v = m.get(k)
            cell = "" if v is None else (f"{v:.4f}" if k == "final_train_loss" else f"{100 * v:.2f}")
            if k in best and v == best[k]:
                cell = f"**{cell}**"
            cells.append(cell)
        lines.append(f"| {algo} | " + " | ".join(cells) + " |")
    lines += ["", "Accuracies in %. Client statistics are over each client's local test split "
              "(drawn from the official test set with the client's label distribution)."]
    return "\n".join(lines) + "\n"


def plot_curves(histories: dict[str, list[dict[str, float]]], title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for algo, hist in histories.items():
        ev = [h for h in hist if "test_accuracy" in h]
        ax.plot([h["round"] for h in ev], [h["test_accuracy"] for h in ev], label=algo)
    ax.set_xlabel("round")
    ax.set_ylabel("global test accuracy")
    ax.set_title(title)
    ax.legend()
    return fig


def plot_client_accuracy(per_client: dict[str, np.ndarray], title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.5 + 1.2 * len(per_client), 3.5))
    names = list(per_client)
    data = [per_client[n][~np.isnan(per_client[n])] for n in names]
    ax.boxplot(data, showmeans=True)
    ax.set_xticks(range(1, len(names) + 1), names)
    for i, d in enumerate(data, start=1):
        ax.scatter(np.full(len(d), i) + np.linspace(-0.15, 0.15, len(d)), d, s=8, alpha=0.6)
    ax.set_ylabel("client local test accuracy")
    ax.set_title(title)
    return fig


def evaluate_study(cfgs: list[TrainConfig], federate_dir: str | Path = FEDERATE_DIR,
                   partition_path: str | Path = PARTITION_PATH,
                   out_dir: str | Path = EVALUATE_DIR) -> EvaluateOutputs:
    """Evaluate the final model of each algorithm (``cfgs``, one per algorithm of the study)."""
    out, fed = Path(out_dir), Path(federate_dir)
    for cfg in cfgs:
        if not (fed / cfg.algorithm / "model.safetensors").is_file():
            raise ConfigError("study.algorithms", cfg.algorithm,
                              f"an algorithm with a trained model in {fed / cfg.algorithm} "
                              f"(run `dvc repro federate@{cfg.algorithm}`)")
    part = load_partition(partition_path)
    ds = load_dataset(cfgs[0].dataset)
    local_tests = clients_of(ds, part, "test")
    task = ClassificationTask()
    metrics: dict[str, dict[str, float]] = {}
    per_client: dict[str, np.ndarray] = {}
    histories: dict[str, list[dict[str, float]]] = {}
    rows = []
    for cfg in cfgs:
        model = make_model(cfg, ds)
        model.load_state_dict(load_tensors(fed / cfg.algorithm / "model.safetensors"))
        glob = task.evaluate(model, ds.test.x, ds.test.y)
        acc = per_client_accuracy(model, local_tests, task, cfg.seed)
        histories[cfg.algorithm] = read_history(fed / cfg.algorithm / "history.csv")
        metrics[cfg.algorithm] = {"test_accuracy": glob["accuracy"], "test_loss": glob["loss"],
                                  **client_accuracy_summary(acc),
                                  "final_train_loss": histories[cfg.algorithm][-1]["train_loss"]}
        per_client[cfg.algorithm] = acc
        rows += [[cfg.algorithm, i, float(a)] for i, a in enumerate(acc)]
        log.info("%s: global %.4f, clients %.4f +- %.4f", cfg.algorithm, glob["accuracy"],
                 metrics[cfg.algorithm]["client_acc_mean"], metrics[cfg.algorithm]["client_acc_std"])
    title = f"{cfgs[0].study.name}: {cfgs[0].dataset.name}, {part.meta['scheme']}, {part.num_clients} clients"
    table = comparison_table(metrics, title)
    write_json(out / "metrics.json", metrics)
    write_csv(out / "clients.csv", ["algorithm", "client", "accuracy"], rows)
    write_text(out / "comparison.md", table)
    save_figure(out / "learning_curves.png", plot_curves(histories, title))
    save_figure(out / "client_accuracy.png", plot_client_accuracy(per_client, title))
    return EvaluateOutputs(metrics, table, [out / "learning_curves.png", out / "client_accuracy.png",
                                            out / "comparison.md"])
