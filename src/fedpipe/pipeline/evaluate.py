"""The evaluate stage: for every algorithm and training seed of the study, the global model's test
accuracy and per-client local-test accuracies (generic), and each client's own model on its split
(personalized, methods with personal models); mean ± std over seeds in metrics JSON and a markdown
comparison table, every seed in seeds.json, per-client CSV, the evaluated rounds of every run
(``history.csv``, for DVC's plots), learning-curve and client-accuracy plots."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedpipe.algorithms import ALGORITHMS
from fedpipe.data import load_dataset
from fedpipe.data.corruptions import corrupted_test_sets
from fedpipe.errors import InputError
from fedpipe.io import (
    load_tensors,
    read_table,
    read_tensors,
    save_figure,
    write_csv,
    write_json,
    write_text,
)
from fedpipe.metrics import client_accuracy_summary, per_client_accuracy, train_class_counts
from fedpipe.metrics.papers import PAPERS
from fedpipe.metrics.runs import RunModels
from fedpipe.pipeline.common import (
    FEDERATE_DIR,
    PARTITION_DIR,
    TrainConfig,
    clients_of,
    load_partition,
    make_model,
)
from fedpipe.pipeline.inputs import partition_file
from fedpipe.pipeline.outputs import load_personal, round_axis, run_dir
from fedpipe.tasks import ClassificationTask

log = logging.getLogger(__name__)

EVALUATE_DIR = "data/evaluate"


@dataclass(frozen=True)
class EvaluateOutputs:
    metrics: dict[str, dict[str, float]]
    table: str
    plots: list[Path]


def check_run(run: Path, stage: str) -> None:
    """Read every file of a federate run that the evaluation reads (its model, its clients' own
    models, its history) and check it, before any compute: a missing, truncated or corrupt file
    (bytes that do not match the content hash it was written with, a history whose rounds are not
    the model's) is an InputError naming the file and ``dvc repro <stage>``."""
    weights, meta = read_tensors(run / "model.safetensors", stage)
    load_personal(run, weights, stage)
    history = read_table(run / "history.csv", stage)
    if meta.get("rounds") is not None and len(history) != meta["rounds"]:
        raise InputError(run / "history.csv", f"holds {len(history)} rounds, the model "
                         f"{meta['rounds']} (truncated or corrupt?)", stage)


def comparison_table(metrics: dict[str, dict[str, float]], title: str) -> str:
    """Mean ± std over seeds; personalized columns when any method has personal models."""
    cols = [("test_accuracy", "global acc"), ("test_accuracy_last5", "global acc, last 5 rounds"),
            ("client_acc_mean", "client mean"),
            ("client_acc_std", "σ_acc"), ("client_acc_worst10", "worst 10%"),
            ("client_acc_best10", "best 10%")]
    if any("personal_acc_mean" in m for m in metrics.values()):
        cols += [("personal_acc_mean", "personal mean"), ("personal_acc_std", "personal σ_acc"),
                 ("personal_acc_worst10", "personal worst 10%")]
    cols += [c for paper in PAPERS for c in paper.COLUMNS
             if any(c[0] in m for m in metrics.values())]  # each paper's, in the order of PAPERS
    cols.append(("final_train_loss", "train loss"))
    unscaled = {"final_train_loss", *(k for paper in PAPERS for k in paper.UNSCALED)}
    seeds = int(max(m.get("seeds", 1) for m in metrics.values()))
    lines = [f"# {title}", "", "| algorithm | " + " | ".join(c[1] for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    best = {k: max(m.get(k, -np.inf) for m in metrics.values())
            for k in ("test_accuracy", "client_acc_mean", "personal_acc_mean")}
    for algo, m in metrics.items():
        cells = []
        for k, _ in cols:
            v = m.get(k)
            if v is None:
                cells.append("–")
                continue
            scale, digits = (1, 4) if k in unscaled else (100, 2)
            cell = f"{scale * v:.{digits}f}"
            if seeds > 1:
                cell += f" ± {scale * m.get(k + '_std', 0.0):.{digits}f}"
            if k in best and v == best[k]:
                cell = f"**{cell}**"
            cells.append(cell)
        lines.append(f"| {algo} | " + " | ".join(cells) + " |")
    legend = (f"Accuracies in %, mean ± sample std over {seeds} training seed(s); – : the method has "
              "no such model or metric (Local has no global model). Client statistics are over each "
              "client's local test split (drawn from the official test set with the client's label "
              "distribution); σ_acc is their standard deviation, worst 10% the mean of the lowest "
              "tenth. Generic columns evaluate the global model; personalized ones each client's own "
              "model (methods with personal models only);")
    lines += ["", " ".join([legend, *(paper.LEGEND for paper in PAPERS if paper.LEGEND)])]
    for paper in PAPERS:
        for note in paper.notes(metrics):
            lines += ["", note]
    return "\n".join(lines) + "\n"


def draw_rounds(ax, points: dict[str, dict[float, list[float]]], ylabel: str, empty: str) -> bool:
    """Draw a per-round metric, ``points`` = {algorithm: {round: values over seeds}}, on ``ax``: a
    line with markers per algorithm (the mean over seeds) on an axis of integer rounds; when the
    study evaluated one round only, a bar per algorithm (the mean, the sample std as an error bar,
    each seed as a dot) with the round named below; when no algorithm has the metric, the axes
    say ``empty``. True when lines were drawn (a legend is due)."""
    points = {a: p for a, p in points.items() if p}
    ax.set_ylabel(ylabel)
    if not points:
        ax.text(0.5, 0.5, empty, transform=ax.transAxes, ha="center", va="center", wrap=True)
        ax.set_xticks([])
        ax.set_yticks([])
        return False
    rounds = sorted({r for p in points.values() for r in p})
    if len(rounds) == 1:
        names = list(points)
        values = [points[a][rounds[0]] for a in names]
        x = np.arange(len(names))
        ax.bar(x, [float(np.mean(v)) for v in values], color="tab:blue", alpha=0.6,
               yerr=[float(np.std(v, ddof=1)) if len(v) > 1 else 0.0 for v in values], capsize=3)
        for i, v in enumerate(values):
            ax.scatter(np.full(len(v), x[i]), v, s=10, color="k", zorder=3)
        ax.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
        ax.set_xlabel(f"round {int(rounds[0])} (one evaluation)")
        return False
    markers, styles = ["o", "s", "^", "v", "P", "X", "<", ">"], ["-", "--", "-.", ":"]
    for i, (algo, pts) in enumerate(points.items()):
        r = sorted(pts)
        ax.plot(r, [float(np.mean(pts[k])) for k in r], marker=markers[i % len(markers)],
                linestyle=styles[i % len(styles)], markersize=4,
                markerfacecolor="none" if i % 2 else None, label=algo)
    round_axis(ax, rounds[0], rounds[-1])
    ax.set_xlabel("round")
    return True


def round_points(runs: list[list[dict[str, float]]], col: str) -> dict[float, list[float]]:
    """{round: the finite values of ``col`` in that round over the runs (seeds)}."""
    pts: dict[float, list[float]] = {}
    for hist in runs:
        for h in hist:
            if col in h and np.isfinite(h[col]):
                pts.setdefault(h["round"], []).append(h[col])
    return pts


def plot_fairness_curves(histories: dict[str, list[list[dict[str, float]]]], title: str):
    """σ_acc (global reading) of the global model per round, and the clustering NMI per round
    (methods that cluster), each the mean over the seeds (:func:`draw_rounds`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    panels = [("test_sigma_acc_global", "σ_acc (global reading)",
               "no global model evaluated on the clients' splits"),
              ("cluster_nmi", "clustering NMI vs planted groups",
               "no method of this study clusters its clients")]
    for ax, (col, label, empty) in zip(axes, panels, strict=True):
        points = {algo: round_points(runs, col) for algo, runs in histories.items()}
        if draw_rounds(ax, points, label, empty):
            ax.legend(fontsize=7)
    if axes[1].patches or axes[1].lines:
        axes[1].set_ylim(-0.05, 1.05)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


HISTORY_COLUMNS = ["algorithm", "seed", "round", "test_accuracy", "test_loss"]


def history_rows(algorithm: str, seed: int, history: list[dict[str, float]]) -> list[list]:
    """The evaluated rounds of one run as rows of ``history.csv`` (:data:`HISTORY_COLUMNS`): rounds
    without an evaluation are absent, so no plot draws them as accuracy 0."""
    return [[algorithm, seed, int(h["round"]), h["test_accuracy"], h["test_loss"]]
            for h in history if "test_accuracy" in h]


def plot_curves(rows: list[list], title: str, absent: list[str] | None = None):
    """Global test accuracy per evaluated round, mean over seeds, one line per algorithm (the rows
    of :func:`history_rows`; the PNG twin of DVC's plot of ``history.csv``), or a bar per algorithm
    when the study evaluated once (:func:`draw_rounds`). ``absent``: the study's algorithms without
    a global model, named under the plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points: dict[str, dict[float, list[float]]] = {}
    for algo, _, rnd, acc, _ in rows:
        points.setdefault(algo, {}).setdefault(rnd, []).append(acc)
    fig, ax = plt.subplots(figsize=(7.5, 3.5))
    if draw_rounds(ax, points, "global test accuracy (mean over seeds)", "no global model to plot"):
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.set_title(title)
    if absent:
        fig.text(0.01, 0.01, "no global model, not drawn: " + ", ".join(absent), fontsize=7)
    fig.tight_layout(rect=(0, 0.04 if absent else 0, 1, 1))
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
    ax.set_ylabel("client local test accuracy\n(own model where the method has one)", fontsize=8)
    ax.set_title(title)
    return fig


LAST_ROUNDS = 5


def last_rounds_accuracy(history: list[dict[str, float]], k: int = LAST_ROUNDS) -> float:
    """Mean global test accuracy of the last ``k`` evaluated rounds (FedPTR's reported metric,
    FedPTR §5; with ``fl.eval_every: 1`` the last k rounds)."""
    accs = [h["test_accuracy"] for h in history if "test_accuracy" in h]
    return float(np.mean(accs[-k:])) if accs else float("nan")


SUMMARY_KEYS = ("test_accuracy", "test_accuracy_last5", "test_loss", "client_acc_mean",
                "client_acc_std", "client_acc_worst10", "client_acc_best10", "personal_acc_mean",
                "personal_acc_std", "personal_acc_worst10", "personal_acc_best10", "final_train_loss")


def evaluate_run(cfg: TrainConfig, run: Path, ds, local_tests, task, train_counts: np.ndarray,
                 corrupted: dict | None = None) -> tuple[dict, np.ndarray, np.ndarray | None]:
    """Metrics of one run (algorithm, seed): generic (the global model on the global test set and on
    each client's local test split), for a method with personal models personalized (each client's
    own model on its split), then each paper's of :data:`~fedpipe.metrics.papers.PAPERS` (FedNH's
    PM(V) / PM(L), Equitable-FL's σ_acc, PerAda's Global-test and corrupted accuracy, ...). A method
    without a global model (Local) has no generic metrics: they are absent, and ``generic`` is None.

    Every model is put in eval mode once; the papers' metrics share the passes over the test sets
    (:class:`~fedpipe.metrics.runs.RunModels`), each model going over a set once, all models of the
    run in one ``task.correct_sets`` call (which shares the body of models that differ only in their
    head)."""
    model = make_model(cfg, ds)
    weights = load_tensors(run / "model.safetensors", stage_of(cfg))
    model.load_state_dict(weights)
    model.eval()
    history = read_table(run / "history.csv", stage_of(cfg))
    generic, m = None, {}
    if ALGORITHMS[cfg.algorithm].has_global_model():
        glob = task.evaluate(model, ds.test.x, ds.test.y)
        generic = per_client_accuracy(model, local_tests, task, cfg.seed)
        m = {"test_accuracy": glob["accuracy"], "test_accuracy_last5": last_rounds_accuracy(history),
             "test_loss": glob["loss"], **client_accuracy_summary(generic)}
    m["final_train_loss"] = history[-1]["train_loss"]
    personal = load_personal(run, weights, stage_of(cfg))
    models = []
    for c in range(len(local_tests) if personal else 0):
        pm = make_model(cfg, ds)
        pm.load_state_dict(personal[c])
        models.append(pm.eval())
    own = None
    if models:
        own = per_client_accuracy(models, local_tests, task, cfg.seed)
        m |= {k.replace("client_acc", "personal_acc"): v
              for k, v in client_accuracy_summary(own).items()}
    views = RunModels(task, (ds.test.x, ds.test.y), train_counts, history, model, models, generic,
                      dict(m), corrupted)
    for paper in PAPERS:
        m |= paper.run_metrics(views)
    return m, generic, own


def stage_of(cfg: TrainConfig) -> str:
    """The DVC stage that writes a run's files."""
    return f"federate@{cfg.algorithm}-{cfg.seed}"


def mean_over_seeds(per_seed: dict[int, dict[str, float]]) -> dict[str, float]:
    """{metric: mean, metric_std: sample std (0 for one seed), seeds: n}."""
    out: dict[str, float] = {"seeds": float(len(per_seed))}
    keys = [k for k in next(iter(per_seed.values())) if all(k in m for m in per_seed.values())]
    for k in keys:
        a = np.array([m[k] for m in per_seed.values()], dtype=np.float64)
        out[k] = float(a.mean())
        out[f"{k}_std"] = float(a.std(ddof=1)) if len(a) > 1 else 0.0
    return out


def evaluate_study(cfgs: list[TrainConfig], federate_dir: str | Path = FEDERATE_DIR,
                   partition_dir: str | Path = PARTITION_DIR,
                   out_dir: str | Path = EVALUATE_DIR) -> EvaluateOutputs:
    """Evaluate the final models of every run (``cfgs``: one per algorithm and replicate), each on
    its replicate's partition (``<partition_dir>/seed_<seed>/partition.safetensors``: the clients'
    local test splits and training class counts): ``seeds.json`` {algorithm: {seed: metrics}}
    (arms of one replicate pair by seed), ``metrics.json`` {algorithm: mean and std over
    replicates}, per-client accuracies (``clients.csv``), plots and the comparison table. The test
    set and its corrupted copies (from the root ``seed``) are shared by all replicates."""
    out, fed = Path(out_dir), Path(federate_dir)
    for cfg in cfgs:
        check_run(run_dir(fed, cfg.algorithm, cfg.seed), stage_of(cfg))
    parts = {s: load_partition(partition_file(s, partition_dir), s)
             for s in dict.fromkeys(cfg.seed for cfg in cfgs)}
    ds = load_dataset(cfgs[0].dataset)
    local_tests = {s: clients_of(ds, part, "test") for s, part in parts.items()}
    train_counts = {s: train_class_counts([c.y for c in clients_of(ds, part)], ds.meta.num_classes)
                    for s, part in parts.items()}
    part = next(iter(parts.values()))  # scheme and client count: the same in every replicate
    task = ClassificationTask()
    study = cfgs[0].study
    corrupted = (corrupted_test_sets(ds, study.corruptions, study.severities,
                                     int(cfgs[0].params_read.get("seed", 0)))
                 if study.corruptions else None)
    seeds: dict[str, dict[int, dict[str, float]]] = {}
    per_client: dict[str, np.ndarray] = {}
    all_histories: dict[str, list[list[dict[str, float]]]] = {}
    rows, history = [], []
    for cfg in cfgs:
        run = run_dir(fed, cfg.algorithm, cfg.seed)
        m, generic, own = evaluate_run(cfg, run, ds, local_tests[cfg.seed], task,
                                       train_counts[cfg.seed], corrupted)
        seeds.setdefault(cfg.algorithm, {})[cfg.seed] = m
        shown = own if own is not None else generic
        per_client[cfg.algorithm] = np.concatenate([per_client.get(cfg.algorithm, np.empty(0)),
                                                    shown])
        run_history = read_table(run / "history.csv", stage_of(cfg))
        all_histories.setdefault(cfg.algorithm, []).append(run_history)
        history += history_rows(cfg.algorithm, cfg.seed, run_history)
        rows += [[cfg.algorithm, cfg.seed, i, "" if generic is None else float(generic[i]),
                  "" if own is None else float(own[i])] for i in range(len(shown))]
        log.info("%s seed %d: %s", cfg.algorithm, cfg.seed, ", ".join(
            f"{name} {m[k]:.4f}" for k, name in (("test_accuracy", "global"),
                                                  ("client_acc_mean", "clients"),
                                                  ("personal_acc_mean", "personal")) if k in m))
    metrics = {algo: mean_over_seeds(s) for algo, s in seeds.items()}
    title = (f"{cfgs[0].study.name}: {cfgs[0].dataset.name}, {part.meta['scheme']}, "
             f"{part.num_clients} clients")
    table = comparison_table(metrics, title)
    write_json(out / "metrics.json", metrics)
    write_json(out / "seeds.json", {a: {str(k): v for k, v in s.items()} for a, s in seeds.items()})
    write_csv(out / "clients.csv", ["algorithm", "seed", "client", "accuracy", "personal_accuracy"],
              rows)
    write_csv(out / "history.csv", HISTORY_COLUMNS, history)
    write_text(out / "comparison.md", table)
    absent = [a for a in seeds if not ALGORITHMS[a].has_global_model()]
    save_figure(out / "learning_curves.png", plot_curves(history, title, absent))
    save_figure(out / "client_accuracy.png", plot_client_accuracy(per_client, title))
    save_figure(out / "fairness_curves.png", plot_fairness_curves(all_histories, title))
    return EvaluateOutputs(metrics, table, [out / "learning_curves.png", out / "client_accuracy.png",
                                            out / "fairness_curves.png", out / "comparison.md"])
