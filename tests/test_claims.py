"""Claims: judge() against hand-computed means and standard errors, the papers' claim lists, and the
report's claims table and claims.json end to end on files written to tmp_path."""

import csv
import math
from pathlib import Path

import pytest

from fedpipe.claims import (
    MIN_SEEDS,
    Claim,
    absent_papers,
    all_claims,
    claims_json,
    claims_metrics,
    judge,
    judge_all,
    paper_claims,
)
from fedpipe.claims import fedddpm as fedddpm_claims
from fedpipe.claims import fedptr as fedptr_claims
from fedpipe.config.core import build
from fedpipe.config.fl import StudyConfig
from fedpipe.io import read_json, write_json
from fedpipe.pipeline.report import build_report

LOWER = Claim("Paper (X 2020)", "m FID < b FID", "diffusion", "fid", "m", "b", "lower", "Table 1")
HIGHER = Claim("Paper (X 2020)", "m acc > b acc", "classification", "test_accuracy", "m", "b",
               "higher")
MATCH = Claim("Paper (X 2020)", "m matches b", "diffusion", "fid", "m", "b", "match", tolerance=0.1)

# the issue's numbers: FID over seeds 0, 1, 2 of the default study on one H100
ISSUE = {"fedddpm": {0: 83.4, 1: 81.1, 2: 58.8}, "fedavg": {0: 94.0, 1: 101.6, 2: 56.9}}


def seeds(*values: float, start: int = 0) -> dict[int, float]:
    return {start + i: v for i, v in enumerate(values)}


def se_of(d: list[float]) -> float:
    """Sample std / sqrt(n), written out."""
    n = len(d)
    mean = sum(d) / n
    return math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) / math.sqrt(n)


def test_paired_claim_that_holds():
    r = judge(LOWER, {"m": seeds(10, 11, 12), "b": seeds(13, 15, 14)})
    # d = b - m = 3, 4, 2: mean 3, std 1, SE 1/sqrt(3)
    assert r.status == "held" and r.held and r.test == "paired" and r.n == 3
    assert r.mean_diff == pytest.approx(3.0) and r.se == pytest.approx(1 / math.sqrt(3))
    assert r.method_values == {"0": 10, "1": 11, "2": 12} and r.baseline_values["2"] == 14


def test_issue_numbers_fedddpm_vs_fedavg():
    """FedDDPM loses on seed 2 (58.8 vs 56.9), yet d = 10.6, 20.5, -1.9 has mean 9.733 and SE
    11.225 / sqrt(3) = 6.481: the mean points the claimed way by more than its SE, so it holds."""
    claim = Claim("FedDDPM", "FedDDPM FID < FedAvg FID", "diffusion", "fid", "fedddpm", "fedavg",
                  "lower")
    r = judge(claim, ISSUE)
    assert r.mean_diff == pytest.approx(29.2 / 3)
    assert r.se == pytest.approx(se_of([10.6, 20.5, -1.9])) and r.se == pytest.approx(6.4808, abs=1e-4)
    assert r.held and r.test == "paired"
    # on seed 2 alone it would not; on seeds 0 and 1 alone it is not judged (two seeds)
    two = judge(claim, {a: {s: v for s, v in x.items() if s < 2} for a, x in ISSUE.items()})
    assert two.status == "not judged" and not two.held and two.mean_diff == pytest.approx(15.55)


def test_paired_claim_fails_when_one_seed_goes_the_other_way():
    r = judge(LOWER, {"m": seeds(70, 68, 75), "b": seeds(80, 80, 60)})
    # d = 10, 12, -15: mean 7/3 = 2.333, SE = 15.044 / sqrt(3) = 8.686 > mean
    assert r.mean_diff == pytest.approx(7 / 3) and r.se == pytest.approx(se_of([10, 12, -15]))
    assert r.se == pytest.approx(8.686, abs=1e-3)
    assert r.status == "not held" and not r.held


def test_claim_pointing_the_wrong_way_is_not_held():
    r = judge(LOWER, {"m": seeds(13, 15, 14), "b": seeds(10, 11, 12)})
    assert r.mean_diff == pytest.approx(-3.0) and r.status == "not held"


def test_unpaired_arms_use_welch_standard_error():
    values = {"m": seeds(1.0, 2.0, 3.0), "b": seeds(4.0, 6.0, 8.0, start=3)}  # no shared seed
    r = judge(LOWER, values)
    # mean_b - mean_m = 6 - 2 = 4; SE = sqrt(var_m/3 + var_b/3) = sqrt(1/3 + 4/3)
    assert r.test == "welch" and r.n == 3
    assert r.mean_diff == pytest.approx(4.0) and r.se == pytest.approx(math.sqrt(5 / 3))
    assert r.held
    r = judge(LOWER, {"m": seeds(1.0, 2.0, 3.0), "b": seeds(2.0, 6.0, 1.0, start=3)})
    # mean_b 3: diff 1; var_b = (1 + 9 + 4) / 2 = 7; SE = sqrt(1/3 + 7/3) = 1.633 > 1
    assert r.mean_diff == pytest.approx(1.0) and r.se == pytest.approx(math.sqrt(8 / 3))
    assert r.status == "not held"


def test_partly_shared_seeds_pair_on_the_shared_ones():
    r = judge(LOWER, {"m": seeds(10, 11, 12, 99), "b": {1: 15, 2: 14, 3: 16, 7: 0}})
    # shared seeds 1, 2, 3: d = 4, 2, -83
    assert r.test == "paired" and r.n == 3 and r.mean_diff == pytest.approx(-77 / 3)
    assert r.method_values == {"0": 10, "1": 11, "2": 12, "3": 99}  # every seed shown


def test_fewer_than_three_seeds_is_not_judged_with_its_numbers():
    assert MIN_SEEDS == 3
    r = judge(LOWER, {"m": seeds(10, 11), "b": seeds(20, 21)})
    assert r.status == "not judged" and not r.held
    assert r.mean_diff == pytest.approx(10.0) and r.se == pytest.approx(0.0) and r.n == 2
    assert "at least 3" in r.reason
    one = judge(LOWER, {"m": seeds(10), "b": seeds(20)})
    assert one.status == "not judged" and one.se is None and one.mean_diff == pytest.approx(10.0)
    welch = judge(LOWER, {"m": seeds(1.0, 2.0, 3.0), "b": seeds(4.0, 6.0, start=3)})
    assert welch.status == "not judged" and welch.test == "welch" and welch.n == 2


def test_missing_arm_or_metric_is_not_evaluated():
    r = judge(LOWER, {"m": seeds(1, 2, 3)})
    assert r.status == "not evaluated" and not r.held and "b" in r.reason
    assert r.method_values == {"0": 1, "1": 2, "2": 3} and r.mean_diff is None
    # the arm runs, but has no value of the metric (judge_all reads the track's per-seed metrics)
    tracks = {"classification": {"m": {0: {"test_accuracy": 0.9}}, "b": {0: {"loss": 1.0}}}}
    assert judge_all([HIGHER], tracks)[0].status == "not evaluated"


def test_a_paper_with_no_claim_evaluated_is_listed_once():
    other = Claim("Other (Y 2021)", "o acc > b acc", "classification", "test_accuracy", "o", "b2",
                  "higher")
    results = [judge(LOWER, {"m": seeds(1, 2, 3), "b": seeds(2, 3, 4)}), judge(other, {"b": seeds(1)})]
    # Paper's claim is judged (it stays a row); none of Other's is evaluated (one line)
    assert absent_papers(results) == {"Other (Y 2021)": 1}
    assert absent_papers(claims_json(results)) == {"Other (Y 2021)": 1}


def test_non_finite_value_is_not_judged():
    r = judge(LOWER, {"m": seeds(1, float("nan"), 3), "b": seeds(2, 3, 4)})
    assert r.status == "not judged" and "m seed 1" in r.reason


def test_higher_claim_on_accuracy():
    r = judge(HIGHER, {"m": seeds(0.80, 0.82, 0.81), "b": seeds(0.75, 0.78, 0.76)})
    # d = m - b = 0.05, 0.04, 0.05
    assert r.mean_diff == pytest.approx(0.14 / 3) and r.se == pytest.approx(se_of([.05, .04, .05]))
    assert r.held


def test_tolerance_claim():
    r = judge(MATCH, {"m": seeds(10.5, 9.8, 10.2), "b": seeds(10.0, 10.0, 10.0)})
    # d = 0.5, -0.2, 0.2: mean 1/6, SE 0.2028; tolerance 10% of the baseline mean 10 = 1.0
    assert r.threshold == pytest.approx(1.0) and r.mean_diff == pytest.approx(1 / 6)
    assert r.se == pytest.approx(se_of([0.5, -0.2, 0.2]))
    assert r.held and abs(r.mean_diff) + r.se < 1.0
    far = judge(MATCH, {"m": seeds(12, 11.5, 12.5), "b": seeds(10, 10, 10)})
    assert far.mean_diff == pytest.approx(2.0) and far.status == "not held"
    # inside the band on average, but not by more than its SE: not held
    noisy = judge(MATCH, {"m": seeds(12.0, 8.0, 10.6), "b": seeds(10, 10, 10)})
    assert abs(noisy.mean_diff) < 1.0 < abs(noisy.mean_diff) + noisy.se
    assert noisy.status == "not held"


def test_claim_validation():
    with pytest.raises(ValueError, match="tolerance"):
        Claim("P", "x", "diffusion", "fid", "m", "b", "lower", tolerance=0.1)
    with pytest.raises(ValueError, match="tolerance"):
        Claim("P", "x", "diffusion", "fid", "m", "b", "match")
    with pytest.raises(ValueError, match="both"):
        Claim("P", "x", "diffusion", "fid", "m", "m", "lower")
    with pytest.raises(ValueError, match="track"):
        Claim("P", "x", "vision", "fid", "m", "b", "lower")
    assert LOWER.key == "paper/fid/m-lt-b" and MATCH.key == "paper/fid/m-match-b"


def study_of(**kw) -> StudyConfig:
    return build(StudyConfig, {"algorithms": ["fedavg", "fedprox", "scaffold", "feddyn"],
                               "diffusion_algorithms": ["fedavg", "fedprox", "scaffold", "mofedsam",
                                                        "fedddpm", "fedddpm_plus"],
                               "seeds": [0, 1, 2], **kw}, "study")


def test_registry_fedddpm_claims_as_the_paper_states_them():
    study = study_of()
    papers = paper_claims(study)
    assert set(papers) == {fedddpm_claims.PAPER, "classification baselines", fedptr_claims.PAPER,
                           "Equitable-FL (Upadhyay & Hashemi 2024)", "FedNH (Dai et al. 2023)",
                           "PerAda (Xie et al. 2024)"}
    assert papers["FedNH (Dai et al. 2023)"] == []  # no fednh in this study
    claims = all_claims(study)
    assert len({c.key for c in claims}) == len(claims)
    by = {(c.method, c.baseline, c.metric): c for c in papers[fedddpm_claims.PAPER]}
    for m in ("fedddpm", "fedddpm_plus"):
        for b in ("fedavg", "fedprox", "scaffold", "mofedsam"):
            assert by[(m, b, "fid")].direction == "lower"
    # Table I, MNIST 15% Shard (the default): SCAFFOLD 4.889, MoFedSAM 4.840 below FedAvg 5.822
    assert by[("scaffold", "fedavg", "fid")].direction == "lower"
    assert "4.889 vs 5.822" in by[("scaffold", "fedavg", "fid")].source
    assert by[("mofedsam", "fedavg", "fid")].direction == "lower"
    assert by[("fedprox", "fedavg", "fid")].direction == "lower"  # 5.714 vs 5.822
    # FedDDPM+ ~ FedDDPM within Table I's largest relative gap (2.188 vs 1.910)
    match = by[("fedddpm_plus", "fedddpm", "fid")]
    assert match.direction == "match" and match.tolerance == pytest.approx(0.1455, abs=1e-4)
    stop = by[("fedddpm_plus", "fedavg", "stopped_at")]
    assert stop.direction == "lower" and "160 of 400" in stop.source
    assert by[("fedddpm", "aux_only", "fid")].direction == "lower"
    base = {c.method: c for c in papers["classification baselines"]}
    assert set(base) == {"scaffold", "feddyn", "feddc"}
    assert all(c.baseline == "fedavg" and c.direction == "higher" and c.metric == "test_accuracy"
               for c in base.values())
    assert base["scaffold"].paper.startswith("SCAFFOLD (Karimireddy et al. 2020)")


def test_fedddpm_claims_follow_the_reference_column():
    # MNIST 15% Dir 0.3: FedProx 2.981 above FedAvg 2.786, so the table claims FedProx is worse
    by = {(c.method, c.baseline): c
          for c in fedddpm_claims.claims(study_of(paper_reference="mnist/15_dir0.3"))}
    assert by[("fedprox", "fedavg")].direction == "higher"
    assert by[("fedprox", "fedavg")].text == "FedProx FID > FedAvg FID"
    cifar100 = {(c.method, c.baseline): c
                for c in fedddpm_claims.claims(study_of(paper_reference="cifar100/30_shard"))}
    assert cifar100[("fedddpm_plus", "fedddpm")].tolerance == pytest.approx(0.2158, abs=1e-4)


def test_claims_json_records():
    results = [judge(LOWER, {"m": seeds(10, 11, 12), "b": seeds(13, 15, 14)}),
               judge(HIGHER, {"m": seeds(0.9)})]
    records = claims_json(results)
    assert records[0]["paper"] == "Paper (X 2020)" and records[0]["claim"] == "m FID < b FID"
    assert records[0]["held"] is True and records[0]["values"] == {
        "m": {"0": 10, "1": 11, "2": 12}, "b": {"0": 13, "1": 15, "2": 14}}
    assert records[0]["mean_diff"] == pytest.approx(3.0) and records[0]["source"] == "Table 1"
    assert records[1]["held"] is False and records[1]["status"] == "not evaluated"
    metrics = claims_metrics(results)
    assert metrics["summary"] == {"claims": 2, "held": 1, "not_held": 0, "not_judged": 0,
                                  "not_evaluated": 1}
    assert metrics["held"] == {"paper/fid/m-lt-b": True, "paper/test_accuracy/m-gt-b": False}
    assert metrics["claims"] == records


# -- the report, end to end on files ---------------------------------------------------------------

DIFFUSION = {  # FID over seeds 0, 1, 2; FedDDPM+ stops at round 20 of 40
    "fedavg": (94.0, 101.6, 56.9), "fedprox": (90.2, 99.5, 60.3), "scaffold": (88.8, 95.1, 57.7),
    "mofedsam": (92.4, 97.3, 59.9), "fedddpm": (83.4, 81.1, 58.8), "fedddpm_plus": (85.2, 80.7, 61.5)}
ACCURACY = {"fedavg": (0.801, 0.812, 0.795), "fedprox": (0.803, 0.810, 0.799),
            "scaffold": (0.842, 0.851, 0.838), "feddyn": (0.790, 0.835, 0.760)}


def write_inputs(root: Path) -> None:
    for algo, fids in DIFFUSION.items():
        for seed, fid in enumerate(fids):
            d = root / "federate_ddpm" / algo / f"seed_{seed}"
            stop = 20 if algo == "fedddpm_plus" else 40
            write_json(d / "metrics.json", {
                "fid": fid, "stopped_at": stop, "rounds": stop, "server_steps": 0,
                "train_seconds_now": 1.5, "extractor": "classifier:lenet", "fid_samples": 500,
                "sampler": "ddpm"})
            with open(d / "history.csv", "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["round", "train_loss", "test_loss", "test_fid"])
                w.writerows([[10, 0.5, 0.5, fid + 20], [20, 0.4, 0.4, fid + 5], [21, 0.4, "", ""]])
    per_seed, means = {}, {}
    for algo, accs in ACCURACY.items():
        per_seed[algo] = {str(s): {"test_accuracy": a, "test_loss": 0.5, "client_acc_mean": a - 0.1,
                                   "client_acc_std": 0.05, "client_acc_worst10": a - 0.3,
                                   "client_acc_best10": a + 0.1} for s, a in enumerate(accs)}
        mean = sum(accs) / 3
        std = math.sqrt(sum((a - mean) ** 2 for a in accs) / 2)
        means[algo] = {"test_accuracy": mean, "test_accuracy_std": std, "client_acc_mean": mean - 0.1,
                       "client_acc_mean_std": std, "seeds": 3}
    per_seed["fedprox"]["0"].update(personal_acc_mean=0.9)  # a method with personal models
    means["fedprox"].update(personal_acc_mean=0.9, personal_acc_mean_std=0.01)
    write_json(root / "evaluate" / "seeds.json", per_seed)
    write_json(root / "evaluate" / "metrics.json", means)


def test_build_report_claims_table_and_json(tmp_path):
    write_inputs(tmp_path)
    study = study_of()
    rep = build_report(study, "digits, shards, 10 clients", tmp_path / "federate_ddpm",
                       tmp_path / "evaluate", tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    assert text == rep.text and "## Claims" in text and "mean(d) > SE" in text
    for fids in DIFFUSION.values():  # every seed's value is in the table
        for fid in fids:
            assert f"{fid:.4g}" in text
    assert "fedddpm: s0 83.4, s1 81.1, s2 58.8" in text and "fedavg: s0 94, s1 101.6, s2 56.9" in text
    assert "scaffold: s0 0.842, s1 0.851, s2 0.838" in text
    assert "not evaluated in this study" in text  # FedDC and aux-only training are not in it

    data = read_json(tmp_path / "report" / "claims.json")
    records = data["claims"]
    assert len(records) == len(all_claims(study)) == data["summary"]["claims"]
    by = {r["key"]: r for r in records}
    main = by["fedddpm/fid/fedddpm-lt-fedavg"]
    assert main["paper"] == "FedDDPM (Peng et al. 2025)" and main["claim"] == "FedDDPM FID < FedAvg FID"
    assert main["values"] == {"fedddpm": {"0": 83.4, "1": 81.1, "2": 58.8},
                              "fedavg": {"0": 94.0, "1": 101.6, "2": 56.9}}
    assert main["held"] is True and main["mean_diff"] == pytest.approx(29.2 / 3)
    assert main["se"] == pytest.approx(6.4808, abs=1e-4) and main["test"] == "paired"
    stop = by["fedddpm/stopped_at/fedddpm_plus-lt-fedavg"]
    assert stop["held"] is True and stop["mean_diff"] == 20 and stop["se"] == 0
    assert by["fedddpm/fid/fedddpm-lt-aux_only"]["status"] == "not evaluated"
    assert by["feddc/test_accuracy/feddc-gt-fedavg"]["status"] == "not evaluated"
    scaffold = by["scaffold/test_accuracy/scaffold-gt-fedavg"]
    assert scaffold["held"] is True and scaffold["values"]["scaffold"] == {"0": 0.842, "1": 0.851,
                                                                           "2": 0.838}
    # FedDyn: d = -0.011, 0.023, -0.035: mean -0.0077, not held
    assert by["feddyn/test_accuracy/feddyn-gt-fedavg"]["status"] == "not held"
    assert data["held"]["fedddpm/fid/fedddpm-lt-fedavg"] is True
    assert sum(data["summary"][k] for k in ("held", "not_held", "not_judged", "not_evaluated")) == \
        data["summary"]["claims"]
    metrics = read_json(tmp_path / "report" / "metrics.json")
    assert metrics["claims"] == data["summary"]
    assert metrics["classification"]["scaffold"]["test_accuracy"] == pytest.approx(0.8436667)
    # the classification table: mean ± std over seeds, personalized columns when present
    assert "| scaffold | 84.37 ± 0.67 |" in text and "personal mean" in text
    assert "| fedprox | 80.40 ± 0.56 |" in text and "| 90.00 ± 1.00 |" in text
    assert {p.name for p in rep.plots} == {"fid_curves.png", "fid_history.csv", "report.md",
                                           "claims.json", "metrics.json"}


def test_report_with_one_seed_judges_nothing(tmp_path):
    write_inputs(tmp_path)
    study = study_of(seeds=[0])
    per_seed = read_json(tmp_path / "evaluate" / "seeds.json")
    write_json(tmp_path / "evaluate" / "seeds.json",
               {a: {"0": s["0"]} for a, s in per_seed.items()})
    rep = build_report(study, "t", tmp_path / "federate_ddpm", tmp_path / "evaluate",
                       tmp_path / "report")
    statuses = {r.status for r in rep.claims}
    assert statuses == {"not judged", "not evaluated"} and not any(r.held for r in rep.claims)
    assert "not judged (1 paired seed(s); a claim is judged over at least 3 seeds)" in rep.text


def test_report_names_a_missing_input(tmp_path):
    write_inputs(tmp_path)
    (tmp_path / "evaluate" / "seeds.json").unlink()
    with pytest.raises(FileNotFoundError, match="seeds.json"):
        build_report(study_of(), "t", tmp_path / "federate_ddpm", tmp_path / "evaluate",
                     tmp_path / "report")
