"""Plots that tell the truth: the FID curves (log axis, distinct markers, legend outside, sample
counts, the final correction), history CSVs without unevaluated rounds, DVC's Vega plots with fitting
templates (checked through `dvc plots show --json` on CSVs written by the stages' own writers), the
offline page, the unlabelled per-class plot, and the data each matplotlib panel draws."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import yaml

matplotlib.use("Agg")

from fedpipe.data.stats import client_rows, plot_sizes  # noqa: E402
from fedpipe.io import write_csv  # noqa: E402
from fedpipe.pipeline.aux_quality import UNLABELLED, per_class_rows, plot_per_class  # noqa: E402
from fedpipe.pipeline.evaluate import HISTORY_COLUMNS, history_rows, plot_curves  # noqa: E402
from fedpipe.pipeline.outputs import plot_history
from fedpipe.pipeline.report import FID_HISTORY_COLUMNS, fid_history_rows, plot_fid_curves  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
META = {"curve_samples": 200, "curve_sampler": "ddim", "fid_samples": 500, "sampler": "ddpm"}


def ddpm_history(rounds: int, eval_every: int, fid0: float) -> list[dict[str, float]]:
    """A federate_ddpm history as read back from history.csv: test columns on evaluated rounds only."""
    return [{"round": r, "train_loss": 0.1, **({"test_loss": 0.05, "test_fid": fid0 - r}
                                                if r % eval_every == 0 else {})}
            for r in range(1, rounds + 1)]


def test_fid_curves_log_axis_distinct_styles_legend_outside_and_final_correction():
    curves = {"fedavg": {5: 100.0, 10: 95.0, 15: 90.0}, "mofedsam": {5: 400.0, 10: 300.0, 15: 190.0},
              "fedddpm_plus": {5: 100.0, 10: 95.0}}  # FedDDPM+ = FedAvg until its stop
    finals = {"fedavg": {"fid_mean": 88.0, "stopped_at_mean": 15, "corrected": False},
              "mofedsam": {"fid_mean": 185.0, "stopped_at_mean": 15, "corrected": False},
              "fedddpm_plus": {"fid_mean": 80.0, "stopped_at_mean": 10, "corrected": True}}
    fig = plot_fid_curves(curves, "t", META, finals)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    styles = {(lines[a].get_marker(), str(lines[a].get_linestyle()), lines[a].get_markerfacecolor())
              for a in curves}
    assert len(styles) == len(curves)  # no curve can hide another
    assert "200 samples" in ax.get_ylabel() and "ddim" in ax.get_ylabel()
    caption = " ".join(t.get_text() for t in fig.texts)
    assert "500 samples, ddpm" in caption and "200 samples, ddim" in caption
    star = [ln for ln in ax.get_lines() if ln.get_marker() == "*"]
    assert len(star) == 1 and list(star[0].get_xdata()) == [10] and list(star[0].get_ydata()) == [80.0]
    fig.canvas.draw()
    legend, frame = ax.get_legend(), ax.get_window_extent()
    assert legend.get_window_extent().x0 >= frame.x1  # outside the data
    texts = [t.get_text() for t in legend.get_texts()]
    assert any("fedddpm_plus" in t and "correction (round 10)" in t for t in texts)
    assert any("500 samples, ddpm" in t for t in texts)


def test_history_csvs_hold_evaluated_rounds_only():
    runs = {"fedavg": {0: ({}, ddpm_history(6, 3, 100.0)), 1: ({}, ddpm_history(6, 3, 90.0))}}
    rows = fid_history_rows(runs)
    assert rows == [["fedavg", 0, 3, 97.0], ["fedavg", 0, 6, 94.0], ["fedavg", 1, 3, 87.0],
                    ["fedavg", 1, 6, 84.0]]
    hist = [{"round": 1, "train_loss": 1.0}, {"round": 2, "train_loss": 0.9, "test_accuracy": 0.5,
                                              "test_loss": 1.2}]
    assert history_rows("fedprox", 2, hist) == [["fedprox", 2, 2, 0.5, 1.2]]


def test_learning_curves_png_is_the_mean_over_seeds():
    rows = [["fedavg", 0, 2, 0.4, 1.0], ["fedavg", 1, 2, 0.6, 1.0], ["fedprox", 0, 2, 0.3, 1.0],
            ["fedavg", 0, 4, 0.5, 1.0], ["fedavg", 1, 4, 0.9, 1.0], ["fedprox", 0, 4, 0.2, 1.0]]
    ax = plot_curves(rows, "t").axes[0]
    by = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines()}
    assert by == {"fedavg": ([2, 4], [pytest.approx(0.5), pytest.approx(0.7)]),
                  "fedprox": ([2, 4], [0.3, 0.2])}  # each round's mean over the seeds, nothing else
    assert ax.get_ylabel() == "global test accuracy (mean over seeds)"


def test_history_panels_plot_the_losses_and_the_metric_of_evaluated_rounds():
    hist = [{"round": 1, "train_loss": 1.0},
            {"round": 2, "train_loss": 0.8, "test_loss": 1.1, "test_accuracy": 0.5},
            {"round": 3, "train_loss": 0.7},
            {"round": 4, "train_loss": 0.6, "test_loss": 0.9, "test_accuracy": 0.7}]
    loss, metric = plot_history(hist, "t").axes
    lines = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in loss.get_lines()}
    assert lines == {"train loss (clients)": ([1, 2, 3, 4], [1.0, 0.8, 0.7, 0.6]),
                     "test loss": ([2, 4], [1.1, 0.9])}  # unevaluated rounds are not drawn as 0
    (acc,) = metric.get_lines()
    assert (list(acc.get_xdata()), list(acc.get_ydata())) == ([2, 4], [0.5, 0.7])
    assert loss.get_ylabel() == "cross-entropy loss" and metric.get_ylabel() == "global test accuracy"
    assert plot_history(hist, "t", loss_label="epsilon-MSE").axes[0].get_ylabel() == "epsilon-MSE"


def test_unlabelled_aux_set_gives_no_rows_and_a_figure_that_says_why():
    acc, counts = np.full(3, np.nan), np.zeros(3, dtype=np.int64)
    assert per_class_rows(acc, counts, ["a", "b", "c"]) == []
    fig = plot_per_class(acc, ["a", "b", "c"], "t", labelled=False)
    assert not fig.axes[0].patches and UNLABELLED in [t.get_text() for t in fig.axes[0].texts]
    rows = per_class_rows(np.array([1.0, 0.5, np.nan]), np.array([2, 2, 0]), ["a", "b", "c"])
    assert rows == [["a", 2, 1.0], ["b", 2, 0.5]]
    ax = plot_per_class(np.array([1.0, 0.5, np.nan]), ["a", "b", "c"], "t").axes[0]
    assert [b.get_height() for b in ax.patches] == [1.0, 0.5, 0.0]  # a class without samples: 0
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]


def test_sizes_png_draws_each_clients_size_and_label_skew():
    fig = plot_sizes(np.array([10, 20, 30]), "t", emd=np.array([0.5, 0.2, 1.5]))
    sizes, skew = fig.axes
    assert [b.get_height() for b in sizes.patches] == [10, 20, 30]
    assert [b.get_x() + b.get_width() / 2 for b in sizes.patches] == [0, 1, 2]  # client ids
    (mean,) = sizes.get_lines()
    assert list(mean.get_ydata()) == [20.0, 20.0] and mean.get_label() == "mean 20.0"
    assert [b.get_height() for b in skew.patches] == [0.5, 0.2, 1.5] and "EMD" in skew.get_ylabel()
    assert len(plot_sizes(np.array([10, 20]), "t").axes) == 1  # no skew panel without EMD


# ------------------------------------------------------------------ DVC's Vega plots, for real
def dvc_env() -> dict:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
            "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t"}


@pytest.fixture(scope="module")
def plots_repo(tmp_path_factory) -> Path:
    """dvc.yaml, params.yaml and .dvc/ of the project in a git repo, with the plotted CSVs written by
    the stages' own writers (a classification history evaluated every 2nd round, a diffusion history
    every 3rd, an unlabelled auxiliary set)."""
    dst = tmp_path_factory.mktemp("plots")
    for rel in ("dvc.yaml", "params.yaml", ".dvc/config", ".dvc/.gitignore"):
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dst / rel)
    shutil.copytree(REPO / ".dvc" / "plots", dst / ".dvc" / "plots")
    d = dst / "data"
    stats = {"sizes": [10, 20], "test_sizes": [5, 5], "emd": [0.5, 0.2],
             "effective_classes": [2.0, 3.0], "counts": np.array([[5, 5], [20, 0]])}
    write_csv(d / "partition/seed_0/clients.csv", *client_rows(stats))
    hist = [{"round": r, "train_loss": 1.0 / r, **({"test_accuracy": 0.1 * r, "test_loss": 1.0}
                                                   if r % 2 == 0 else {})} for r in range(1, 7)]
    write_csv(d / "evaluate/history.csv", HISTORY_COLUMNS,
              history_rows("fedavg", 0, hist) + history_rows("fedprox", 0, hist))
    write_csv(d / "evaluate/clients.csv", ["algorithm", "seed", "client", "accuracy",
                                           "personal_accuracy"],
              [["fedavg", 0, 0, 0.5, ""], ["fedavg", 0, 1, 0.7, ""], ["fedper", 0, 0, 0.4, 0.9]])
    write_csv(d / "warmup/seed_0/losses.csv", ["client", "epoch", "loss"],
              [[0, 0, 0.5], [0, 1, 0.4], [1, 0, 0.6], [1, 1, 0.3]])
    write_csv(d / "aux_quality/seed_0/per_class.csv", ["class", "requested", "accuracy"],
              per_class_rows(np.full(2, np.nan), np.zeros(2, dtype=np.int64), ["a", "b"]))
    runs = {"fedavg": {0: ({}, ddpm_history(6, 3, 100.0))},
            "mofedsam": {0: ({}, ddpm_history(6, 3, 400.0))}}
    write_csv(d / "report/fid_history.csv", FID_HISTORY_COLUMNS, fid_history_rows(runs))
    env = dvc_env()
    subprocess.run(["git", "init", "-q"], cwd=dst, env=env, check=True)
    return dst


def vega_plots(repo: Path) -> dict[str, dict]:
    proc = subprocess.run(["dvc", "plots", "show", "--json"], cwd=repo, env=dvc_env(),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    data, _ = json.JSONDecoder().raw_decode(proc.stdout)
    return {name: entries[0]["content"] for name, entries in data["data"].items()
            if entries and entries[0]["type"] == "vega"}


def test_vega_plots_fit_their_data(plots_repo):
    plots = vega_plots(plots_repo)
    # no plot draws an index ("step") on its x axis, e.g. partition classes against step
    assert all(p["encoding"]["x"]["field"] != "step" for p in plots.values() if "encoding" in p)
    fid = plots["FID per round"]
    assert {(r["algorithm"], r["round"]) for r in fid["data"]["values"]} == {
        (a, str(r)) for a in ("fedavg", "mofedsam") for r in (3, 6)}  # no unevaluated round
    assert all(r["fid"] not in ("", "0") for r in fid["data"]["values"])
    assert fid["encoding"]["y"]["scale"]["type"] == "log"
    assert fid["encoding"]["color"]["field"] == "algorithm"  # one line per algorithm
    acc = plots["test accuracy per round"]
    assert {r["round"] for r in acc["data"]["values"]} == {"2", "4", "6"}
    assert acc["encoding"]["color"]["field"] == "algorithm"
    bars = plots["client accuracy"]
    assert bars["mark"]["type"] == "bar" and bars["encoding"]["x"]["field"] == "client"
    assert bars["encoding"]["xOffset"]["field"] == "algorithm"  # grouped by algorithm
    # own models: the template drops the empty cells of methods without personal models
    own = plots["client accuracy, own models"]
    assert own["encoding"]["y"]["field"] == "personal_accuracy"
    assert "datum['personal_accuracy'] !== ''" in own["transform"][0]["filter"]
    assert plots["warm-up loss"]["encoding"]["color"]["field"] == "client"
    # the unlabelled set's per-class accuracy: no data, so no flat line of zeros
    assert not plots.get("aux per-class accuracy", {}).get("data", {}).get("values")


def test_every_vega_plot_names_its_png_and_the_page_works_offline(plots_repo, tmp_path):
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())["plots"]
    images = {p for p in spec if isinstance(p, str) and p.endswith(".png")}
    for entry in (p for p in spec if isinstance(p, dict)):
        (name, props), = entry.items()
        png = props["title"].rsplit(" - ", 1)[-1].rstrip(")")
        assert png in images, f"Vega plot {name!r} names no PNG plot of dvc.yaml ({png})"
    proc = subprocess.run(["dvc", "plots", "show", "-o", str(tmp_path / "out")], cwd=plots_repo,
                          env=dvc_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "out" / "index.html").read_text()
    # the project's page (.dvc/config plots.html_template): without the CDN, each Vega plot becomes
    # its title (naming its PNG) and its data table
    assert 'typeof window.vegaEmbed === "undefined"' in page
    assert page.index("typeof window.vegaEmbed") > page.index("cdn.jsdelivr.net")
    assert page.count("vegaEmbed('#") >= 6


# ------------------------------------------------------- plots at any number of evaluations
def visible_ticks(ax) -> list[float]:
    lo, hi = ax.get_xlim()
    return [t for t in ax.get_xticks() if lo <= t <= hi]


def test_learning_curves_of_a_study_evaluated_once_are_bars_with_the_round_named():
    rows = [["fedavg", 0, 15, 0.4, 1.0], ["fedavg", 1, 15, 0.6, 1.0], ["fedprox", 0, 15, 0.3, 1.0]]
    fig = plot_curves(rows, "t", absent=["local"])
    ax = fig.axes[0]
    assert [p.get_height() for p in ax.patches] == [pytest.approx(0.5), pytest.approx(0.3)]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fedavg", "fedprox"]
    assert ax.get_xlabel() == "round 15 (one evaluation)"
    dots = [list(c.get_offsets()[:, 1]) for c in ax.collections if len(c.get_offsets())]
    assert [0.4, 0.6] in dots and [0.3] in dots  # every seed drawn
    assert "no global model, not drawn: local" in [t.get_text() for t in fig.texts]


def test_learning_curves_span_the_evaluated_rounds_with_integer_ticks():
    rows = [["fedavg", 0, r, 0.1 * r, 1.0] for r in (5, 10, 15)]
    ax = plot_curves(rows, "t").axes[0]
    assert ax.get_xlim() == (4.5, 15.5) and not ax.patches
    ticks = visible_ticks(ax)
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert list(ax.get_lines()[0].get_xdata()) == [5, 10, 15]


def test_fairness_panels_of_a_study_evaluated_once_are_not_empty():
    from fedpipe.pipeline.evaluate import plot_fairness_curves

    hist = {"fedavg": [[{"round": 15, "test_sigma_acc_global": 0.2}],
                       [{"round": 15, "test_sigma_acc_global": 0.4}]],
            "fedprox": [[{"round": 15, "test_sigma_acc_global": 0.1}]]}
    sigma, nmi = plot_fairness_curves(hist, "t").axes
    assert [p.get_height() for p in sigma.patches] == [pytest.approx(0.3), pytest.approx(0.1)]
    assert sigma.get_xlabel() == "round 15 (one evaluation)"
    assert [t.get_text() for t in nmi.texts] == ["no method of this study clusters its clients"]
    # several evaluations: lines with markers (a single point without one would not show)
    hist = {"eq": [[{"round": r, "test_sigma_acc_global": 0.1 * r, "cluster_nmi": 0.5 + s / 4}
                    for r in (1, 2)] for s in (0, 1)]}
    sigma, nmi = plot_fairness_curves(hist, "t").axes
    assert [ln.get_marker() for ln in sigma.get_lines()] == ["o"]
    ((x, y),) = [(list(ln.get_xdata()), list(ln.get_ydata())) for ln in sigma.get_lines()]
    assert x == [1, 2] and y == [pytest.approx(0.1), pytest.approx(0.2)]
    ((x, y),) = [(list(ln.get_xdata()), list(ln.get_ydata())) for ln in nmi.get_lines()]
    assert x == [1, 2] and y == [pytest.approx(0.625)] * 2  # the mean over the two seeds
    assert sigma.get_xlim() == (0.5, 2.5)


def test_run_curves_of_one_evaluation_sit_on_the_runs_round_axis():
    hist = [{"round": r, "train_loss": 1.0 / r} for r in range(1, 15)]
    hist.append({"round": 15, "train_loss": 0.05, "test_loss": 0.9, "test_accuracy": 0.7})
    fig = plot_history(hist, "t")
    for ax in fig.axes:
        assert ax.get_xlim() == (0.5, 15.5)
        assert all(float(t).is_integer() for t in visible_ticks(ax))
    assert list(fig.axes[1].get_lines()[0].get_xdata()) == [15]
    # no global model (Local): the clients' own models on the right, no test loss on the left
    hist = [{"round": 1, "train_loss": 1.0, "test_personal_mean": 0.6}]
    fig = plot_history(hist, "t", "test_personal_mean", "own models")
    assert [ln.get_label() for ln in fig.axes[0].get_lines()] == ["train loss (clients)"]
    assert list(fig.axes[1].get_lines()[0].get_ydata()) == [0.6]


@pytest.mark.parametrize("clients", [2, 12, 50])
def test_sizes_png_has_integer_client_ticks(clients):
    sizes = np.arange(1, clients + 1) * 10
    fig = plot_sizes(sizes, "t", emd=np.linspace(0, 1, clients))
    for ax in fig.axes:
        ticks = visible_ticks(ax)
        assert all(float(t).is_integer() for t in ticks) and ticks[0] >= 0
        assert ticks[-1] <= clients - 1
        if clients <= 30:
            assert ticks == list(range(clients))
    assert [p.get_height() for p in fig.axes[0].patches] == list(sizes)
