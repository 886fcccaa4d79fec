"""Equitable-FL's evaluation columns (§5.2): σ_acc of the final global model over the clients' local
test splits, in the paper's reading σ_acc(g) = √(mean_i (Acc_i − Acc_global)²) and as the plain
std σ_acc(s) (:func:`fedpipe.metrics.sigma_acc`); and the means over rounds of the per-round records
of a run: σ_acc(g) (the paper's curves are cumulative moving averages), the client disagreement CD of
eq. (9) over each round's participants (``test_cd``, written by the federate stage) and, for a method
that clusters, the clustering NMI against the planted groups. docs/papers/equitable_fl.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedpipe.metrics.fairness import sigma_acc

if TYPE_CHECKING:
    from fedpipe.metrics.runs import RunModels

KEY = "equitable"
COLUMNS = [("sigma_acc_global", "σ_acc(g)"), ("sigma_acc_std", "σ_acc(s)"),
           ("sigma_acc_global_cma", "σ_acc(g) CMA"), ("cd_mean", "CD"),
           ("nmi_mean", "NMI"), ("nmi_mixed_mean", "NMI (≥2 groups)")]
UNSCALED = ("cd_mean", "nmi_mean", "nmi_mixed_mean")
LEGEND = ""


def history_means(history: list[dict[str, float]]) -> dict[str, float]:
    """Means over rounds of the per-round fairness metrics a run recorded (absent ones left out):
    σ_acc (global reading) and CD over the participants (eq. 9), and the clustering NMI of a
    clustering method, over all rounds and over the rounds whose participants span >= 2 groups."""
    out = {}
    for key, col in (("sigma_acc_global_cma", "test_sigma_acc_global"), ("cd_mean", "test_cd"),
                     ("nmi_mean", "cluster_nmi")):
        v = [h[col] for h in history if col in h and np.isfinite(h[col])]
        if v:
            out[key] = float(np.mean(v))
    mixed = [h["cluster_nmi"] for h in history if h.get("groups_present", 0) >= 2]
    if mixed:
        out["nmi_mixed_mean"] = float(np.mean(mixed))
    return out


def run_metrics(run: RunModels) -> dict[str, float]:
    """σ_acc(g), σ_acc(s) of the final global model (a method with one) and :func:`history_means`."""
    out: dict[str, float] = {}
    if run.generic is not None:
        out |= {"sigma_acc_global": sigma_acc(run.generic, run.metrics["test_accuracy"]),
                "sigma_acc_std": sigma_acc(run.generic, reading="std")}
    return out | history_means(run.history)


def notes(metrics: dict[str, dict[str, float]]) -> list[str]:
    """The paragraph under the comparison table that says how the columns are computed."""
    if not any("sigma_acc_global" in m for m in metrics.values()):
        return []
    return ["Equitable-FL's metrics (§5.2): σ_acc(g) = √(mean_i (Acc_i − Acc_global)²) "
            "and σ_acc(s) = std_i Acc_i of the final global model over the clients' local test "
            "splits; CMA columns are their means over all rounds (the paper's curves are "
            "cumulative moving averages); CD = eq. (9) over each round's participants (ordered "
            "pairs / C(r,2), as printed), mean over rounds; NMI = the clustering against the "
            "planted groups, mean over all rounds / over the rounds whose participants span ≥ 2 "
            "groups (a single-group round scores 0 by construction)."]
