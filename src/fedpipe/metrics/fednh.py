"""FedNH's evaluation columns (Dai et al. 2023, §4.1-§4.2): PM(V) and PM(L), each client's own model
on the global test set weighted equally over the classes it owns / by its training label distribution
(:mod:`fedpipe.metrics.personalized`), for every method with personal models. FedNH's Table 2 reports
their mean over clients; ``*_client_std`` is their spread across clients. docs/papers/fednh.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedpipe.metrics.personalized import PM_MODES, pm_accuracy_of

if TYPE_CHECKING:
    from fedpipe.metrics.runs import RunModels

KEY = "fednh"
COLUMNS = [("pm_v_mean", "PM(V)"), ("pm_l_mean", "PM(L)")]
UNSCALED: tuple[str, ...] = ()
LEGEND = ("PM(V) / PM(L) are FedNH's: each client's own model on the global test set, weighted "
          "equally over the classes it owns / by its label distribution.")


def run_metrics(run: RunModels) -> dict[str, float]:
    """``pm_v_mean``, ``pm_v_client_std``, ``pm_l_mean``, ``pm_l_client_std`` of a run with personal
    models (none for a method without), from one pass of each own model over the test set."""
    out: dict[str, float] = {}
    if not run.personal:
        return out
    for mode in PM_MODES:
        pm = pm_accuracy_of(run.personal_test, run.test[1], run.train_counts, mode)
        out[f"pm_{mode.lower()}_mean"] = float(np.nanmean(pm))
        out[f"pm_{mode.lower()}_client_std"] = float(np.nanstd(pm))  # across clients (Table 2)
    return out


def notes(metrics: dict[str, dict[str, float]]) -> list[str]:
    return []
