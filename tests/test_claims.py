"""Claims: the rule (one-sided t-tests and TOST with a Holm correction per paper) against hand-computed
p-values and scipy, its error rates and power by simulation, facts apart, a study's own papers, and
the report's claims table, claims.md and claims.json end to end on files written to tmp_path."""

import csv
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from fedpipe.claims import (
    ALPHA,
    MIN_SEEDS,
    PAPER_KEYS,
    Claim,
    all_claims,
    claims_json,
    claims_metrics,
    directional_p,
    effect_for_power,
    equivalence_p,
    holm,
    judge,
    judge_all,
    min_detectable_t,
    paired_stats,
    paper_claims,
    paper_summaries,
    power,
    study_papers,
    verdicts,
    welch_stats,
)
from fedpipe.claims import fedddpm as fedddpm_claims
from fedpipe.claims import fedptr as fedptr_claims
from fedpipe.config.core import ConfigError, build
from fedpipe.config.fl import StudyConfig
from fedpipe.io import read_json, write_json
from fedpipe.pipeline.report import build_report

REPO = Path(__file__).resolve().parents[1]
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


def t2_sf(t: float) -> float:
    """P(T > t) for Student's t with 2 degrees of freedom, in closed form: (1 - t / sqrt(t^2 + 2)) / 2."""
    return 0.5 * (1 - t / math.sqrt(t * t + 2))


def test_paired_claim_that_holds():
    r = judge(LOWER, {"m": seeds(10, 11, 12), "b": seeds(13, 15, 14)})
    # d = b - m = 3, 4, 2: mean 3, std 1, SE 1/sqrt(3), t = 3 sqrt(3) = 5.196, df 2: p = 0.01754
    assert r.test == "paired" and r.n == 3 and r.df == 2
    assert r.mean_diff == pytest.approx(3.0) and r.se == pytest.approx(1 / math.sqrt(3))
    assert r.p == pytest.approx(t2_sf(3 * math.sqrt(3))) and r.p == pytest.approx(0.01754, abs=1e-5)
    assert r.p == pytest.approx(stats.ttest_rel([13, 15, 14], [10, 11, 12], alternative="greater").pvalue)
    assert r.p_opposite == pytest.approx(1 - r.p)
    assert r.status == "held" and r.held and r.family_size == 1 and r.p_holm == r.p
    assert r.method_values == {"0": 10, "1": 11, "2": 12} and r.baseline_values["2"] == 14
    # the 95% t-interval of the mean difference: 3 -+ t(0.975, 2) / sqrt(3) = 3 -+ 4.303 * 0.5774
    lo, hi = r.ci
    assert lo == pytest.approx(3 - 4.3027 / math.sqrt(3), abs=1e-3) and hi == pytest.approx(6 - lo)


def test_issue_numbers_fedddpm_vs_fedavg_are_not_shown():
    """FedDDPM loses on seed 2 (58.8 vs 56.9): d = 10.6, 20.5, -1.9, mean 9.733, SE 6.481, t = 1.502
    on 2 df: p = 0.1360. The old one-SE rule read it "held"; a 5% one-sided test does not."""
    claim = Claim("FedDDPM", "FedDDPM FID < FedAvg FID", "diffusion", "fid", "fedddpm", "fedavg",
                  "lower")
    r = judge(claim, ISSUE)
    assert r.mean_diff == pytest.approx(29.2 / 3)
    assert r.se == pytest.approx(se_of([10.6, 20.5, -1.9])) and r.se == pytest.approx(6.4808, abs=1e-4)
    assert r.p == pytest.approx(t2_sf(r.mean_diff / r.se)) and r.p == pytest.approx(0.1360, abs=1e-4)
    assert r.status == "not shown" and not r.held
    two = judge(claim, {a: {s: v for s, v in x.items() if s < 2} for a, x in ISSUE.items()})
    assert two.status == "not judged" and not two.held and two.mean_diff == pytest.approx(15.55)


def test_claim_pointing_the_wrong_way_is_contradicted():
    r = judge(LOWER, {"m": seeds(13, 15, 14), "b": seeds(10, 11, 12)})
    # d = -3, -4, -2: the opposite one-sided test has p = 0.01754
    assert r.mean_diff == pytest.approx(-3.0) and r.p_opposite == pytest.approx(0.01754, abs=1e-5)
    assert r.status == "contradicted" and not r.held
    weak = judge(LOWER, {"m": seeds(70, 68, 75), "b": seeds(80, 80, 60)})  # d = 10, 12, -15
    assert weak.se == pytest.approx(se_of([10, 12, -15])) and weak.status == "not shown"


def test_unpaired_arms_use_welch():
    values = {"m": seeds(1.0, 2.0, 3.0), "b": seeds(4.0, 6.0, 8.0, start=3)}  # no shared seed
    r = judge(LOWER, values)
    # mean_b - mean_m = 4; SE = sqrt(1/3 + 4/3); df = (5/3)^2 / ((1/3)^2/2 + (4/3)^2/2) = 2.941
    assert r.test == "welch" and r.n == 3
    assert r.mean_diff == pytest.approx(4.0) and r.se == pytest.approx(math.sqrt(5 / 3))
    assert r.df == pytest.approx((5 / 3) ** 2 / ((1 / 3) ** 2 / 2 + (4 / 3) ** 2 / 2))
    want = stats.ttest_ind([4.0, 6.0, 8.0], [1.0, 2.0, 3.0], equal_var=False, alternative="greater")
    assert r.p == pytest.approx(want.pvalue) and r.p < ALPHA and r.status == "held"
    r = judge(LOWER, {"m": seeds(1.0, 2.0, 3.0), "b": seeds(2.0, 6.0, 1.0, start=3)})
    assert r.mean_diff == pytest.approx(1.0) and r.se == pytest.approx(math.sqrt(8 / 3))
    assert r.status == "not shown"


def test_partly_shared_seeds_pair_on_the_shared_ones():
    r = judge(LOWER, {"m": seeds(10, 11, 12, 99), "b": {1: 15, 2: 14, 3: 16, 7: 0}})
    # shared seeds 1, 2, 3: d = 4, 2, -83
    assert r.test == "paired" and r.n == 3 and r.mean_diff == pytest.approx(-77 / 3)
    assert r.method_values == {"0": 10, "1": 11, "2": 12, "3": 99}  # every seed shown


def test_holm_hand_values():
    # sorted 0.01, 0.03, 0.04 times 3, 2, 1 = 0.03, 0.06, 0.04 -> monotone 0.03, 0.06, 0.06
    assert holm(np.array([0.01, 0.04, 0.03])) == pytest.approx([0.03, 0.06, 0.06])
    # NaN: not in the family (k = 2 here)
    out = holm(np.array([0.02, np.nan, 0.04]))
    assert out[0] == pytest.approx(0.04) and np.isnan(out[1]) and out[2] == pytest.approx(0.04)
    np.testing.assert_allclose(holm(np.array([[0.5, 0.9], [0.001, 0.2]])), [[1.0, 1.0], [0.002, 0.2]])
    assert list(verdicts(np.array([0.01, 0.04, 0.9]), np.array([0.99, 0.96, 0.1]))) == \
        ["held", "not shown", "not shown"]


def test_holm_over_a_papers_claims_in_judge_all():
    """Two claims of one paper, each p = 0.0175 alone: Holm doubles the smaller, both still hold;
    a third paper-mate at p = 0.136 makes the first step 3 x 0.0175 = 0.053: none holds."""
    strong = {"classification": {"m": {s: {"a": v} for s, v in seeds(10, 11, 12).items()},
                                 "b": {s: {"a": v} for s, v in seeds(13, 15, 14).items()}}}
    c1 = Claim("P (1)", "b > m", "classification", "a", "b", "m", "higher")
    c2 = Claim("P (1)", "m < b", "classification", "a", "m", "b", "lower")
    two = judge_all([c1, c2], strong)
    assert [r.status for r in two] == ["held", "held"] and two[0].family_size == 2
    assert two[0].p_holm == pytest.approx(2 * t2_sf(3 * math.sqrt(3)))
    tracks = {"classification": {**strong["classification"],
                                 "f": {s: {"a": v} for s, v in seeds(83.4, 81.1, 58.8).items()},
                                 "g": {s: {"a": v} for s, v in seeds(94.0, 101.6, 56.9).items()}}}
    c3 = Claim("P (1)", "f < g", "classification", "a", "f", "g", "lower")
    other = Claim("Q (2)", "b > m", "classification", "a", "b", "m", "higher")  # its own family
    three = judge_all([c1, c2, c3, other], tracks)
    assert [r.status for r in three] == ["not shown"] * 3 + ["held"]
    assert three[0].p_holm == pytest.approx(3 * t2_sf(3 * math.sqrt(3))) and three[3].family_size == 1


def test_ties_and_zero_se_never_hold():
    tie = judge(LOWER, {"m": seeds(5, 6, 7), "b": seeds(5, 6, 7)})
    assert tie.se == 0 and tie.status == "not shown" and tie.p is None and "SE = 0" in tie.reason
    constant = judge(LOWER, {"m": seeds(20, 20, 20), "b": seeds(40, 40, 40)})  # d = 20 on every seed
    assert constant.mean_diff == 20 and constant.se == 0 and constant.status == "not shown"
    same_gap = judge(HIGHER, {"m": seeds(2, 3, 4), "b": seeds(1, 2, 3)})
    assert same_gap.status == "not shown" and not same_gap.held
    rounding = judge(HIGHER, {"m": seeds(0.1 + 0.2, 0.3, 0.3), "b": seeds(0.1, 0.1, 0.1)})
    assert rounding.se == 0 and rounding.status == "not shown"  # 0.30000000000000004: still a tie
    match_tie = judge(MATCH, {"m": seeds(10, 10, 10), "b": seeds(10, 10, 10)})
    assert match_tie.status == "not shown" and not match_tie.held
    zero_mean = judge(LOWER, {"m": seeds(1, 2, 3), "b": seeds(2, 1, 3)})  # d = 1, -1, 0: t = 0
    assert zero_mean.p == pytest.approx(0.5) and zero_mean.status == "not shown"
    # an SE = 0 claim is left out of its paper's Holm family: it neither holds nor costs the others
    tracks = {"diffusion": {"m": {s: {"fid": v} for s, v in seeds(10, 11, 12).items()},
                            "b": {s: {"fid": v} for s, v in seeds(13, 15, 14).items()},
                            "c": {s: {"fid": v} for s, v in seeds(10, 11, 12).items()}}}
    tied = Claim("Paper (X 2020)", "m < c", "diffusion", "fid", "m", "c", "lower")
    res = judge_all([LOWER, tied], tracks)
    assert [r.status for r in res] == ["held", "not shown"] and res[0].family_size == 1
    # the vectorised rule: SE = 0 gives p = 1 both ways
    p, po = directional_p(np.array([1.0, 0.0]), np.array([0.0, 0.0]), np.array([2.0, 2.0]))
    assert list(p) == [1.0, 1.0] and list(po) == [1.0, 1.0]


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
    tracks = {"classification": {"m": {0: {"test_accuracy": 0.9}}, "b": {0: {"loss": 1.0}}}}
    assert judge_all([HIGHER], tracks)[0].status == "not evaluated"


def test_non_finite_value_is_not_judged():
    r = judge(LOWER, {"m": seeds(1, float("nan"), 3), "b": seeds(2, 3, 4)})
    assert r.status == "not judged" and "m seed 1" in r.reason


def test_match_claim_is_an_equivalence_test():
    r = judge(MATCH, {"m": seeds(10.5, 9.8, 10.2), "b": seeds(10.0, 10.0, 10.0)})
    # d = 0.5, -0.2, 0.2: mean 1/6, SE 0.2028; margin 10% of 10 = 1.0. TOST: the larger of
    # P(T > (1/6 + 1) / SE) and P(T < (1/6 - 1) / SE) = t2_sf(4.109) = 0.0272
    se = se_of([0.5, -0.2, 0.2])
    assert r.threshold == pytest.approx(1.0) and r.mean_diff == pytest.approx(1 / 6)
    assert r.se == pytest.approx(se)
    assert r.p == pytest.approx(t2_sf((1 - 1 / 6) / se)) and r.p == pytest.approx(0.0272, abs=1e-4)
    assert r.status == "held"
    # inside the band on average, but too noisy to show it
    noisy = judge(MATCH, {"m": seeds(12.0, 8.0, 10.6), "b": seeds(10, 10, 10)})
    assert abs(noisy.mean_diff) < 1.0 and noisy.status == "not shown"
    # far outside: d = 2.9, 3.0, 3.1, the two-sided test of |d| > 1 is significant
    far = judge(MATCH, {"m": seeds(12.9, 13.0, 13.1), "b": seeds(10, 10, 10)})
    assert far.p_opposite == pytest.approx(2 * t2_sf((3 - 1) / se_of([2.9, 3.0, 3.1])))
    assert far.status == "contradicted"
    # just outside, not significantly: d = 2, 1.5, 2.5, p = 2 t2_sf(3.464) = 0.0742
    edge = judge(MATCH, {"m": seeds(12, 11.5, 12.5), "b": seeds(10, 10, 10)})
    assert edge.p_opposite == pytest.approx(0.0742, abs=1e-4) and edge.status == "not shown"


AT_LEAST = Claim("Paper (X 2020)", "m on par or better than b", "classification", "test_accuracy",
                 "m", "b", "at_least", tolerance=0.05)


def test_at_least_claim_is_a_non_inferiority_test():
    # d = m - b = -0.01, -0.02, 0.00: mean -0.01, SE 0.00577; margin 5% of 0.6 = 0.03. The test of
    # "d <= -margin": t = (-0.01 + 0.03) / SE = 3.464, p = t2_sf(3.464) = 0.0371 (held although m is
    # a little lower on average: on par); scipy's ttest_rel of m + margin against b gives the same p
    vals = {"m": seeds(0.59, 0.58, 0.60), "b": seeds(0.60, 0.60, 0.60)}
    r = judge(AT_LEAST, vals)
    se = se_of([-0.01, -0.02, 0.0])
    assert r.threshold == pytest.approx(0.03) and r.mean_diff == pytest.approx(-0.01)
    assert r.p == pytest.approx(t2_sf(0.02 / se)) and r.p == pytest.approx(0.0371, abs=1e-4)
    ref = stats.ttest_rel([0.59 + 0.03, 0.58 + 0.03, 0.60 + 0.03], [0.6] * 3, alternative="greater")
    assert r.p == pytest.approx(ref.pvalue) and r.p_opposite == pytest.approx(1 - ref.pvalue)
    assert r.status == "held" and AT_LEAST.key == "paper/test_accuracy/m-ge-b"
    # clearly worse than the margin: d = -0.10, -0.11, -0.09, contradicted
    worse = judge(AT_LEAST, {"m": seeds(0.50, 0.49, 0.51), "b": seeds(0.60, 0.60, 0.60)})
    assert worse.status == "contradicted"
    # within the margin on average but too noisy: not shown
    noisy = judge(AT_LEAST, {"m": seeds(0.65, 0.50, 0.62), "b": seeds(0.60, 0.60, 0.60)})
    assert noisy.status == "not shown"
    fact = judge(replace(AT_LEAST, fact=True), vals)  # each replicate within 5% of b: true
    assert fact.status == "true"
    assert judge(replace(AT_LEAST, fact=True), {"m": seeds(0.59, 0.5, 0.6),
                                                "b": seeds(0.6, 0.6, 0.6)}).status == "false"


def test_null_at_least_claim_on_the_margin_holds_at_most_five_percent():
    """A true difference of exactly -margin (the boundary of "worse by the margin"), 8 paired
    replicates, 20,000 draws (seed 7): held at the level (5%), never more than 3 binomial SEs above."""
    rng = np.random.default_rng(7)
    margin = 0.3
    d = -margin + rng.standard_normal((20_000, 8))
    mean, se, df = paired_stats(d)
    p, _ = directional_p(mean + margin, se, df)
    rate = (p <= ALPHA).mean()
    assert abs(rate - ALPHA) <= 3 * math.sqrt(ALPHA * (1 - ALPHA) / 20_000)


def test_claim_validation():
    with pytest.raises(ValueError, match="tolerance"):
        Claim("P", "x", "diffusion", "fid", "m", "b", "lower", tolerance=0.1)
    with pytest.raises(ValueError, match="tolerance"):
        Claim("P", "x", "diffusion", "fid", "m", "b", "match")
    with pytest.raises(ValueError, match="tolerance"):
        Claim("P", "x", "diffusion", "fid", "m", "b", "at_least")
    with pytest.raises(ValueError, match="both"):
        Claim("P", "x", "diffusion", "fid", "m", "m", "lower")
    with pytest.raises(ValueError, match="track"):
        Claim("P", "x", "vision", "fid", "m", "b", "lower")
    assert LOWER.key == "paper/fid/m-lt-b" and MATCH.key == "paper/fid/m-match-b"


def study_of(**kw) -> StudyConfig:
    return build(StudyConfig, {"algorithms": ["fedavg", "fedprox", "scaffold", "feddyn"],
                               "diffusion_algorithms": ["fedavg", "fedprox", "scaffold", "mofedsam",
                                                        "fedddpm", "fedddpm_plus", "aux_only"],
                               "seeds": [0, 1, 2], **kw}, "study")


def test_registry_fedddpm_claims_as_the_paper_states_them():
    study = study_of()
    assert study.papers is None and study_papers(study) == ["fedddpm", "baselines"]  # from the arms
    papers = paper_claims(study)
    assert set(papers) == {fedddpm_claims.PAPER, "classification baselines"}
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
    # FedDDPM+ stops within the paper's range: its stop share below the paper's latest, 330 of 600
    stop = by[("fedddpm_plus", "paper_latest_stop", "stop_fraction")]
    assert stop.direction == "lower" and stop.reference == 0.55 and "round 160 of 400" in stop.source
    assert stop.paper_values == (0.4, 0.55) and stop.paper_units == "same"
    # the baselines' ordering is the second family, not the paper's claims
    assert {c.family for c in papers[fedddpm_claims.PAPER] if c.baseline == "fedavg"
            and c.method in ("fedprox", "scaffold", "mofedsam")} == {"ordering"}
    assert sum(c.family == "paper" for c in papers[fedddpm_claims.PAPER]) == 11
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


def test_claims_json_records_and_facts_apart():
    share = Claim("Paper (X 2020)", "m trains fewer parameters", "classification", "share", "m",
                  "b", "lower", "Table 2", fact=True)
    results = judge_all([LOWER, HIGHER, share], {
        "diffusion": {"m": {s: {"fid": v} for s, v in seeds(10, 11, 12).items()},
                      "b": {s: {"fid": v} for s, v in seeds(13, 15, 14).items()}},
        "classification": {"m": {s: {"test_accuracy": 0.9, "share": 0.1} for s in range(3)},
                           "b": {s: {"share": 1.0} for s in range(3)}}})
    records = claims_json(results)
    assert records[0]["paper"] == "Paper (X 2020)" and records[0]["claim"] == "m FID < b FID"
    assert records[0]["held"] is True and records[0]["values"] == {
        "m": {"0": 10, "1": 11, "2": 12}, "b": {"0": 13, "1": 15, "2": 14}}
    assert records[0]["mean_diff"] == pytest.approx(3.0) and records[0]["source"] == "Table 1"
    assert records[0]["p_holm"] == pytest.approx(t2_sf(3 * math.sqrt(3)))
    assert records[0]["family"] == "paper" and records[0]["family_size"] == 1
    assert records[0]["ci95"][0] == pytest.approx(3 - 4.3027 / math.sqrt(3), abs=1e-3)
    assert records[1]["held"] is False and records[1]["status"] == "not evaluated"
    # the fact: SE = 0 by construction, true on every replicate, never counted as a held claim
    assert results[2].status == "true" and results[2].reason == "3 of 3 replicates"
    metrics = claims_metrics(results)
    assert metrics["summary"] == {"claims": 2, "held": 1, "not_shown": 0, "contradicted": 0,
                                  "not_judged": 0, "not_evaluated": 1, "smaller_than_paper": 0,
                                  "undecided": 0, "facts": 1}
    assert metrics["papers"] == {"Paper (X 2020)": metrics["summary"]}
    assert metrics["held"] == {"paper/fid/m-lt-b": True, "paper/test_accuracy/m-gt-b": False}
    assert metrics["facts"] == {"paper/share/m-lt-b": True}
    assert metrics["claims"] == records[:2] and metrics["fact_records"][0]["fact"] is True
    assert paper_summaries(results) == {
        "Paper (X 2020)": "1 of 2 held, 0 contradicted, 0 not shown, 1 not evaluated; 1 fact(s) apart"}
    # a fact that fails on one replicate is false, and still not a claim
    broken = judge(share, {"m": seeds(0.1, 1.2, 0.1), "b": seeds(1.0, 1.0, 1.0)})
    assert broken.status == "false" and not broken.held and broken.reason == "2 of 3 replicates"


def test_facts_of_the_papers():
    """PerAda's trainable share and Equitable-FL's NMI are facts; every other entry is a claim."""
    from fedpipe.claims import equitable, perada

    study = build(StudyConfig, {"algorithms": ["fedavg_ft", "perada", "perada_nokd", "fedprox",
                                               "equitable_fl"], "seeds": [0, 1, 2],
                                "papers": list(PAPER_KEYS)}, "study")
    facts = {c.key for c in all_claims(study) if c.fact}
    assert facts == {"perada/trainable_share/perada-lt-fedavg_ft",
                     "equitablefl/nmi_mixed_mean/equitable_fl-match-perfect_clustering"}
    nmi = next(c for c in equitable.claims(study) if c.fact)
    assert judge(nmi, {"equitable_fl": seeds(1.0, 1.0, 1.0)}).status == "true"
    assert judge(nmi, {"equitable_fl": seeds(1.0, 0.85, 1.0)}).status == "false"
    share = next(c for c in perada.claims(study) if c.fact)
    assert judge(share, {"perada": seeds(0.126, 0.126, 0.126),
                         "fedavg_ft": seeds(1.0, 1.0, 1.0)}).status == "true"


def test_a_study_reports_its_own_papers():
    smoke = build(StudyConfig, {"algorithms": ["fedavg"], "diffusion_algorithms": ["fedavg", "fedddpm"],
                                "seeds": [0, 1, 2]}, "study")
    assert study_papers(smoke) == ["fedddpm"]
    assert {c.paper for c in all_claims(smoke)} == {fedddpm_claims.PAPER}
    ptr = build(StudyConfig, {"algorithms": ["fedavg", "fedprox", "fedptr_s"]}, "study")
    assert study_papers(ptr) == ["fedptr"]
    # the baselines' papers are read on the classification track only
    diff_only = build(StudyConfig, {"algorithms": ["fedavg"], "diffusion_algorithms": ["scaffold"]},
                      "study")
    assert study_papers(diff_only) == []
    explicit = build(StudyConfig, {"algorithms": ["fedavg", "scaffold"], "papers": ["fedptr"]}, "study")
    assert study_papers(explicit) == ["fedptr"] and set(paper_claims(explicit)) == {fedptr_claims.PAPER}
    with pytest.raises(ConfigError) as err:
        build(StudyConfig, {"papers": ["fedddpm", "fedavg"]}, "study")
    assert "study.papers" in str(err.value) and "fedavg" in str(err.value)
    assert "fedddpm, baselines, fedptr, equitable, fednh, perada" in str(err.value)


PRESETS = sorted(p for p in (REPO / "conf" / "study").glob("*.yaml")
                 if p.stem not in ("default", "classification"))  # the two studies of no paper


@pytest.mark.parametrize("path", PRESETS, ids=[p.stem for p in PRESETS])
def test_presets_name_their_paper_and_paper_presets_run_three_replicates(path):
    data = yaml.safe_load(path.read_text())["study"]
    if data.get("diffusion_seeds") == "${study.seeds}":  # Hydra's interpolation, resolved here
        data["diffusion_seeds"] = data["seeds"]
    study = build(StudyConfig, data, "study")
    paper = path.stem.split("_")[0]
    assert study.papers == [paper] and paper in PAPER_KEYS
    if not path.stem.endswith("_smoke"):
        assert len(study.seeds) >= MIN_SEEDS, f"{path.name}: {study.seeds}"


# -- the report, end to end on files ---------------------------------------------------------------

DIFFUSION = {  # FID over seeds 0, 1, 2; FedDDPM+ stops at round 20 of 40
    "fedavg": (94.0, 101.6, 56.9), "fedprox": (90.2, 99.5, 60.3), "scaffold": (88.8, 95.1, 57.7),
    "mofedsam": (92.4, 97.3, 59.9), "fedddpm": (83.4, 81.1, 58.8), "fedddpm_plus": (85.2, 80.7, 61.5),
    "aux_only": (100.1, 104.2, 70.3)}
ACCURACY = {"fedavg": (0.801, 0.812, 0.795), "fedprox": (0.803, 0.810, 0.799),
            "scaffold": (0.842, 0.851, 0.838), "feddyn": (0.790, 0.835, 0.760)}


def write_inputs(root: Path) -> None:
    for algo, fids in DIFFUSION.items():
        for seed, fid in enumerate(fids):
            d = root / "federate_ddpm" / algo / f"seed_{seed}"
            stop = 20 if algo == "fedddpm_plus" else 40
            write_json(d / "metrics.json", {
                "fid": fid, "stopped_at": stop, "stop_fraction": stop / 40, "rounds": stop,
                "server_steps": 0,
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
    assert text == rep.text and "## Claims" in text and "Holm" in text
    claims_md = (tmp_path / "report" / "claims.md").read_text()
    assert claims_md.startswith("# Study default: claims") and "| paper | claim |" in claims_md
    assert claims_md.split("## Claims", 1)[1].strip() in text  # the report's section, alone
    for fids in DIFFUSION.values():  # every replicate's value is in the table
        for fid in fids:
            assert f"{fid:.4g}" in text
    # ours: mean [95% t-interval] (each replicate): FedDDPM 74.43 -+ 4.303 * 13.59 / sqrt(3)
    mean, half = np.mean([83.4, 81.1, 58.8]), 4.3027 * np.std([83.4, 81.1, 58.8], ddof=1) / math.sqrt(3)
    assert f"fedddpm: {mean:.4g} [{mean - half:.4g}, {mean + half:.4g}] (s0 83.4, s1 81.1, s2 58.8)" \
        in text
    assert "(s0 0.842, s1 0.851, s2 0.838)" in text
    # only the study's papers (fedddpm, baselines): no FedPTR, Equitable-FL, FedNH or PerAda rows
    assert "Papers: fedddpm, baselines (study.papers)" in text
    assert "FedPTR" not in claims_md and "PerAda" not in claims_md
    # 11 claims of the paper: 10 judged (the stop share with SE = 0), Holm over 10; the match claim
    # (p 0.0047) holds at 10 x 0.0047 = 0.047. The baselines' ordering is its own family of 3
    assert ("- **FedDDPM (Peng et al. 2025)**: 1 of 11 held, 0 contradicted, 10 not shown (0 smaller "
            "than the paper's, 9 undecided)") in text
    assert ("- **FedDDPM (Peng et al. 2025) · orderings among baselines and controls (not the paper's "
            "claims)**: 0 of 3 held, 0 contradicted, 3 not shown (1 smaller than the paper's, "
            "2 undecided)") in text
    assert "**Orderings among baselines and controls (not the paper's claims)** (Holm" in text
    assert "- **SCAFFOLD (Karimireddy et al. 2020)**: 1 of 1 held, 0 contradicted, 0 not shown" in text
    # what can hold here: 10 judged FedDDPM claims over 3 replicates
    assert f"mean(d) / SE ≥ {min_detectable_t(3, 10):.2f}" in text and f"{min_detectable_t(3):.2f}" in text

    data = read_json(tmp_path / "report" / "claims.json")
    records = data["claims"]
    assert len(records) == len(all_claims(study)) == data["summary"]["claims"]
    by = {r["key"]: r for r in records}
    main = by["fedddpm/fid/fedddpm-lt-fedavg"]
    assert main["paper"] == "FedDDPM (Peng et al. 2025)" and main["claim"] == "FedDDPM FID < FedAvg FID"
    assert main["values"] == {"fedddpm": {"0": 83.4, "1": 81.1, "2": 58.8},
                              "fedavg": {"0": 94.0, "1": 101.6, "2": 56.9}}
    assert main["status"] == "not shown" and main["mean_diff"] == pytest.approx(29.2 / 3)
    assert main["se"] == pytest.approx(6.4808, abs=1e-4) and main["test"] == "paired"
    assert main["family"] == "paper" and main["family_size"] == 10
    assert main["p"] == pytest.approx(0.1360, abs=1e-4)
    # not shown, and the paper's effect (Table I: 1.910 vs 5.822, 67.2% lower) at our FedAvg mean
    # 84.17 is 56.55, inside the bound: undecided, with the replicates for 80% power
    assert main["paper_effect"]["value"] == pytest.approx((5.822 - 1.910) / 5.822 * (94.0 + 101.6 + 56.9) / 3)
    assert main["resolution"] == "undecided" and main["n_for_power"] == 19
    assert main["quote"] == fedddpm_claims.QUOTE_BEATS
    stop = by["fedddpm/stop_fraction/fedddpm_plus-lt-paper_latest_stop"]  # 20 of 40 on every seed
    assert stop["values"]["paper_latest_stop"] == {"0": 0.55, "1": 0.55, "2": 0.55}
    assert stop["status"] == "not shown" and stop["mean_diff"] == pytest.approx(0.05) and stop["se"] == 0
    assert stop["p"] is None and "SE = 0" in stop["reason"]
    # aux-only training (Table IV): d = 16.7, 23.1, 11.5; t = 5.09 (df 2), p = 0.018, Holm x 13
    aux = by["fedddpm/fid/fedddpm-lt-aux_only"]
    assert aux["status"] == "not shown" and aux["mean_diff"] == pytest.approx(17.1)
    assert aux["p"] == pytest.approx(0.0183, abs=1e-3) and aux["p_holm"] > ALPHA
    assert by["feddc/test_accuracy/feddc-gt-fedavg"]["status"] == "not evaluated"
    scaffold = by["scaffold/test_accuracy/scaffold-gt-fedavg"]
    assert scaffold["held"] is True and scaffold["values"]["scaffold"] == {"0": 0.842, "1": 0.851,
                                                                           "2": 0.838}
    # FedDyn: d = -0.011, 0.023, -0.035: mean -0.0077, neither way
    assert by["feddyn/test_accuracy/feddyn-gt-fedavg"]["status"] == "not shown"
    assert data["held"]["scaffold/test_accuracy/scaffold-gt-fedavg"] is True
    assert set(data["held"]) == set(by) and data["facts"] == {} and data["fact_records"] == []
    assert sum(data["summary"][k] for k in ("held", "not_shown", "contradicted", "not_judged",
                                            "not_evaluated")) == data["summary"]["claims"]
    metrics = read_json(tmp_path / "report" / "metrics.json")
    assert metrics["claims"] == data["summary"]
    assert metrics["classification"]["scaffold"]["test_accuracy"] == pytest.approx(0.8436667)
    # the classification table: mean ± std over seeds, personalized columns when present
    assert "| scaffold | 84.37 ± 0.67 |" in text and "personal mean" in text
    assert "| fedprox | 80.40 ± 0.56 |" in text and "| 90.00 ± 1.00 |" in text
    assert {p.name for p in rep.plots} == {"fid_curves.png", "fid_history.csv", "report.md",
                                           "claims.md", "claims.json", "metrics.json"}
    # the plots, embedded by their paths from report.md: the study's stages' outputs, replicate 0
    embedded = re.findall(r"!\[[^]]+\]\(([^)]+)\)", text.split("## Plots", 1)[1])
    assert embedded == ["../evaluate/learning_curves.png", "../evaluate/client_accuracy.png",
                        "../evaluate/fairness_curves.png", "../partition/seed_0/heatmap.png",
                        "../partition/seed_0/sizes.png", "fid_curves.png",
                        "../warmup/seed_0/losses.png", "../aux_quality/seed_0/per_class.png"]
    assert (tmp_path / "report" / embedded[5]).is_file()  # the report's own plot, written by now
    classification = study_of(diffusion_algorithms=[], diffusion_seeds=[])
    text = build_report(classification, "t", tmp_path / "federate_ddpm", tmp_path / "evaluate",
                        tmp_path / "report").text
    embedded = re.findall(r"!\[[^]]+\]\(([^)]+)\)", text.split("## Plots", 1)[1])
    assert len(embedded) == 5 and not any("fid" in e or "warmup" in e for e in embedded)


def test_a_stand_in_study_says_so_in_the_report_the_claims_and_the_cli(tmp_path, capsys):
    """dataset.stand_in: the report, the claims table, claims.json and `python -m fedpipe.claims`
    all carry the note; without it none does."""
    from fedpipe.claims.__main__ import main as claims_cli
    from fedpipe.config.dataset import STAND_IN_NOTE

    write_inputs(tmp_path)
    for stand_in in (False, True):
        out = tmp_path / f"report-{stand_in}"
        rep = build_report(study_of(), "t", tmp_path / "federate_ddpm", tmp_path / "evaluate", out,
                           stand_in=stand_in)
        data = read_json(out / "claims.json")
        assert (STAND_IN_NOTE in rep.text) == stand_in
        assert (STAND_IN_NOTE in (out / "claims.md").read_text()) == stand_in
        assert data.get("stand_in") == (STAND_IN_NOTE if stand_in else None)
        assert read_json(out / "metrics.json").get("stand_in") == (True if stand_in else None)
        assert claims_cli([str(out / "claims.json")]) == 0
        assert (STAND_IN_NOTE in capsys.readouterr().out) == stand_in


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
    assert "not judged (1 paired replicate(s); a claim is judged over at least 3 replicates)" in rep.text


def test_report_names_a_missing_input(tmp_path):
    write_inputs(tmp_path)
    (tmp_path / "evaluate" / "seeds.json").unlink()
    from fedpipe.errors import InputError

    with pytest.raises(InputError, match=r"seeds\.json: missing; run `dvc repro evaluate`"):
        build_report(study_of(), "t", tmp_path / "federate_ddpm", tmp_path / "evaluate",
                     tmp_path / "report")


# -- the rule's error rates and power, by simulation (numpy Generator, fixed seed, vectorised) --------

DRAWS = 20_000


def tol(rate: float, draws: int = DRAWS) -> float:
    """Three binomial standard errors of a rate measured over ``draws`` draws."""
    return 3 * math.sqrt(rate * (1 - rate) / draws)


def paired_family(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Verdicts of directional claims on per-replicate differences d (draws, k claims, n)."""
    mean, se, df = paired_stats(d)
    p, po = directional_p(mean, se, df)
    return verdicts(p, po) == "held", verdicts(po, p) == "held"


@pytest.mark.parametrize("n", [3, 5, 8])
def test_null_claims_hold_at_most_five_percent_per_claim_and_per_paper(n):
    """No real difference, 10 claims per paper: Holm keeps the chance that any of them reads "held"
    at or below 5%, and as often "contradicted". Measured (seed 24, 20,000 papers of 10 claims) at
    n = 3 / 5 / 8: family-wise held rate 4.68% / 4.88% / 4.65%, per-claim 0.48% / 0.50% / 0.48%,
    family-wise contradicted 4.70% / 5.07% / 4.92%; one claim alone held 4.95% / 5.07% / 4.88%.
    The old one-SE rule (mean > SE) on the same draws: 21.3% / 18.7% / 17.5% per claim."""
    rng = np.random.default_rng(24)
    d = rng.standard_normal((DRAWS, 10, n))
    held, contra = paired_family(d)
    fwer, per_claim = held.any(-1).mean(), held.mean()
    assert fwer <= ALPHA + tol(ALPHA) and per_claim <= ALPHA / 10 + tol(ALPHA / 10, DRAWS * 10)
    assert fwer > 0.03  # Holm is not far more conservative than its level with independent claims
    assert contra.any(-1).mean() <= ALPHA + tol(ALPHA)
    assert not (held & contra).any()
    # the same data judged one claim at a time (a paper with one claim): 5% held, 5% contradicted
    alone_held, alone_contra = paired_family(d[:, :1])
    assert abs(alone_held.mean() - ALPHA) <= tol(ALPHA) and abs(alone_contra.mean() - ALPHA) <= tol(ALPHA)
    old_rule = (d.mean(-1) > d.std(-1, ddof=1) / math.sqrt(n)).mean()  # mean > SE
    assert old_rule > 0.15  # what the issue found: 21% per claim at n = 3


def test_null_welch_and_equivalence_claims_hold_at_most_five_percent():
    """Welch (unpaired, unequal variances 1 and 9, 3 and 5 replicates, seed 2024): held 4.78%,
    contradicted 4.71%. A match claim whose true difference sits exactly on the margin: held 5.20%
    (TOST reaches its level there; within 3 binomial SEs of 5%), contradicted 2.31% (the two-sided
    test of "outside the margin" at the boundary). Truly equal arms: contradicted 0.00%."""
    rng = np.random.default_rng(2024)
    a, b = rng.standard_normal((DRAWS, 3)), 3 * rng.standard_normal((DRAWS, 5))
    mean, se, df = welch_stats(a, b)
    p, po = directional_p(mean, se, df)
    assert (p <= ALPHA).mean() <= ALPHA + tol(ALPHA) and (po <= ALPHA).mean() <= ALPHA + tol(ALPHA)
    margin = 0.5
    d = margin + rng.standard_normal((DRAWS, 5)) * 0.4
    mean, se, df = paired_stats(d)
    p, po = equivalence_p(mean, se, df, margin)
    assert (p <= ALPHA).mean() <= ALPHA + tol(ALPHA) and (p <= ALPHA).mean() > 0.03
    inside = rng.standard_normal((DRAWS, 5)) * 0.4  # truly equal: must never be "contradicted" often
    mean, se, df = paired_stats(inside)
    assert (equivalence_p(mean, se, df, margin)[1] <= ALPHA).mean() <= ALPHA / 10


@pytest.mark.parametrize("n,k", [(3, 1), (5, 1), (8, 1), (5, 10), (8, 10)])
def test_planted_effect_holds_at_the_documented_rate(n, k):
    """A true difference of effect_for_power(0.8, n, k) standard deviations (docs/claims.md: 2.30,
    1.36, 0.98 alone at n = 3, 5, 8; 2.63, 1.60 among 10 claims at n = 5, 8) holds 80% of the time:
    exactly so alone, and at least so in a paper whose 9 other claims are null (Holm rejects at
    level alpha / k or better). Measured held rates: 80.6%, 79.8%, 80.1% alone at n = 3, 5, 8;
    80.1%, 80.0% among 10 at n = 5, 8 (5,000 draws each)."""
    effect = effect_for_power(0.8, n, k)
    assert power(effect, n, k) == pytest.approx(0.8)
    rng = np.random.default_rng(100 * n + k)
    d = rng.standard_normal((DRAWS // 4, k, n))
    d[:, 0] += effect
    held, _ = paired_family(d)
    rate = held[:, 0].mean()
    if k == 1:
        assert abs(rate - 0.8) <= tol(0.8, DRAWS // 4)
    else:
        assert rate >= 0.8 - tol(0.8, DRAWS // 4)
        assert rate <= 0.85  # measured 80.1% (n = 5) and 80.0% (n = 8): Holm's gain here is small


def test_documented_minimal_effects():
    """The table of docs/results.md / docs/claims.md: mean / SE needed at level 0.05 / k, and the true
    effect (in SDs of one replicate's difference) that holds with probability 0.8."""
    table = {(n, k): (round(min_detectable_t(n, k), 2), round(effect_for_power(0.8, n, k), 2))
             for n in (3, 5, 8) for k in (1, 5, 10)}
    assert table == {(3, 1): (2.92, 2.30), (3, 5): (6.96, 5.17), (3, 10): (9.92, 7.32),
                     (5, 1): (2.13, 1.36), (5, 5): (3.75, 2.18), (5, 10): (4.60, 2.63),
                     (8, 1): (1.89, 0.98), (8, 5): (3.00, 1.40), (8, 10): (3.50, 1.60)}
    # hand check of the first: t(0.95, 2) = sqrt(2) * a / sqrt(1 - a^2) with a = 1 - 2 * 0.05
    assert min_detectable_t(3) == pytest.approx(math.sqrt(2) * 0.9 / math.sqrt(1 - 0.81))


def test_vectorised_rule_is_the_rule_judge_all_applies():
    """judge_all on per-replicate values gives the verdicts the simulations measure."""
    rng = np.random.default_rng(7)
    for _ in range(30):
        d = rng.standard_normal((4, 3)) + rng.choice([0.0, 3.0], size=(4, 1))
        held, contra = paired_family(d[None])
        claims = [Claim("Sim (1)", f"c{i}", "classification", "x", f"m{i}", f"b{i}", "higher")
                  for i in range(4)]
        per_seed = {}
        for i in range(4):
            per_seed[f"m{i}"] = {s: {"x": float(d[i, s])} for s in range(3)}
            per_seed[f"b{i}"] = {s: {"x": 0.0} for s in range(3)}
        status = [r.status for r in judge_all(claims, {"classification": per_seed})]
        want = ["held" if h else "contradicted" if c else "not shown"
                for h, c in zip(held[0], contra[0], strict=True)]
        assert status == want


def test_report_sections_come_from_the_studys_papers_and_the_report_names_none():
    """The report asks the claims registry for each paper's tables beside ours
    (``report_sections``); it imports no paper's module by name (issue 28)."""
    import ast

    from fedpipe.claims import fednh as fednh_claims
    from fedpipe.claims import report_sections
    from fedpipe.config.fl import StudyConfig

    metrics = {"fednh": {"test_accuracy": 0.4, "test_accuracy_std": 0.01, "pm_v_mean": 0.3,
                         "pm_l_mean": 0.5, "pm_l_client_std": 0.04, "seeds": 3}}
    study = StudyConfig(name="fednh_cifar100", algorithms=["fednh", "fedavg"])
    assert report_sections(study, metrics) == fednh_claims.report_section(study, metrics) != []
    # the same arms, the study reporting another paper only: FedNH's tables are not its to show
    assert report_sections(replace(study, papers=["baselines"]), metrics) == []
    report = Path(__file__).resolve().parents[1] / "src/fedpipe/pipeline/report.py"
    imported = {n.module for n in ast.walk(ast.parse(report.read_text()))
                if isinstance(n, ast.ImportFrom) and n.module}
    assert not {m for m in imported if m.startswith("fedpipe.claims.")}, imported


# --------------------------------------------------------------------------------------------------
# One mean ± std cell for every paper's section and the report's tables


def test_metric_cell_formats_mean_and_std_over_seeds():
    from fedpipe.claims import mean_pm_std, metric_cell

    m = {"acc": 0.123456, "acc_std": 0.0125, "cd": 0.61725, "cd_std": 0.02469, "seeds": 3}
    assert metric_cell(m, "acc") == "12.35 ± 1.25"
    assert metric_cell(m, "cd", 1.0, 3) == "0.617 ± 0.025"
    assert metric_cell({**m, "seeds": 1}, "acc") == "12.35"  # one seed: no std
    assert metric_cell({"acc": 0.5, "seeds": 3}, "acc") == "50.00"  # no std recorded
    assert metric_cell({"acc": None, "seeds": 3}, "acc") == "—"
    assert metric_cell(m, "nmi") == "—"
    assert metric_cell({"acc": 0.25}, "acc") == "25.00"  # seeds absent: one
    assert mean_pm_std(12.3456, 0.98765, 3, 3) == "12.346 ± 0.988"  # the report's FID cell
    assert mean_pm_std(7.0, 0.0, 2, 1) == "7.0 ± 0.0"


# The rendered sections' SHA-256 on the metrics of ``_section_metrics``, recorded by running this
# same rendering on the code before the papers' modules shared ``metric_cell`` (commit fbc0532, where
# equitable, fednh, fedptr and perada each had a ``_ours`` and the report a ``_pct`` and ``fmt``;
# the FID cells then came from ``fedpipe.pipeline.report.fmt(mean, std, n, 3)``): the merge changed
# no byte of the report.
RENDERED_BEFORE = {
    "equitable": "ab6bc5c886fd02c4eb4225722be36b733d6ee7c4532aac577bd4101ac66e2fb7",
    "fednh": "ae28d452040bca6daaafdde3724e564c698a8a7e2b0d44a66ae09b0368df6606",
    "fedptr": "8ce1b9f8ceef2c292487a399360d5a5adbe58c80c18ade8b7ae6dcbb7e860656",
    "perada": "094f199729fe72d15a2ec931c746df84ec3a102604d2e981ac0cd1db93ed7829",
    "classification": "dff1d2ea867a2cf3af20bd16aba59e10929f4c9c1eeb6148b2e2e44282b8f292",
}
# ... and two rows in full, one with every kind of cell (± at 2 and 3 decimals, a lone mean, —)
EQUITABLE_CENTRALIZED_ROW = ("| Centralized | — | 39.14 ± 1.75 | 51.48 ± 2.25 | — | 0.762 | "
                             "58.74 ± 0.75 | 7.18 ± 0.28 | 83.60 ± 0.1 | 5.41 ± 0.21 |")
CLASSIFICATION_DITTO_ROW = "| ditto | — | 26.79 | 174.94 | 187.29 ± 7.75 | 199.63 ± 8.25 | — | 125.56 |"

_KEYS = ("test_accuracy", "test_accuracy_last5", "sigma_acc_global", "sigma_acc_std", "cd_mean",
         "nmi_mixed_mean", "pm_v_mean", "pm_l_mean", "pm_l_client_std", "personal_acc_mean",
         "personal_global_mean", "personal_corrupt_mean", "corrupt_accuracy", "client_acc_mean",
         "client_acc_std", "client_acc_worst10", "client_acc_best10")


def _section_metrics(algos: list[str]) -> dict[str, dict[str, float]]:
    """Per algorithm i: 3, 1 or 2 seeds; for the third, some metrics absent and some without std."""
    out = {}
    for i, a in enumerate(algos):
        m = {"seeds": (3, 1, 2)[i % 3]}
        for j, k in enumerate(_KEYS):
            if i % 3 == 2 and j % 4 == 0:
                continue
            m[k] = 0.123456789 * (j + 1) + 0.0105 * i
            if not (i % 3 == 2 and j % 4 == 1):
                m[f"{k}_std"] = 0.0049999 * (j + 1) + 0.00125 * i
        out[a] = m
    return out


def test_report_sections_render_as_before_the_shared_cell():
    import hashlib

    from fedpipe.claims import equitable, fednh, perada
    from fedpipe.pipeline.report import classification_table

    studies = {
        "equitable": (equitable, ["equitable_fl", "fedprox", "centralized", "cluster2"]),
        "fednh": (fednh, ["fednh", "fedavg", "fedproto", "fedrep"]),
        "fedptr": (fedptr_claims, ["fedptr", "fedavg", "scaffold", "fedptr_s"]),
        "perada": (perada, ["perada", "fedrep", "ditto", "perada_nokd"]),
    }
    text = {key: "\n".join(mod.report_section(StudyConfig(name=f"{key}_cifar10", algorithms=algos),
                                              _section_metrics(algos), {}))
            for key, (mod, algos) in studies.items()}
    text["classification"] = "\n".join(classification_table(
        _section_metrics(["fedavg", "fedprox", "ditto", "fedrep"])))
    assert EQUITABLE_CENTRALIZED_ROW in text["equitable"].splitlines()
    assert CLASSIFICATION_DITTO_ROW in text["classification"].splitlines()
    for key, want in RENDERED_BEFORE.items():
        assert hashlib.sha256(text[key].encode()).hexdigest() == want, f"{key}:\n{text[key]}"


def test_the_claims_command_prints_a_report_and_refuses_what_it_cannot_read(tmp_path, capsys):
    """`python -m fedpipe.claims [path | --exp name]`: the summary line and one line per claim, with
    the verdict and the numbers; a missing file or a bare --exp is one error line and exit 2."""
    from fedpipe.claims.__main__ import main

    arms = {"m": seeds(0.9, 0.91, 0.92, 0.93), "b": seeds(0.5, 0.52, 0.51, 0.5)}
    held = judge_all([HIGHER], {"classification": {a: {s: {"test_accuracy": v} for s, v in vals.items()}
                                                   for a, vals in arms.items()}})
    path = tmp_path / "claims.json"
    write_json(path, {"claims": claims_json(held), "fact_records": []})
    assert main([str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{path}: 1 of 1 claims held, 0 contradicted, 0 not shown (0 facts apart)"
    # the mean difference (0.4 + 0.39 + 0.41 + 0.43) / 4
    assert out[2].startswith("  [HELD         ] m acc > b acc  diff +0.4075 ["), out[2]
    assert out[2].endswith("(b: 0.5, 0.52, 0.51, 0.5; m: 0.9, 0.91, 0.92, 0.93)"), out[2]

    for argv, message in (([str(tmp_path / "none.json")], "run the report stage first"),
                          (["--exp"], "--exp needs an experiment name")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err


# -- issue 42: families, quotes, and "not shown" as ruled out or undecided ------------------------

SAME = Claim("Paper (X 2020)", "m acc > b acc", "classification", "acc", "m", "b", "higher",
             "Table 9: 15 vs 10", paper_values=(15.0, 10.0), paper_units="same")


def test_not_shown_is_ruled_out_when_the_papers_effect_is_above_the_upper_bound():
    """d = -1, 1, 3: mean 1, SE 2 / sqrt(3) = 1.1547, t = 0.866 (p = 0.239): not shown. The one-sided
    95% upper bound is 1 + t(0.95, 2) SE = 1 + 2.91999 * 1.1547 = 4.3717; the paper's effect 15 - 10
    = 5 lies above it: "smaller than the paper's"."""
    vals = {"m": seeds(9, 11, 13), "b": seeds(10, 10, 10)}
    r = judge(SAME, vals)
    assert r.status == "not shown" and r.p == pytest.approx(t2_sf(1 / (2 / math.sqrt(3))))
    assert r.paper_effect == 5.0
    assert r.upper_bound == pytest.approx(1 + 2.919986 * 2 / math.sqrt(3), abs=1e-5)
    assert r.resolution == "smaller than the paper's" and r.n_for_power is None
    assert "upper bound 4.372" in r.reason
    # the paper's effect 3 (13 vs 10) is inside the bound: undecided. The observed effect is
    # mean / SD of one replicate's difference = 1 / 2 = 0.5 SD; 80% power at level 0.05 takes 27
    # replicates (26 give less): the normal approximation ((1.645 + 0.842) / 0.5)^2 = 24.7, plus the t
    r = judge(replace(SAME, paper_values=(13.0, 10.0)), vals)
    assert r.resolution == "undecided" and r.n_for_power == 27
    assert power(0.5, 27) >= 0.8 > power(0.5, 26)
    assert "about 27 replicates for 80% power" in r.reason
    # a lower claim flips the sign of the paper's difference; percent points are read / 100
    low = replace(SAME, direction="lower", paper_values=(95.0, 99.0), paper_units="percent")
    assert judge(low, {"m": seeds(0.5, 0.6, 0.7), "b": seeds(0.6, 0.6, 0.6)}).paper_effect == \
        pytest.approx(0.04)
    # relative units: the paper's relative difference times our baseline's mean (FID 1.91 vs 5.822)
    rel = replace(SAME, direction="lower", paper_values=(1.91, 5.822), paper_units="relative")
    r = judge(rel, {"m": seeds(40, 50, 60), "b": seeds(70, 80, 90)})
    assert r.paper_effect == pytest.approx((5.822 - 1.91) / 5.822 * 80)
    # the observed effect pointing the other way (d = 1, -1, -3: bound -1 + 3.3717 = 2.37 above the
    # paper's 2): undecided, and no replicate count gives power at it
    r = judge(replace(SAME, paper_values=(12.0, 10.0)), {"m": seeds(11, 9, 7), "b": seeds(10, 10, 10)})
    assert r.upper_bound == pytest.approx(-1 + 2.919986 * 2 / math.sqrt(3), abs=1e-5)
    assert r.status == "not shown" and r.resolution == "undecided" and r.n_for_power is None
    # no paper number (a claim without paper_values): never ruled out
    assert judge(replace(SAME, paper_values=None, paper_units=None), vals).resolution == "undecided"


def test_the_bound_uses_the_familys_level():
    """In a family of k judged claims the bound is at level alpha / k (Bonferroni, the first Holm
    step): with 2 claims, 1 + t(0.975, 2) SE = 1 + 4.3027 * 1.1547 = 5.968 > 5: undecided now."""
    per_seed = {"m": {s: {"acc": v} for s, v in seeds(9, 11, 13).items()},
                "b": {s: {"acc": 10.0} for s in range(3)}}
    other = Claim("Paper (X 2020)", "b acc < m acc", "classification", "acc", "b", "m", "lower")
    r = judge_all([SAME, other], {"classification": per_seed})[0]
    assert r.family_size == 2 and r.upper_bound == pytest.approx(1 + 4.302653 * 2 / math.sqrt(3),
                                                                 abs=1e-5)
    assert r.resolution == "undecided"
    from fedpipe.claims import replicates_for_power

    assert r.n_for_power == replicates_for_power(0.5, 2) and power(0.5, r.n_for_power, 2) >= 0.8


def test_families_are_corrected_apart():
    """Two claims at p = 0.0175 each: in one family Holm doubles the smaller (0.035, both held);
    a third at p = 0.136 in the same family makes the first step 3 x 0.0175 = 0.053 (none held), but
    in the ordering family it costs the paper's claims nothing."""
    strong = {"m": {s: {"a": v} for s, v in seeds(10, 11, 12).items()},
              "b": {s: {"a": v} for s, v in seeds(13, 15, 14).items()},
              "f": {s: {"a": v} for s, v in seeds(83.4, 81.1, 58.8).items()},
              "g": {s: {"a": v} for s, v in seeds(94.0, 101.6, 56.9).items()}}
    c1 = Claim("P (1)", "b > m", "classification", "a", "b", "m", "higher")
    c2 = Claim("P (1)", "m < b", "classification", "a", "m", "b", "lower")
    c3 = Claim("P (1)", "f < g", "classification", "a", "f", "g", "lower")
    same = judge_all([c1, c2, c3], {"classification": strong})
    assert [r.status for r in same] == ["not shown"] * 3 and same[0].family_size == 3
    apart = judge_all([c1, c2, replace(c3, family="ordering")], {"classification": strong})
    assert [r.status for r in apart] == ["held", "held", "not shown"]
    assert [r.family_size for r in apart] == [2, 2, 1]
    assert apart[0].p_holm == pytest.approx(2 * t2_sf(3 * math.sqrt(3)))
    assert apart[2].p_holm == pytest.approx(apart[2].p)  # a family of one: no correction
    assert paper_summaries(apart) == {
        "P (1)": "2 of 2 held, 0 contradicted, 0 not shown",
        "P (1) · orderings among baselines and controls (not the paper's claims)":
            "0 of 1 held, 0 contradicted, 1 not shown (0 smaller than the paper's, 1 undecided)"}
    with pytest.raises(ValueError, match="family"):
        Claim("P", "x", "classification", "a", "m", "b", "lower", family="extra")
    with pytest.raises(ValueError, match="paper_values"):
        Claim("P", "x", "classification", "a", "m", "b", "lower", paper_values=(1.0, 2.0))


PAPER_TEXTS = {"fedptr": "000_dc0a64f242bd200d.txt", "fedddpm": "001_7bb48b36f8abc90c.txt",
               "equitable": "002_6a5336d845a6aa80.txt", "perada": "003_49988be174518076.txt",
               "fednh": "004_64f81132a04eff77.txt"}
PAPERS_DIR = REPO.parent / "shared" / "papers"  # the papers as text (outside the repository)


def _norm(text: str) -> str:
    return " ".join(text.split())


def test_every_claim_of_every_paper_quotes_the_paper():
    """Every claim (and fact) of every paper module carries a quote and a source; the paper's own
    claims (family "paper") of the five papers whose text this project keeps are found verbatim in
    it ("…" marks text left out), where the texts are on disk."""
    from fedpipe.claims import _modules

    arms = sorted({a for m in _modules().values() for a in m.ARMS} | {
        "fedavg", "fedprox", "scaffold", "feddyn", "feddc", "gifair", "pow_d", "cluster2", "fairfed",
        "fedrod", "local", "fedper", "ditto", "fedrep", "fedproto", "creff", "fedbabu", "fedavg_ft",
        "lg_fedavg", "feddf", "apfl", "pfedme", "fedbn"})
    study = build(StudyConfig, {"algorithms": arms, "diffusion_algorithms": ["fedavg", "fedddpm"],
                                "seeds": [0, 1, 2], "papers": list(PAPER_KEYS)}, "study")
    by_key = {k: m.claims(study) for k, m in _modules().items()}
    assert all(by_key.values())
    texts = {k: _norm((PAPERS_DIR / f).read_text()) for k, f in PAPER_TEXTS.items()
             if (PAPERS_DIR / f).is_file()}
    checked = 0
    for key, claims in by_key.items():
        for c in claims:
            assert c.quote.strip() and c.source.strip(), c.key
            assert c.family in ("paper", "ordering"), c.key
            if c.family == "paper" and key in texts:
                pos = 0
                for part in (p.strip() for p in c.quote.split("…")):
                    found = texts[key].find(_norm(part), pos)
                    assert found >= 0, f"{c.key}: {part!r} not in the paper"
                    pos = found + len(part)
                checked += 1
    assert checked >= (60 if len(texts) == 5 else 0)
    # the orderings: baselines among themselves and project controls, never the method's claim
    ordering = [c for cs in by_key.values() for c in cs if c.family == "ordering"]
    assert {(c.method, c.baseline) for c in ordering} == {
        ("fedprox", "fedavg"), ("scaffold", "fedavg"), ("mofedsam", "fedavg"),
        ("fairfed", "fedprox"), ("cluster2", "fedprox"), ("pow_d", "fedprox"),
        ("fedptr_s", "fedptr_noproj"), ("fedptr", "fedptr_noproj"),
        ("fedrep", "ditto"), ("lg_fedavg", "ditto")}


def test_the_results_tables_are_generated_from_claims_json(tmp_path, capsys):
    """`make claims-docs`: every `<!-- claims: <study> -->` block is rewritten from
    docs/runs/<study>.claims.json (per family, with the verdict and its resolution), a study
    without one is named as needing a re-run, and a second pass changes nothing."""
    from fedpipe.claims import docs
    from fedpipe.claims.__main__ import main

    per_seed = {"m": {s: {"acc": v} for s, v in seeds(9, 11, 13).items()},
                "b": {s: {"acc": 10.0} for s in range(3)}}
    ordering = Claim("Paper (X 2020)", "b acc < m acc", "classification", "acc", "b", "m", "lower",
                     "Table 9", quote="Table 9", family="ordering")
    results = judge_all([replace(SAME, quote="our method wins"), ordering],
                        {"classification": per_seed})
    runs = tmp_path / "runs"
    write_json(runs / "a_smoke.claims.json", claims_metrics(results))
    md = tmp_path / "results.md"
    md.write_text("# R\n\n<!-- claims: a_smoke -->\nhand-written\n<!-- /claims -->\n\n"
                  "<!-- claims: b_smoke -->\n<!-- /claims -->\n")
    text, needed = docs.update(md, runs)
    assert needed == ["b_smoke"] and "hand-written" not in text
    assert "**Paper (X 2020)**: 0 of 1 held, 0 contradicted, 1 not shown (1 smaller than the " \
        "paper's, 0 undecided)." in text
    assert "**Paper (X 2020) · orderings among baselines and controls" in text
    assert ("| m acc > b acc | Table 9: 15 vs 10 | +5 | +1 ± 1.2 [-3.97, +5.97] | 3 | not shown, "
            "smaller than the paper's (upper bound +4.372 < paper's +5) (Holm p 0.24) |") in text
    assert "No claims.json of b_smoke on disk" in text
    md.write_text(text)
    assert docs.update(md, runs)[0] == text  # idempotent
    assert main(["--markdown", str(runs / "a_smoke.claims.json")]) == 0
    assert "smaller than the paper's" in capsys.readouterr().out


def test_the_sequential_tables_are_generated_from_sequential_json(tmp_path):
    """A `<!-- sequential: <study> -->` block is rewritten from docs/runs/<study>.sequential.json:
    the design, one row per look, every claim's verdict with the look it was decided at; a record
    of a run that has not reached its last look says so; a missing record is named."""
    from fedpipe.claims import docs

    d = {"looks": [3, 6], "alpha": 0.05, "spending": "OBF", "spending_level_at_alpha": 0.045,
         "z_boundaries_at_alpha": [2.9, 1.8], "nominal_p_at_alpha": [0.002, 0.036]}

    def claim(key, mean, se, status, n_decided, family="paper"):
        return {"key": key, "paper": "P (X 2020)", "family": family, "claim": f"{key} wins",
                "direction": "higher", "n": 6, "mean": mean, "se": se, "df": 5.0,
                "threshold": None, "status": status, "n_decided": n_decided, "t_bound": 2.5,
                "p": 0.01, "nominal_p": 0.02}

    looks = [{"n": 3, "seconds": 100.4, "stages_run": ["plan", "a@2"], "claims": []},
             {"n": 6, "seconds": 250.0, "stages_run": ["plan", "a@3", "a@4", "a@5"],
              "claims": [claim("a", 3.0, 1.5, "held", 3), claim("b", -1.0, 0.5, "not shown", None),
                         claim("c", 0.5, 0.25, "open", None, family="ordering")]}]
    record = {"study": "s", "overrides": ["-S fl.rounds=2"], "design": d, "looks": looks,
              "stopped": "maximum replicates reached", "seconds": 1234.5}
    runs = tmp_path / "runs"
    write_json(runs / "s.sequential.json", record)
    md = tmp_path / "results.md"
    md.write_text("<!-- sequential: s -->\nold\n<!-- /sequential -->\n"
                  "<!-- sequential: t -->\n<!-- /sequential -->\n")
    text, needed = docs.update(md, runs)
    assert needed == ["t (sequential)"] and "old" not in text
    assert "Stopped: maximum replicates reached, after 1,234 s." in text
    assert "| 1 | 3 | 100 | 2 |\n| 2 | 6 | 250 | 4 |" in text
    assert "**P (X 2020)**: 1 of 2 held, 0 contradicted at n = 6." in text
    assert "| a wins | 6 | +3 ± 1.5 | 2.00 | 2.50 | 0.01 | 0.02 | **held** at n = 3 |" in text
    assert "| b wins | 6 | -1 ± 0.5 | -2.00 | 2.50 | 0.01 | 0.02 | not shown at n = 6 |" in text
    assert "**P (X 2020) · orderings among baselines and controls**: 0 of 1 held" in text
    assert "Overrides: `-S fl.rounds=2`." in text
    assert "No sequential record of t on disk" in text
    md.write_text(text)
    assert docs.update(md, runs)[0] == text  # idempotent
    record["stopped"], record["looks"] = None, looks[:1]
    write_json(runs / "s.sequential.json", record)
    assert "still running after look 1 of 2" in docs.update(md, runs)[0]
