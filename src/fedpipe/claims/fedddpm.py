"""FedDDPM's headline claims (Peng et al., "Federated Learning for Diffusion Models", arXiv
2503.06426; Tables I-IV, Sections VI-B to VI-E), as checks on the diffusion track (FID of the final
global model, lower is better; the stop round of FedDDPM+).

Encoded as the paper states them, with the paper's numbers in ``source``, its sentence in
``quote`` and its numbers in ``paper_values`` (FID: relative, the paper's Inception FID against our
small extractor's). The paper's table column is
``study.paper_reference``; when that is null (the default study: digits, 2 shards per client),
Table I's MNIST 15% Shard column, where the paper's gap is largest (FedAvg 5.822 against FedDDPM
1.910) and the one the issue cites. The directions below are the same in Table I's 30% Shard column.

1. FedDDPM's FID is lower than each baseline's (FedAvg, FedProx, SCAFFOLD, MoFedSAM): Tables I-III,
   all 18 configurations.
2. The same for FedDDPM+ (Tables I-III, all 18 configurations).
3. The ordering of the baselines against FedAvg in the reference column (Table I, MNIST 15% Shard:
   FedProx 5.714, SCAFFOLD 4.889 and MoFedSAM 4.840 against FedAvg 5.822, all lower): table values,
   not a claim the paper makes, so they form the second family (``ordering``), Holm-corrected apart
   from the paper's claims. The order among the three non-IID fixes is not encoded: the paper's text
   and table disagree on it (VI-B calls SCAFFOLD the best baseline on MNIST 15% Shard, Table I has
   MoFedSAM lower).
4. FedDDPM+ roughly matches FedDDPM (Section VI-C: "slightly lower performance"). Tolerance rule: the
   largest relative FID gap |FedDDPM+ - FedDDPM| / FedDDPM that the paper itself reports over the six
   columns of the reference dataset's table (Table I: 14.6%, 15% Shard 2.188 vs 1.910; Table II:
   14.6%; Table III: 21.6%). Relative, because our FID (a small classifier's features, hundreds of
   samples) is on another scale than the paper's Inception FID; the largest gap, because the claim
   covers every column and a tighter band would test more than the paper shows.
5. FedDDPM+ stops training early (VI-E3: "FedDDPM+ converges in around 300 global rounds, reducing
   the number of global rounds by half compared to FedAvg"). The rule, over the paper's own range:
   FedDDPM+'s ``stop_fraction`` (its stop round over ``diffusion_fl.rounds``, 1.0 when QuickTest never
   fired) below :data:`STOP_SHARE`, the latest stop the paper reports as a share of its rounds over
   all 18 configurations of Tables I-III (VI-B to VI-D: 120-170 of 400 on MNIST, 250-320 of 600 on
   CIFAR-10, 270-330 of 600 on CIFAR-100: 0.30 to 0.55; the largest, 330 of 600 on CIFAR-100, is
   0.55). "By half" read as 0.5 would fail 3 of the paper's own 18 runs (0.517-0.55); at 0.55 every
   one of them is at or below it. Paired against that constant; the paper's effect is 0.55 minus the
   reference column's own stop share (MNIST 15% Shard: 160 of 400, 0.40: an effect of 0.15).
6. FedDDPM beats training on the synthetic auxiliary set alone (Table IV), the arm ``aux_only``
   (:class:`fedpipe.algorithms.fedddpm.AuxOnly`). Table IV trains it on a set the size of the
   original data; this pipeline has one auxiliary set per replicate, FedDDPM's (docs/papers/fedddpm.md).

Not encoded (each needs more than two arms of one study): "the largest gain is under Shard
partitions" and "lower Dirichlet alpha hurts all methods" compare studies; Fig. 8's "aux data on the
server beats LocalAug" is about the speed of the training-loss decrease, and LocalAug is not
implemented.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedpipe.claims import Claim
from fedpipe.reference import (
    COLUMN_TITLES,
    COLUMNS,
    FEDDDPM_FID,
    FEDDDPM_PLUS_STOP_ROUND,
    TABLE_NAMES,
    describe,
    paper_fid,
    paper_stop_round,
    parse_reference,
)

if TYPE_CHECKING:
    from fedpipe.config.fl import StudyConfig

KEY = "fedddpm"
PAPER = "FedDDPM (Peng et al. 2025)"
ARMS = ("fedddpm", "fedddpm_plus", "aux_only")
DEFAULT_REFERENCE = "mnist/15_shard"
BASELINES = ("fedavg", "fedprox", "scaffold", "mofedsam")
PAPER_ROUNDS = {"mnist": 400, "cifar10": 600, "cifar100": 600}
STOP_SHARE = round(max(max(r) / PAPER_ROUNDS[t] for t, r in FEDDDPM_PLUS_STOP_ROUND.items()), 4)
"""The latest stop round the paper reports, as a share of its rounds (Table III's CIFAR-100 runs,
330 of 600 = 0.55): FedDDPM+'s stop claim (claim 5) is judged against it."""
# the paper's sentences the claims encode (verbatim; tests/test_claims.py finds each in the paper)
QUOTE_BEATS = ("Experimental results validate that our proposed algorithms outperform the "
               "state-of-the-art FL algorithms on the MNIST, CIFAR10 and CIFAR100 datasets.")
QUOTE_MATCH = ("We also observe that FedDDPM+ achieves slightly lower performance than FedDDPM but "
               "with less training overhead.")
QUOTE_STOP = ("For example, for CIFAR100, FedDDPM+ converges in around 300 global rounds, reducing "
              "the number of global rounds by half compared to FedAvg.")
QUOTE_AUX = ("As shown in Table IV, the experimental results indicate that, even with 15% client "
             "participation, both FedAvg and FedDDPM outperform centralized synthetic dataset "
             "training in the vast majority of cases, particularly in more complex tasks.")
TABLE_IV_MNIST = (1.910, 4.204)  # Table IV, MNIST Shard, 15%: FedDDPM vs aux-only
NAMES = {"fedavg": "FedAvg", "fedprox": "FedProx", "scaffold": "SCAFFOLD", "mofedsam": "MoFedSAM",
         "fedddpm": "FedDDPM", "fedddpm_plus": "FedDDPM+"}
# Table IV (15% participation): FedDDPM vs centralised training on the synthetic auxiliary set alone
TABLE_IV = ("Table IV (15% participation): FedDDPM 1.910 vs aux-only 4.204 (MNIST Shard), 21.730 vs "
            "47.332 (CIFAR-10 Dir 0.1), 17.139 vs 49.434 (CIFAR-100 Dir 0.3)")


def match_tolerance(table: str) -> tuple[float, str]:
    """The largest relative gap |FedDDPM+ - FedDDPM| / FedDDPM over the columns of ``table``, and
    where the paper reports it."""
    rows = FEDDDPM_FID[table]
    gaps = [(abs(p - d) / d, i) for i, (p, d) in enumerate(zip(rows["fedddpm_plus"],
                                                                 rows["fedddpm"], strict=True))]
    gap, i = max(gaps)
    col = COLUMN_TITLES[COLUMNS[i]]
    return gap, (f"{TABLE_NAMES[table]}, {col}: FedDDPM+ {rows['fedddpm_plus'][i]:.3f} vs FedDDPM "
                 f"{rows['fedddpm'][i]:.3f}, the largest gap of that table")


def claims(study: StudyConfig) -> list[Claim]:
    ref = study.paper_reference or DEFAULT_REFERENCE
    table, _ = parse_reference(ref)
    fid, where = paper_fid(ref), describe(ref)

    def fid_claim(method: str, baseline: str, direction: str, source: str, quote: str,
                  family: str = "paper") -> Claim:
        op = "<" if direction == "lower" else ">"
        return Claim(PAPER, f"{NAMES[method]} FID {op} {NAMES[baseline]} FID", "diffusion", "fid",
                     method, baseline, direction, source, quote=quote,  # type: ignore[arg-type]
                     family=family, paper_values=(fid[method], fid[baseline]),  # type: ignore[arg-type]
                     paper_units="relative")

    out = [fid_claim(m, b, "lower", f"Tables I-III, all 18 configurations; {where}: "
                                    f"{fid[m]:.3f} vs {fid[b]:.3f}", QUOTE_BEATS)
           for m in ("fedddpm", "fedddpm_plus") for b in BASELINES]
    tol, tol_source = match_tolerance(table)
    out.append(Claim(PAPER, f"FedDDPM+ FID matches FedDDPM FID (within {tol:.1%})", "diffusion",
                     "fid", "fedddpm_plus", "fedddpm", "match", tolerance=round(tol, 4),
                     source=f"Section VI-C; tolerance from {tol_source}", quote=QUOTE_MATCH,
                     paper_values=(fid["fedddpm_plus"], fid["fedddpm"]), paper_units="relative"))
    stops = FEDDDPM_PLUS_STOP_ROUND[table]
    own = paper_stop_round(ref) / PAPER_ROUNDS[table]
    out.append(Claim(PAPER, f"FedDDPM+ stops within the paper's range (stop round / rounds < "
                            f"{STOP_SHARE})", "diffusion", "stop_fraction", "fedddpm_plus",
                     "paper_latest_stop", "lower",
                     f"Sections VI-B to VI-D: stops at 0.30-0.55 of the rounds over Tables I-III "
                     f"(latest 330 of 600, CIFAR-100); {where}: round {paper_stop_round(ref)} of "
                     f"{PAPER_ROUNDS[table]} ({min(stops)}-{max(stops)} over that table); VI-E3",
                     reference=STOP_SHARE, quote=QUOTE_STOP, paper_values=(round(own, 4), STOP_SHARE),
                     paper_units="same"))
    out.append(Claim(PAPER, "FedDDPM FID < FID of training on the auxiliary set alone",
                     "diffusion", "fid", "fedddpm", "aux_only", "lower", TABLE_IV, quote=QUOTE_AUX,
                     paper_values=TABLE_IV_MNIST, paper_units="relative"))
    for b in BASELINES[1:]:  # the table's ordering of the baselines against FedAvg: family 2
        direction = "lower" if fid[b] < fid["fedavg"] else "higher"
        out.append(fid_claim(b, "fedavg", direction, f"{where}: {fid[b]:.3f} vs "
                                                     f"{fid['fedavg']:.3f}",
                             f"{TABLE_NAMES[table]}: {NAMES[b]} {fid[b]:.3f}, FedAvg "
                             f"{fid['fedavg']:.3f} ({where})", family="ordering"))
    return out
