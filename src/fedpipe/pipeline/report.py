"""The report stage: one markdown report per study, the claims table, the plots, and (via the stage)
MLflow.

Inputs (exactly these):

- Diffusion track: ``data/federate_ddpm/<algorithm>/seed_<seed>/{metrics.json,history.csv}`` for each
  algorithm of ``study.diffusion_algorithms`` and seed of ``study.seeds`` (the federate_ddpm stage's
  per-run folder; the layout is written down here rather than imported, so that the report does not
  depend on the training code).
- Classification track: ``data/evaluate/seeds.json`` = {algorithm: {"<seed>": {metric: value}}} and
  ``data/evaluate/metrics.json`` = {algorithm: {metric: mean over seeds, "<metric>_std": sample std,
  "seeds": n}}.

Sections of ``report.md``:

- Diffusion track: per algorithm, FID of the final global model as mean +- std over ``study.seeds``
  (with the extractor, sample count and sampler it was computed with), the round training stopped at
  (FedDDPM+'s QuickTest), server optimizer steps and training time; with ``study.paper_reference``,
  the paper's FID for the same algorithm beside ours (and FedDDPM+'s stop round).
- Classification track: the accuracy metrics of the ``evaluate`` stage, mean +- std over seeds, and the
  personalized columns when an algorithm has them; then each of the study's papers' own tables beside
  ours, from its claims module (``fedpipe.claims.report_sections``: this stage names no paper).
- Claims: the headline claims of the study's papers (``study.papers``, :mod:`fedpipe.claims`): the
  paper's numbers, ours (each arm's mean with a 95% t-interval over replicates and every replicate's
  value, the difference likewise), the p-value with its Holm adjustment, and the verdict (held /
  contradicted / not shown / not judged / not evaluated); one summary line per paper; the facts
  (deterministic properties) in a table of their own. The same markdown alone in ``claims.md``, which
  the stage logs to the study's parent MLflow run.
- Plots: every plot of the study's stages, embedded by its path relative to ``report.md``
  (:func:`study_plots`).

Outputs: ``report.md``, ``claims.md``, ``fid_curves.png`` (FID per round, mean over seeds, and each
method's final FID), ``fid_history.csv`` (every run's evaluated rounds, for DVC's plots),
``metrics.json`` (DVC metrics: FID and accuracy summaries, claim counts) and ``claims.json`` (DVC metrics; see
:func:`fedpipe.claims.claims_metrics`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedpipe.claims import (
    FAMILIES,
    FAMILY_LABELS,
    RESOLUTION_RULE,
    RULE,
    ClaimResult,
    all_claims,
    claims_metrics,
    judge_all,
    mean_pm_std,
    metric_cell,
    min_detectable_lines,
    paper_summaries,
    report_sections,
    resolution_text,
    study_papers,
    summary,
)
from fedpipe.config.dataset import STAND_IN_NOTE
from fedpipe.config.fl import StudyConfig
from fedpipe.errors import InputError
from fedpipe.io import read_json_input, read_table, save_figure, write_csv, write_json, write_text
from fedpipe.pipeline.skip import write_placeholder
from fedpipe.reference import CITATION, describe, paper_fid, paper_stop_round

REPORT_DIR = Path("data/report")
FEDERATE_DDPM_DIR = Path("data/federate_ddpm")
EVALUATE_DIR = Path("data/evaluate")

# (metric key, column title) of the classification table; personalized columns only when present
GLOBAL_COLUMNS = [("test_accuracy", "global acc"), ("test_accuracy_last5", "global acc, last 5 rounds"),
                  ("client_acc_mean", "client mean"),
                  ("client_acc_std", "client std"), ("client_acc_worst10", "worst 10%"),
                  ("client_acc_best10", "best 10%")]
PERSONAL_COLUMNS = [("personal_acc_mean", "personal mean"), ("personal_acc_std", "personal std"),
                    ("personal_acc_worst10", "personal worst 10%"),
                    ("personal_acc_best10", "personal best 10%")]


@dataclass(frozen=True)
class ReportOutputs:
    text: str
    summary: dict[str, dict[str, float]]
    claims: list[ClaimResult]
    plots: list[Path]  # every file written, for MLflow


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def ddpm_run_dir(root: str | Path, algorithm: str, seed: int) -> Path:
    """The federate_ddpm stage's folder of one run (its ``run_dir``)."""
    return Path(root) / algorithm / f"seed_{seed}"


def read_diffusion_runs(study: StudyConfig, root: str | Path
                        ) -> dict[str, dict[int, tuple[dict[str, Any], list[dict[str, float]]]]]:
    """{algorithm: {seed: (metrics.json, history rows)}} for the study's diffusion algorithms and seeds."""
    runs: dict[str, dict[int, tuple[dict, list]]] = {}
    for algo in study.diffusion_algorithms:
        runs[algo] = {}
        for seed in study.seeds:
            d, stage = ddpm_run_dir(root, algo, seed), f"federate_ddpm@{algo}-{seed}"
            metrics = read_json_input(d / "metrics.json", stage)
            if not isinstance(metrics, dict) or "fid" not in metrics:
                raise InputError(d / "metrics.json", "not a federate_ddpm metrics file (corrupt?)",
                                 stage)
            runs[algo][seed] = (metrics, read_table(d / "history.csv", stage))
    return runs


def diffusion_summary(runs: dict[str, dict[int, tuple[dict, list]]]) -> tuple[dict, dict, dict]:
    """(summary per algorithm, FID curves per algorithm {round: mean FID}, run metadata)."""
    summary_, curves, meta = {}, {}, {}
    for algo, by_seed in runs.items():
        ms = [m for m, _ in by_seed.values()]
        fid = mean_std([m["fid"] for m in ms])
        summary_[algo] = {"fid_mean": fid[0], "fid_std": fid[1], "seeds": len(ms),
                          "stopped_at_mean": float(np.mean([m["stopped_at"] for m in ms])),
                          "server_steps_mean": float(np.mean([m["server_steps"] for m in ms]))}
        points: dict[float, list[float]] = {}
        for _, hist in by_seed.values():
            for h in hist:
                if "test_fid" in h:
                    points.setdefault(h["round"], []).append(h["test_fid"])
        curves[algo] = {r: float(np.mean(v)) for r, v in sorted(points.items())}
        meta = {k: ms[0].get(k) for k in ("extractor", "fid_samples", "sampler", "curve_sampler",
                                           "curve_samples")}
    return summary_, curves, meta


def diffusion_table(study: StudyConfig, summary_: dict, meta: dict) -> list[str]:
    ref = paper_fid(study.paper_reference) if study.paper_reference else None
    head = "| algorithm | FID | stop round | server steps |"
    if ref:
        head += f" paper FID ({describe(study.paper_reference)}) |"
    lines = [f"## Diffusion track: FID of the final global model (lower is better; "
             f"{meta.get('extractor')}, {meta.get('fid_samples')} samples, {meta.get('sampler')} "
             f"sampler; mean ± std over seeds {study.seeds})", "", head,
             "|---|" + "---|" * (head.count("|") - 2)]
    best = min(s["fid_mean"] for s in summary_.values())
    for algo, s in summary_.items():
        cell = mean_pm_std(s["fid_mean"], s["fid_std"], s["seeds"], 3)
        if s["fid_mean"] == best:
            cell = f"**{cell}**"
        row = f"| {algo} | {cell} | {s['stopped_at_mean']:.0f} | {s['server_steps_mean']:.0f} |"
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


def read_classification(evaluate_dir: str | Path) -> tuple[dict, dict]:
    """(metrics.json: mean and std over seeds per algorithm, seeds.json: per seed)."""
    d = Path(evaluate_dir)
    docs = [read_json_input(d / name, "evaluate") for name in ("metrics.json", "seeds.json")]
    for name, doc in zip(("metrics.json", "seeds.json"), docs, strict=True):
        if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
            raise InputError(d / name, "not the evaluate stage's {algorithm: {...}} (corrupt?)",
                             "evaluate")
    return docs[0], docs[1]


def classification_table(metrics: dict[str, dict[str, float]]) -> list[str]:
    cols = GLOBAL_COLUMNS + [c for c in PERSONAL_COLUMNS if any(c[0] in m for m in metrics.values())]
    seeds = sorted({int(m.get("seeds", 1)) for m in metrics.values()})
    over = f"mean ± std over {'/'.join(map(str, seeds))} seeds" if seeds != [1] else "one seed"
    lines = [f"## Classification track: accuracy (%) of the final global model ({over}; personal "
             "columns: each client's own model)", "",
             "| algorithm | " + " | ".join(c[1] for c in cols) + " |", "|---|" + "---|" * len(cols)]
    for algo, m in metrics.items():
        lines.append(f"| {algo} | " + " | ".join(metric_cell(m, k) for k, _ in cols) + " |")
    return lines


def fmt_value(v: float | None) -> str:
    if v is None or not np.isfinite(v):
        return str(v)
    if float(v).is_integer() or abs(v) >= 1000:
        return f"{v:.0f}"
    return f"{v:.4g}"


def _per_seed(values: dict[str, float]) -> str:
    return ", ".join(f"s{s} {fmt_value(v)}" for s, v in values.items()) or "—"


def mean_ci(values: list[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95% t-interval (None for fewer than 2 values)."""
    from scipy import stats

    a = np.asarray(values, dtype=np.float64)
    if len(a) < 2:
        return float(a.mean()), None
    return float(a.mean()), float(stats.t.ppf(0.975, len(a) - 1) * a.std(ddof=1) / np.sqrt(len(a)))


def _ours(values: dict[str, float]) -> str:
    """Mean [95% t-interval] (every replicate's value)."""
    good = [v for v in values.values() if np.isfinite(v)]
    if not good:
        return "—"
    mean, half = mean_ci(good)
    ci = "" if half is None else f" [{fmt_value(mean - half)}, {fmt_value(mean + half)}]"
    return f"{fmt_value(mean)}{ci} ({_per_seed(values)})"


def _difference(r: ClaimResult) -> str:
    if r.mean_diff is None:
        return "—"
    out = f"{r.mean_diff:+.4g}"
    ci = r.ci
    if ci is not None:
        out += f" [{ci[0]:+.4g}, {ci[1]:+.4g}]"
    if r.se is not None:
        out += f", SE {r.se:.3g} ({r.test}, n={r.n})"
    if r.threshold is not None:
        sign = "−" if r.claim.direction == "at_least" else "±"
        out += f"; margin {sign}{r.threshold:.4g}"
    if r.paper_effect is not None:
        out += f"; paper's effect {r.paper_effect:+.4g}"
    return out


def _p(r: ClaimResult) -> str:
    if r.p is None:
        return "—"
    return f"{r.p:.3g} (Holm {r.p_holm:.3g}); opposite {r.p_opposite:.3g} (Holm {r.p_opposite_holm:.3g})"


def _verdict(r: ClaimResult) -> str:
    if r.status in ("held", "contradicted"):
        return f"**{r.status}**"
    if r.status in ("not judged", "not evaluated", "not shown") and r.p is None and r.reason:
        return f"{r.status} ({r.reason})"
    return f"{r.status}: {resolution_text(r.resolution, r.upper_bound, r.paper_effect, r.n_for_power)}" \
        if r.resolution else r.status


def claims_table(results: list[ClaimResult], papers: list[str] | None = None) -> list[str]:
    """The claims section: the rule, what can hold at these replicate counts, one summary line per
    paper, the claims table and the facts table."""
    claims = [r for r in results if not r.claim.fact]
    facts = [r for r in results if r.claim.fact]
    counts = summary(results)
    lines = ["## Claims: the headline claims of this study's papers", "",
             f"Papers: {', '.join(papers) if papers else '—'} (study.papers). {RULE}", ""]
    lines += [f"- {line}" for line in min_detectable_lines(claims)]
    lines += ["", f"{counts['held']} of {counts['claims']} claims held, {counts['contradicted']} "
              f"contradicted, {counts['not_shown']} not shown, {counts['not_judged']} not judged, "
              f"{counts['not_evaluated']} not evaluated.", ""]
    lines += [f"- **{paper}**: {line}" for paper, line in paper_summaries(results).items()]
    lines += ["", "Ours: mean [95% t-interval over replicates] (each replicate's value, s<seed>). "
              "Difference: in the claimed direction (positive = the claimed way), with its 95% "
              "t-interval, and the paper's effect in our units. p: one-sided (match claims: TOST), "
              f"Holm-adjusted within its family. {RESOLUTION_RULE}", ""]
    for fam in FAMILIES:
        rows = [r for r in claims if r.claim.family == fam]
        if not rows:
            continue
        lines += [f"**{FAMILY_LABELS[fam][0].upper() + FAMILY_LABELS[fam][1:]}** (Holm-corrected "
                  "apart from the other family):", "",
                  "| paper | claim | the paper says | paper's numbers | method, ours | baseline, ours | "
                  "difference | p | verdict |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            c = r.claim
            lines.append(f"| {c.paper} | {c.text} | {c.quote} | {c.source} | {c.method}: "
                         f"{_ours(r.method_values)} | {c.baseline}: {_ours(r.baseline_values)} | "
                         f"{_difference(r)} | {_p(r)} | {_verdict(r)} |")
        lines.append("")
    if facts:
        lines += ["", "Facts (deterministic properties: the same on every replicate; reported, never "
                  "counted as held claims; true = the relation holds on every replicate):", "",
                  "| paper | fact | paper's numbers | method | baseline | true |",
                  "|---|---|---|---|---|---|"]
        for r in facts:
            c = r.claim
            lines.append(f"| {c.paper} | {c.text} | {c.source} | {c.method}: "
                         f"{_per_seed(r.method_values)} | {c.baseline}: "
                         f"{_per_seed(r.baseline_values)} | {r.status} ({r.reason}) |")
    return lines


# distinct marker and line style per algorithm, so that coinciding curves (FedDDPM+ is FedAvg until
# its QuickTest stops it) stay visible one over the other
MARKERS = ["o", "s", "^", "v", "P", "X", "<", ">", "h", "p"]
FINAL = {"marker": "D", "markersize": 8, "markerfacecolor": "none", "markeredgewidth": 1.8}
CORRECTED = {"marker": "*", "markersize": 15, "markeredgecolor": "black"}
LINESTYLES = ["-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1))]


def curve_label(meta: dict) -> str:
    """How the FID-per-round curve is computed, e.g. ``"200 samples, ddim"``."""
    return ", ".join(str(v) for v in (f"{meta['curve_samples']} samples" if meta.get("curve_samples")
                                      else None, meta.get("curve_sampler")) if v) or "curve samples"


def final_label(meta: dict) -> str:
    """How the table's final FID is computed, e.g. ``"500 samples, ddpm"``."""
    return ", ".join(str(v) for v in (f"{meta['fid_samples']} samples" if meta.get("fid_samples")
                                      else None, meta.get("sampler")) if v) or "final samples"


def plot_fid_curves(curves: dict[str, dict[float, float]], title: str, meta: dict | None = None,
                    finals: dict[str, dict[str, float]] | None = None):
    """FID per round (mean over seeds), one line per algorithm with its own marker and line style,
    on a log axis (one far-off method does not squash the others); the legend outside the axes.
    ``finals`` ({algorithm: {"fid_mean", "stopped_at_mean", "corrected"}}): the table's final FID at
    the round training stopped, a star where the run ended with a server correction (FedDDPM+),
    otherwise a hollow diamond. The y-label names the curve's sample count and sampler, the caption
    the final FID's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FormatStrFormatter, LogLocator, MaxNLocator, NullFormatter

    meta, finals = meta or {}, finals or {}
    fig, ax = plt.subplots(figsize=(8.5, 4.0))
    corrections = []
    for i, (algo, pts) in enumerate(curves.items()):
        line, = ax.plot(list(pts), list(pts.values()), marker=MARKERS[i % len(MARKERS)],
                        linestyle=LINESTYLES[i % len(LINESTYLES)],
                        markersize=max(3.5, 7.5 - 0.8 * i),  # a later line's markers sit inside
                        markerfacecolor="none" if i % 2 else None, label=algo)
        f = finals.get(algo)
        if f is None:
            continue
        if f.get("corrected"):
            corrections.append((algo, f["stopped_at_mean"]))
        ax.plot([f["stopped_at_mean"]], [f["fid_mean"]], linestyle="none", zorder=5,
                color=line.get_color(), **(CORRECTED if f.get("corrected") else FINAL))
    handles, _ = ax.get_legend_handles_labels()
    if finals:
        handles.append(Line2D([], [], linestyle="none", color="grey", **FINAL,
                              label=f"final FID of the table\n({final_label(meta)})"))
    for algo, at in corrections:
        handles.append(Line2D([], [], linestyle="none", color="grey", **CORRECTED,
                              label=f"{algo}: final FID after\nits correction (round {at:g})"))
    values = [v for pts in curves.values() for v in pts.values()] + [
        f["fid_mean"] for f in finals.values()]
    if values and min(values) > 0:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 7,
                                                             8, 9)))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="major", alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel(f"FID, log scale ({curve_label(meta)})")
    ax.set_title(title)
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              borderaxespad=0.0)
    fig.text(0.01, 0.01, f"Lines: FID per round on {curve_label(meta)} (mean over seeds). Markers "
             f"alone: the table's final FID, on {final_label(meta)}, at the round training stopped.",
             fontsize=7, ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


FID_HISTORY_COLUMNS = ["algorithm", "seed", "round", "fid"]


def fid_history_rows(runs: dict[str, dict[int, tuple[dict, list]]]) -> list[list]:
    """One row per evaluated round of every run (algorithm, seed, round, FID of the curve): rounds
    without an evaluation are absent, so no plot draws them as FID 0."""
    return [[algo, seed, int(h["round"]), h["test_fid"]]
            for algo, by_seed in runs.items() for seed, (_, hist) in sorted(by_seed.items())
            for h in hist if "test_fid" in h]


def study_plots(study: StudyConfig, data_dir: Path) -> list[tuple[str, Path]]:
    """(caption, path) of every plot the study's stages write (replicate ``study.seeds[0]`` where a
    stage runs per replicate), decided by the study alone: the evaluate stage's three, the
    partition's two, and on the diffusion track the FID curves, the warm-up losses and the
    auxiliary set's per-class accuracy when the study runs it (the plan writes placeholders
    otherwise, not linked)."""
    r = study.seeds[0]
    plots = [("global test accuracy per round", data_dir / "evaluate" / "learning_curves.png"),
             ("each client's local test accuracy", data_dir / "evaluate" / "client_accuracy.png"),
             ("σ_acc and clustering NMI per round", data_dir / "evaluate" / "fairness_curves.png"),
             (f"partition: samples per client and class, replicate {r}",
              data_dir / "partition" / f"seed_{r}" / "heatmap.png"),
             (f"partition: client sizes and label skew, replicate {r}",
              data_dir / "partition" / f"seed_{r}" / "sizes.png")]
    if study.diffusion_algorithms:
        plots.append(("FID per round", data_dir / "report" / "fid_curves.png"))
    if study.diffusion_seeds != [] and (study.diffusion_algorithms
                                        or study.server_data_from == "generate"):
        plots += [(f"warm-up loss per client, replicate {r}",
                   data_dir / "warmup" / f"seed_{r}" / "losses.png"),
                  (f"auxiliary set: classifier accuracy per class, replicate {r}",
                   data_dir / "aux_quality" / f"seed_{r}" / "per_class.png")]
    return plots


def plots_section(study: StudyConfig, out: Path, data_dir: Path) -> list[str]:
    """The report's plots, embedded by their paths relative to ``report.md`` (``out``): each is an
    output of the stage that draws it, in the same workspace (``dvc repro`` writes them all)."""
    lines = ["## Plots", ""]
    for caption, path in study_plots(study, data_dir):
        rel = Path(os.path.relpath(path, out)).as_posix()
        lines += [f"**{caption}** (`{rel}`)", "", f"![{caption}]({rel})", ""]
    return lines


def build_report(study: StudyConfig, title: str, ddpm_root: str | Path = FEDERATE_DDPM_DIR,
                 evaluate_dir: str | Path = EVALUATE_DIR,
                 out_dir: str | Path = REPORT_DIR,
                 algorithms: dict[str, Any] | None = None, stand_in: bool = False) -> ReportOutputs:
    """The report of ``study``; ``algorithms`` (the params section) tells PerAda's Table 1 section
    which FedSim / FedAlt variant ran. ``stand_in``: the study ran on stand-in data
    (``dataset.stand_in``), which the report, the claims table and claims.json say first."""
    out = Path(out_dir)
    note = [f"> **{STAND_IN_NOTE}** (dataset.stand_in: true)", ""] if stand_in else []
    lines = [f"# Study {study.name}: {title}", "", *note]
    summary_: dict[str, dict[str, float]] = {}
    written: list[Path] = []
    tracks: dict[str, dict] = {"diffusion": {}, "classification": {}}
    if study.diffusion_algorithms:
        runs = read_diffusion_runs(study, ddpm_root)
        tracks["diffusion"] = {a: {s: m for s, (m, _) in by_seed.items()} for a, by_seed in runs.items()}
        summary_, curves, meta = diffusion_summary(runs)
        lines += diffusion_table(study, summary_, meta) + [""]
        finals = {a: {**s, "corrected": any(m.get("corrected_at") is not None
                                            for m, _ in runs[a].values())}
                  for a, s in summary_.items()}
        save_figure(out / "fid_curves.png",
                    plot_fid_curves(curves, f"{study.name}: FID per round", meta, finals))
        write_csv(out / "fid_history.csv", FID_HISTORY_COLUMNS, fid_history_rows(runs))
        written += [out / "fid_curves.png", out / "fid_history.csv"]
    else:  # DVC outputs of the stage: say why they are empty
        write_placeholder(out / "fid_curves.png", "no diffusion-track method in this study")
        write_csv(out / "fid_history.csv", FID_HISTORY_COLUMNS, [])
    cls, cls_seeds = read_classification(evaluate_dir)
    tracks["classification"] = cls_seeds
    lines += classification_table(cls) + [""]
    lines += report_sections(study, cls, algorithms)  # each paper's tables beside ours
    results = judge_all(all_claims(study), tracks)
    table = claims_table(results, study_papers(study)) + [""]
    lines += table
    lines += plots_section(study, out, Path(evaluate_dir).parent)
    text = "\n".join(lines)
    write_text(out / "report.md", text)
    write_text(out / "claims.md", f"# Study {study.name}: claims\n\n" + "\n".join(note + table))
    write_json(out / "claims.json", {**claims_metrics(results),
                                     **({"stand_in": STAND_IN_NOTE} if stand_in else {})})
    write_json(out / "metrics.json", {
        "diffusion": summary_,
        "classification": {a: {k: m[k] for k in ("test_accuracy", "test_accuracy_std") if k in m}
                           for a, m in cls.items()},
        "claims": summary(results), **({"stand_in": True} if stand_in else {})})
    written += [out / "report.md", out / "claims.md", out / "claims.json", out / "metrics.json"]
    return ReportOutputs(text, summary_, results, written)
