"""Fairness and clustering metrics of Equitable-FL (Upadhyay & Hashemi, "Equitable Federated Learning
with Activation Clustering", arXiv 2410.19207, §5.2, "Evaluation metric").

- sigma_acc: "the standard deviation between the global test accuracy and each client's accuracy"
  (refers to GIFAIR-FL). Two readings (docs/papers/equitable_fl.md, "σ_Acc: which reading is judged"):
  ``"global"`` (default, the literal reading): the root-mean-square deviation of
  the client accuracies from the global test accuracy, sqrt(1/n sum_i (Acc_i - Acc_global)^2);
  ``"std"``: the ordinary standard deviation of the client accuracies about their own mean (the
  reading FedNH's fairness table uses, across clients' PM(L) accuracies). Log both.
- client disagreement CD, eq. (9): with the freshly aggregated model w_{k+1} and the round's
  participants S_k (|S_k| = r), f_i the test loss of client i,
  CD_{k+1} = sum_{i in S_k} sum_{j in S_k} |f_i(w_{k+1}) - f_j(w_{k+1})| / C(r, 2).
  The double sum runs over ordered pairs, so as printed CD is twice the mean absolute gap over
  unordered pairs; ``normalization="paper"`` (default) computes eq. (9) literally,
  ``normalization="pairs"`` the unordered-pair mean (= CD / 2).
- clustering NMI (Fig. 2): normalised mutual information between the clustering of the round's
  participants and their planted group ids; scikit-learn's ``normalized_mutual_info_score``
  (arithmetic-mean normalisation, its default).
"""

from __future__ import annotations

import math

import numpy as np

from fedpipe.metrics.accuracy import client_accuracy_summary

SIGMA_READINGS = ("global", "std")
CD_NORMALIZATIONS = ("paper", "pairs")


def _finite_clients(acc: np.ndarray) -> np.ndarray:
    a = np.asarray(acc, dtype=np.float64).ravel()
    return a[~np.isnan(a)]


def sigma_acc(acc: np.ndarray, global_acc: float | None = None, *, reading: str = "global",
              ddof: int = 0) -> float:
    """Equitable-FL's sigma_Acc over the clients' accuracies ``acc`` (NaN clients skipped).

    ``reading="global"`` (default; the literal reading of §5.2, docs/papers/equitable_fl.md):
    sqrt(sum_i (acc_i - global_acc)^2 / (n - ddof)), the spread of the clients around the global
    model's test accuracy ``global_acc`` (required). ``reading="std"``: the standard deviation of the
    client accuracies about their mean, sqrt(sum_i (acc_i - mean)^2 / (n - ddof)), ``global_acc``
    unused. ``ddof=0`` (population form, as in `client_accuracy_summary`); ``ddof=1`` gives the
    sample form. NaN if fewer than ddof + 1 clients have an accuracy.
    """
    if reading not in SIGMA_READINGS:
        raise ValueError(f"reading must be one of {SIGMA_READINGS}, got {reading!r}")
    if ddof < 0:
        raise ValueError(f"ddof must be >= 0, got {ddof}")
    a = _finite_clients(acc)
    if reading == "global":
        if global_acc is None or not math.isfinite(global_acc):
            raise ValueError("sigma_acc(reading='global') needs the global test accuracy global_acc; "
                             "use reading='std' for the spread about the clients' mean")
        centre = float(global_acc)
    else:
        centre = float(a.mean()) if len(a) else float("nan")
    if len(a) <= ddof:
        return float("nan")
    return float(np.sqrt(np.sum((a - centre) ** 2) / (len(a) - ddof)))


def client_disagreement(losses: np.ndarray, *, normalization: str = "paper") -> float:
    """Client disagreement CD, Equitable-FL eq. (9), from the test losses f_i(w_{k+1}) of the round's
    r participants under the freshly aggregated global model (`per_client_loss`).

    ``normalization="paper"``: sum over ordered pairs (i, j) of |f_i - f_j|, divided by C(r, 2), as
    printed (twice the unordered-pair mean). ``"pairs"``: the mean of |f_i - f_j| over the C(r, 2)
    unordered pairs. NaN for fewer than 2 participants (no pair). Losses must be finite.
    """
    if normalization not in CD_NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {CD_NORMALIZATIONS}, got {normalization!r}")
    f = np.asarray(losses, dtype=np.float64).ravel()
    if not np.all(np.isfinite(f)):
        raise ValueError("client_disagreement needs finite losses of the round's participants")
    r = len(f)
    if r < 2:
        return float("nan")
    ordered_sum = float(np.abs(f[:, None] - f[None, :]).sum())  # each unordered pair counted twice
    pairs = math.comb(r, 2)
    return ordered_sum / pairs if normalization == "paper" else ordered_sum / (2 * pairs)


def clustering_nmi(labels_pred: np.ndarray, labels_true: np.ndarray) -> float:
    """NMI between a clustering of clients and their planted groups (Equitable-FL Fig. 2), by
    scikit-learn's ``normalized_mutual_info_score`` (I(U;V) / mean(H(U), H(V))). Invariant to
    relabelling the clusters; 1 for a perfect clustering. scikit-learn returns 1 when both labelings
    are a single cluster and 0 when only one of them is."""
    pred = np.asarray(labels_pred).ravel()
    true = np.asarray(labels_true).ravel()
    if pred.shape != true.shape or pred.size == 0:
        raise ValueError(f"labels_pred ({pred.size}) and labels_true ({true.size}) must be non-empty "
                         "and of the same length")
    from sklearn.metrics import normalized_mutual_info_score  # on first use (a second of imports)

    return float(normalized_mutual_info_score(true, pred))


def fairness_summary(acc: np.ndarray, global_acc: float | None = None, losses: np.ndarray | None = None,
                     fraction: float = 0.1) -> dict[str, float]:
    """`client_accuracy_summary`'s keys (unchanged) plus the Equitable-FL fairness metrics:
    ``sigma_acc_std`` always, ``sigma_acc_global`` when ``global_acc`` is given, and ``cd`` /
    ``cd_pairs`` (eq. (9), both normalisations) when the clients' test ``losses`` are given (NaN
    entries, clients without test data, skipped)."""
    out = client_accuracy_summary(acc, fraction)
    out["sigma_acc_std"] = sigma_acc(acc, reading="std")
    if global_acc is not None:
        out["sigma_acc_global"] = sigma_acc(acc, global_acc, reading="global")
    if losses is not None:
        f = _finite_clients(losses)
        out["cd"] = client_disagreement(f, normalization="paper")
        out["cd_pairs"] = client_disagreement(f, normalization="pairs")
    return out
