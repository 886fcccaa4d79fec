"""The report stage: one markdown report per study, the plots, and (via the stage) MLflow.

- Diffusion track: per algorithm, FID of the final global model as mean +- std over ``study.seeds``
  (with the extractor, sample count and sampler it was computed with), the round training stopped at
  (FedDDPM+'s QuickTest), server optimizer steps and training time; with ``study.paper_reference``,
  the paper's FID for the same algorithm beside ours (and FedDDPM+'s stop round).
- Classification track: the accuracy metrics of the ``evaluate`` stage.
- Plots: the FID-per-round curves of every diffusion algorithm (mean over seeds).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedpipe.config.fl import StudyConfig
from fedpipe.io import read_json, save_figure, write_json, write_text
from fedpipe.pipeline.evaluate import read_history
from fedpipe.pipeline.federate_ddpm import FEDERATE_DDPM_DIR, run_dir
from fedpipe.reference import CITATION, describe, paper_fid, paper_stop_round

REPORT_DIR = Path("data/report")
EVALUATE_METRICS = Path("data/evaluate/metrics.json")


@dataclass(frozen=True)
class ReportOutputs:
    text: str
    summary: dict[str, dict[str, float]]
    plots: list[Path]


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def fmt(mean: float, std: float, n: int, digits: int = 3) -> str:
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if n > 1 else f"{mean:.{digits}f}"


def diffusion_summary(study: StudyConfig, root: Path) -> tuple[dict, dict, dict]:
    """(summary per algorithm, FID curves per algorithm {round: mean FID}, run metadata)."""
    summary, curves, meta = {}, {}, {}
    for algo in study.diffusion_algorithms:
        runs = []
        for seed in study.seeds:
            d = run_dir(root, algo, seed)
            if not (d / "metrics.json").is_file():
                raise FileNotFoundError(f"missing {d / 'metrics.json'} (run `dvc repro "
                                        f"federate_ddpm@{algo}-{seed}`)")
            runs.append((read_json(d / "metrics.json"), read_history(d / "history.csv")))
        fid = mean_std([m["fid"] for m, _ in runs])
        summary[algo] = {"fid_mean": fid[0], "fid_std": fid[1], "seeds": len(runs),
                         "stopped_at_mean": float(np.mean([m["stopped_at"] for m, _ in runs])),
                         "server_steps_mean": float(np.mean([m["server_steps"] for m, _ in runs])),
                         "train_seconds_mean": float(np.mean([m["train_seconds_now"] for m, _ in runs]))}
        points: dict[float, list[float]] = {}
        for _, hist in runs:
            for h in hist:
                if "test_fid" in h:
                    points.setdefault(h["round"], []).append(h["test_fid"])
        curves[algo] = {r: float(np.mean(v)) for r, v in sorted(points.items())}
        meta = {k: runs[0][0][k] for k in ("extractor", "fid_samples", "sampler")}
    return summary, curves, meta


def diffusion_table(study: StudyConfig, summary: dict, meta: dict) -> list[str]:
    ref = paper_fid(study.paper_reference) if study.paper_reference else None
    head = "| algorithm | FID | stop round | server steps | train s |"
    if ref:
        head += f" paper FID ({describe(study.paper_reference)}) |"
    lines = [f"## Diffusion track: FID of the final global model (lower is better; "
             f"{meta.get('extractor')}, {meta.get('fid_samples')} samples, {meta.get('sampler')} "
             f"sampler; mean ± std over seeds {study.seeds})", "", head,
             "|---|" + "---|" * (head.count("|") - 2)]
    best = min(s["fid_mean"] for s in summary.values())
    for algo, s in summary.items():
        cell = fmt(s["fid_mean"], s["fid_std"], s["seeds"])
        if s["fid_mean"] == best:
            cell = f"**{cell}**"
        row = (f"| {algo} | {cell} | {s['stopped_at_mean']:.0f} | {s['server_steps_mean']:.0f} | "
               f"{s['train_seconds_mean']:.1f} |")
        if ref:
            paper = f"{ref[algo]:.3f}" if algo in ref else ""
            if algo == "fedddpm_plus" and paper:
                paper += f" (stop {paper_stop_round(study.paper_reference)})"
            row += f" {paper} |"
        lines.append(row)
    if ref:
        lines += ["", f"Paper numbers: {CITATION}, {describe(study.paper_reference)} (single runs, "
                  "Inception FID on 50k samples presumably; ours use the extractor and sample count "
                  "above, so compare orderings, not values)."]
    return lines


def classification_table(metrics: dict[str, dict[str, float]]) -> list[str]:
    cols = [("test_accuracy", "global acc"), ("client_acc_mean", "client mean"),
            ("client_acc_worst10", "worst 10%")]
    lines = ["## Classification track: accuracy (%) of the final global model", "",
             "| algorithm | " + " | ".join(c[1] for c in cols) + " |", "|---|" + "---|" * len(cols)]
    for algo, m in metrics.items():
        lines.append(f"| {algo} | " + " | ".join(f"{100 * m[k]:.2f}" for k, _ in cols) + " |")
    return lines


def plot_fid_curves(curves: dict[str, dict[float, float]], title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for algo, pts in curves.items():
        ax.plot(list(pts), list(pts.values()), marker=".", label=algo)
    ax.set_xlabel("round")
    ax.set_ylabel("FID (curve samples)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return fig


def build_report(study: StudyConfig, title: str, ddpm_root: str | Path = FEDERATE_DDPM_DIR,
                 evaluate_metrics: str | Path = EVALUATE_METRICS,
                 out_dir: str | Path = REPORT_DIR) -> ReportOutputs:
    out = Path(out_dir)
    lines = [f"# Study {study.name}: {title}", ""]
    summary: dict[str, dict[str, float]] = {}
    plots: list[Path] = []
    if study.diffusion_algorithms:
        summary, curves, meta = diffusion_summary(study, Path(ddpm_root))
        lines += diffusion_table(study, summary, meta) + [""]
        save_figure(out / "fid_curves.png", plot_fid_curves(curves, f"{study.name}: FID per round"))
        plots.append(out / "fid_curves.png")
    cls = read_json(evaluate_metrics)
    lines += classification_table(cls) + [""]
    text = "\n".join(lines)
    write_text(out / "report.md", text)
    write_json(out / "metrics.json", {"diffusion": summary,
                                      "classification": {a: {"test_accuracy": m["test_accuracy"]}
                                                         for a, m in cls.items()}})
    return ReportOutputs(text, summary, plots + [out / "report.md"])
