"""PerAda's headline claims (Xie et al., CVPR 2024; Sec. 7.1, Tables 1-2), as checks on the classification
track (``data/evaluate/seeds.json``). Encoded as the paper states them (Table 1, CIFAR-10 columns),
with the paper's numbers in ``source``; whether they hold is for the study's seeds to say.

1. Parameter efficiency (Sec. 7.1, Table 1): PerAda trains a small share of the model (1.41 M of 11.18 M,
   12.6%, for ResNet-18), against the whole model for full-model methods (FedAvg+FT: 11.18 M).
   Metric ``trainable_share`` (trainable / parameters of the model without adapters). A property of
   the architecture, the same on every replicate (SE = 0 by construction): a fact, reported beside
   the claims and never counted as a held claim.
2. KD improves the generalization of the personalized models (Sec. 7.1, "PerAda outperforms PerAda
   w/o KD, which shows that KD improves the generalization of personalized models"; Table 1): PerAda's
   personalized Global-test accuracy above PerAda w/o KD's (59.05 vs 53.81), and their accuracy on
   corrupted test sets (CIFAR-10-C 48.53 vs 44.45). Metrics ``personal_global_mean``,
   ``personal_corrupt_mean``.
3. ... without hurting personalization: Local-test within one point (Table 1: 91.82 vs 91.27, i.e.
   KD does not lower it). Encoded as a match of ``personal_acc_mean`` with a tolerance of one point
   relative to the w/o-KD value (1 / 91.27 = 1.1%): two-sided, which the paper's +0.55 satisfies.
4. Partial-model pFL generalizes worse under corruption (Sec. 7.1, "Existing partial model pFL can
   have poor generalization to out-of-distribution shifts"; Table 1, CIFAR-10-C): FedRep 30.68 and
   LG-FedAvg 26.83 below PerAda 48.53 (the paper's claims) and below Ditto 44.32 (an ordering among
   baselines: the second family, ``ordering``, Holm-corrected apart). An arm missing from the study
   shows as "not evaluated".
5. Table 1's headline (Sec. 7.1, "PerAda achieves the comparable personalized performance (+1.08%
   ...) and better generalization (+5.23%, 4.53%, 4.21% ..."):
   - "comparable personalized performance": personalized Local-test at least the baseline's less
     one point (non-inferiority, ``at_least``; the margin one point of the baseline's Table 1 value,
     as claim 3's) against the full-model baselines APFL (90.74: the +1.08% is against it, the best
     baseline), pFedMe (90.73), Ditto (90.21) and FedAvg+FT (88.91), and FedBN (90.37, the best
     partial-model baseline);
   - "better generalization": personalized Global-test higher than Ditto's (59.05 vs 53.82, the
     +5.23%) and FedAvg+FT's (43.99), and personalized corrupted-test accuracy higher than Ditto's
     (CIFAR-10-C 48.53 vs 44.32, the +4.21%: the out-of-distribution headline).
6. Table 2 (the global model; Sec. 7.1, "Tab. 2 shows that the generalization of PerAda global model
   with adapter also outperforms baselines, and KD indeed improves our global model"): the global
   model's Global-test accuracy (``test_accuracy``) higher than each of Table 2's: FedDF (74.83, the
   generic method that also distils), FedAvg (69.34), FedProx (69.64), FedDyn (70.36), pFedMe
   (68.25), APFL (69.79), Ditto (69.95) and PerAda w/o KD (74.22). Table 2's CIFAR-10.1 / CIFAR-10-C
   columns are printed in the report, not encoded.

Each claim quotes the paper's sentence (``quote``) and carries Table 1's / Table 2's CIFAR-10
numbers (``paper_values``, percent points against our fractions).

The report section (:func:`report_section`, studies that run PerAda) prints our personalized
Local-test / Global-test / corrupted accuracy and the global model's Global-test / corrupted accuracy
beside Table 1's and Table 2's CIFAR-10 columns (:data:`TABLE1`, :data:`TABLE2`, copied from the
paper) for the paper-scale study ``perada_cifar10``. FedSim / FedAlt are matched to the
row of their ``part`` (input layer, output layer, adapter).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fedpipe.claims import Claim, metric_cell

if TYPE_CHECKING:
    from fedpipe.config.fl import StudyConfig

KEY = "perada"
PAPER = "PerAda (Xie et al. 2024)"
ARMS = ("perada", "perada_nokd")
LOCAL_TOLERANCE = round(1 / 91.27, 4)  # one point of PerAda w/o KD's Local-test (Table 1)
CIFAR10_C = {"fedrep": 30.68, "lg_fedavg": 26.83, "ditto": 44.32, "perada": 48.53}
NAMES = {"fedrep": "FedRep", "lg_fedavg": "LG-FedAvg", "ditto": "Ditto", "perada": "PerAda",
         "fedavg_ft": "FedAvg+FT", "perada_nokd": "PerAda w/o KD", "feddf": "FedDF",
         "fedavg": "FedAvg", "apfl": "APFL", "pfedme": "pFedMe", "fedbn": "FedBN",
         "fedprox": "FedProx", "feddyn": "FedDyn"}
LOCAL_BASELINES = ("apfl", "pfedme", "ditto", "fedavg_ft", "fedbn")
"""Table 1's baselines PerAda's personalized Local-test is judged "comparable" to (claim 5)."""
FULL_MODEL = ("ditto", "fedavg_ft")
"""Table 1's full-model baselines PerAda's personalized Global-test is judged above (claim 5)."""
GLOBAL_BASELINES = ("feddf", "fedavg", "fedprox", "feddyn", "pfedme", "apfl", "ditto", "perada_nokd")
"""Table 2's global models that PerAda's is judged against (claim 6)."""
QUOTE_KD = ("PerAda outperforms PerAda w/o KD, which shows that KD improves the generalization of "
            "personalized models (Theorem 2).")
QUOTE_PARTIAL = "Existing partial model pFL can have poor generalization to out-of-distribution shifts."
QUOTE_HEADLINE = ("Tab. 1 shows that even with the smallest number of trainable parameters, PerAda "
                  "achieves the comparable personalized performance (+1.08%, 0.34%, 4.85% on CIFAR-10, "
                  "Office-Home, CheXpert) and better generalization (+5.23%, 4.53%, 4.21%, 0.22%, 3.21% "
                  "on CIFAR-10, CIFAR-10.1, CIFAR-10-C, Office-Home, CheXpert).")
QUOTE_GLOBAL = ("Tab. 2 shows that the generalization of PerAda global model with adapter also "
                "outperforms baselines, and KD indeed improves our global model.")
QUOTE_SHARE = ("ResNet-18 model consists of 11.18 million (M) parameters, and the adapter has 1.41M "
               "(12.6%) parameters.")

# Table 1, CIFAR-10 (20 clients, Dir(0.1), ResNet-18; mean ± std across the clients' personalized
# models): row -> (personalized params, # trained, # communicated, Local-test, Global-test,
# CIFAR-10.1, CIFAR-10-C), each accuracy (mean, std). FedSim / FedAlt rows: "<name>:<part>".
Cell = tuple[float, float]
TABLE1: dict[str, tuple[str, str, str, Cell, Cell, Cell, Cell]] = {
    "local": ("Full model", "11.18M", "0M", (85.94, 8.82), (29.77, 8.09), (25.82, 6.27), (26.67, 7.07)),
    "fedavg_ft": ("Full model", "11.18M", "11.18M", (88.91, 5.71), (43.99, 9.57), (35.49, 8.02),
                  (36.51, 8.36)),
    "pfedme": ("Full model", "22.36M", "11.18M", (90.73, 4.67), (45.06, 8.65), (36.51, 7.2),
               (37.65, 7.6)),
    "apfl": ("Full model", "22.36M", "11.18M", (90.74, 4.75), (43.92, 9.18), (35.83, 7.5),
             (36.51, 7.94)),
    "ditto": ("Full model", "22.36M", "11.18M", (90.21, 4.61), (53.82, 6.35), (42.72, 5.68),
              (44.32, 5.73)),
    "fedbn": ("Batch norm.", "11.18M", "11.17M", (90.37, 5.19), (43.18, 8.67), (35.01, 7.24),
              (36.29, 7.43)),
    "fedalt:input": ("Input layer", "11.18M", "6.45M", (87.07, 6.54), (32.23, 8.23), (27.49, 6.41),
                     (28.51, 7.11)),
    "fedsim:input": ("Input layer", "11.18M", "6.45M", (87.93, 6.25), (33.07, 8.16), (28.21, 6.41),
                     (29.15, 7.16)),
    "lg_fedavg": ("Feat. extractor", "11.18M", "0.005M", (86.7, 8.01), (29.96, 8.0), (25.97, 6.21),
                  (26.83, 6.95)),
    "fedrep": ("Output layer", "11.18M", "11.17M", (87.76, 6.46), (35.19, 6.97), (30.15, 5.89),
               (30.68, 6.31)),
    "fedalt:output": ("Output layer", "11.18M", "11.17M", (89.68, 5.4), (40.68, 7.3), (33.61, 6.12),
                      (34.3, 6.5)),
    "fedsim:output": ("Output layer", "11.18M", "11.17M", (89.75, 5.51), (41.98, 7.66),
                      (34.21, 6.22), (35.31, 6.79)),
    "fedalt:adapter": ("Adapter", "12.59M", "11.18M", (87.26, 7.78), (31.51, 8.55), (27.38, 6.65),
                       (27.77, 7.19)),
    "fedsim:adapter": ("Adapter", "12.59M", "11.18M", (87.76, 7.57), (31.97, 7.44), (27.76, 5.78),
                       (28.1, 6.46)),
    "perada_nokd": ("Adapter", "2.82M", "1.41M", (91.27, 5.15), (53.81, 6.27), (42.5, 5.06),
                    (44.45, 5.48)),
    "perada": ("Adapter", "2.82M", "1.41M", (91.82, 4.43), (59.05, 5.24), (47.25, 4.48),
               (48.53, 4.74)),
}
# Table 2, CIFAR-10: the global model -> (Global-test, CIFAR-10.1, CIFAR-10-C)
TABLE2: dict[str, tuple[float, float, float]] = {
    "fedavg": (69.34, 54.95, 57.07), "fedprox": (69.64, 54.75, 56.84),
    "feddyn": (70.36, 56.3, 55.91), "feddf": (74.83, 60.95, 61.23),
    "pfedme": (68.25, 52.55, 56.33), "apfl": (69.79, 53.6, 57.06), "ditto": (69.95, 55.25, 57.33),
    "perada_nokd": (74.22, 57.6, 61.40), "perada": (76.77, 62.5, 64.47),
}
PART_ROWS = ("fedsim", "fedalt")
PAPER_STUDIES = {"perada_cifar10": "CIFAR-10"}


def _t1(algo: str, col: int) -> float:
    """Table 1's CIFAR-10 accuracy of ``algo``: col 3 Local-test, 4 Global-test, 6 CIFAR-10-C."""
    return TABLE1[algo][col][0]  # type: ignore[index]


def claims(study: StudyConfig) -> list[Claim]:
    t = "classification"
    pct = "percent"
    out = [
        Claim(PAPER, "PerAda trains a smaller share of the parameters than FedAvg+FT", t,
              "trainable_share", "perada", "fedavg_ft", "lower",
              "Table 1: 1.41 M of 11.18 M (12.6%, ResNet-18) vs 11.18 M", fact=True, quote=QUOTE_SHARE),
        Claim(PAPER, "KD improves personalized Global-test accuracy (PerAda > PerAda w/o KD)", t,
              "personal_global_mean", "perada", "perada_nokd", "higher",
              "Table 1, CIFAR-10 Global-test: 59.05 vs 53.81", quote=QUOTE_KD,
              paper_values=(_t1("perada", 4), _t1("perada_nokd", 4)), paper_units=pct),
        Claim(PAPER, "KD improves personalized corrupted-test accuracy (PerAda > PerAda w/o KD)", t,
              "personal_corrupt_mean", "perada", "perada_nokd", "higher",
              "Table 1, CIFAR-10-C: 48.53 vs 44.45", quote=QUOTE_KD,
              paper_values=(_t1("perada", 6), _t1("perada_nokd", 6)), paper_units=pct),
        Claim(PAPER, "KD does not hurt personalized Local-test accuracy (within one point)", t,
              "personal_acc_mean", "perada", "perada_nokd", "match",
              "Table 1, CIFAR-10 Local-test: 91.82 vs 91.27", tolerance=LOCAL_TOLERANCE,
              quote=QUOTE_KD, paper_values=(_t1("perada", 3), _t1("perada_nokd", 3)), paper_units=pct),
    ]
    for partial in ("fedrep", "lg_fedavg"):
        for full in ("perada", "ditto"):
            out.append(Claim(
                PAPER, f"{NAMES[partial]} personalized corrupted-test accuracy < {NAMES[full]}'s", t,
                "personal_corrupt_mean", partial, full, "lower",
                f"Table 1, CIFAR-10-C: {CIFAR10_C[partial]} vs {CIFAR10_C[full]}", quote=QUOTE_PARTIAL,
                family="paper" if full == "perada" else "ordering",
                paper_values=(CIFAR10_C[partial], CIFAR10_C[full]), paper_units=pct))
    local, glob = _t1("perada", 3), _t1("perada", 4)
    for base in LOCAL_BASELINES:
        b_local = _t1(base, 3)
        out.append(Claim(
            PAPER, f"PerAda's personalized Local-test accuracy is comparable to {NAMES[base]}'s "
            "(at least, less one point)", t, "personal_acc_mean", "perada", base, "at_least",
            f"Table 1, CIFAR-10 Local-test: {local} vs {b_local}", tolerance=round(1 / b_local, 4),
            quote=QUOTE_HEADLINE, paper_values=(local, b_local), paper_units=pct))
    for base in FULL_MODEL:
        b_glob = _t1(base, 4)
        out.append(Claim(PAPER, f"PerAda's personalized Global-test accuracy > {NAMES[base]}'s", t,
                         "personal_global_mean", "perada", base, "higher",
                         f"Table 1, CIFAR-10 Global-test: {glob} vs {b_glob}", quote=QUOTE_HEADLINE,
                         paper_values=(glob, b_glob), paper_units=pct))
    out.append(Claim(PAPER, "PerAda's personalized corrupted-test accuracy > Ditto's", t,
                     "personal_corrupt_mean", "perada", "ditto", "higher",
                     f"Table 1, CIFAR-10-C: {CIFAR10_C['perada']} vs {CIFAR10_C['ditto']} (+4.21)",
                     quote=QUOTE_HEADLINE, paper_values=(CIFAR10_C["perada"], CIFAR10_C["ditto"]),
                     paper_units=pct))
    for base in GLOBAL_BASELINES:
        out.append(Claim(
            PAPER, f"PerAda's global model Global-test accuracy > {NAMES[base]}'s", t,
            "test_accuracy", "perada", base, "higher",
            f"Table 2, CIFAR-10 Global-test: {TABLE2['perada'][0]} vs {TABLE2[base][0]}",
            quote=QUOTE_GLOBAL, paper_values=(TABLE2["perada"][0], TABLE2[base][0]), paper_units=pct))
    return out


def table1_row(algo: str, algorithms: Mapping[str, Any] | None = None) -> str:
    """The Table 1 row of ``algo``: FedSim / FedAlt by their ``part`` (from the ``algorithms``
    params, validated by then; absent: ``output``, ``PartialConfig``'s default). Reads the params as
    they are, so that the report stage does not import (and depend on) the algorithms' code."""
    if algo not in PART_ROWS:
        return algo
    return f"{algo}:{((algorithms or {}).get(algo) or {}).get('part', 'output')}"


def _cell(c: Cell | float | None) -> str:
    if c is None:
        return "—"
    return f"{c:.2f}" if isinstance(c, float) else f"{c[0]:.2f} ± {c[1]:.2f}"


def report_section(study: StudyConfig, metrics: Mapping[str, Mapping[str, float]],
                   algorithms: Mapping[str, Any] | None = None) -> list[str]:
    """Markdown: per algorithm, the personalized models' Local-test, Global-test and corrupted
    accuracy and the trainable share (Table 1's columns), then the global model's Global-test and
    corrupted accuracy (Table 2's), ours as mean ± std over seeds; beside them the paper's CIFAR-10
    numbers for ``perada_cifar10`` (mean ± std across clients there). Empty without PerAda.
    ``algorithms``: the ``algorithms`` params (FedSim / FedAlt's ``part`` picks their row)."""
    if not {"perada", "perada_nokd"} & set(study.algorithms):
        return []
    ds = PAPER_STUDIES.get(study.name)
    note = (f"Paper: {ds} columns of Table 1 (personalized models, mean ± std across clients; "
            "CIFAR-10.1 has no offline counterpart here, and the paper's CIFAR-10-C averages all 19 "
            "corruptions, ours the study's) and Table 2 (the global model)."
            if ds else "No paper column: the paper does not run this study's dataset "
                       "(its numbers are printed for `perada_cifar10`).")
    lines = ["## PerAda protocol: personalized and global models, clean and corrupted (%)", "",
             "Ours: mean ± std over seeds. Personalized: each client's own model on its local test "
             "split (Local-test), on the global test set (Global-test) and on the corrupted test sets "
             f"(mean over severities, then over {', '.join(study.corruptions) or 'no corruptions'})."
             " " + note, ""]
    head = "| algorithm | Local-test | Global-test | corrupted | trainable share |"
    rule = "|---|---|---|---|---|"
    if ds:
        head += (" paper row | personalized params | # trained | # comm. | Local-test | Global-test "
                 "| CIFAR-10.1 | CIFAR-10-C |")
        rule += "---|" * 8
    lines += [head, rule]
    for algo, m in metrics.items():
        share = "—" if m.get("trainable_share") is None else f"{100 * m['trainable_share']:.2f}"
        row = (f"| {algo} | {metric_cell(m, 'personal_acc_mean')} | "
               f"{metric_cell(m, 'personal_global_mean')} | "
               f"{metric_cell(m, 'personal_corrupt_mean')} | {share} |")
        if ds:
            key = table1_row(algo, algorithms)
            paper = TABLE1.get(key)
            row += (f" {key if paper else '—'} | " + " | ".join(
                _cell(v) if not isinstance(v, str) else v for v in paper) + " |"
                if paper else " — |" + " — |" * 7)
        lines.append(row)
    lines += ["", "Global model (the server's model: PerAda's global adapter on the frozen backbone):",
              ""]
    head, rule = "| algorithm | Global-test | corrupted |", "|---|---|---|"
    if ds:
        head += " paper Global-test | CIFAR-10.1 | CIFAR-10-C |"
        rule += "---|" * 3
    lines += [head, rule]
    for algo, m in metrics.items():
        row = f"| {algo} | {metric_cell(m, 'test_accuracy')} | {metric_cell(m, 'corrupt_accuracy')} |"
        if ds:
            row += " " + " | ".join(_cell(v) for v in TABLE2.get(algo, (None,) * 3)) + " |"
        lines.append(row)
    return lines + [""]
