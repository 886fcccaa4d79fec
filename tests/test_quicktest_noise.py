"""benchmarks/quicktest_noise.py's statistics of FedDDPM+'s QuickTest under score noise (no sampling
here; the benchmark's --quick run is in test_benchmarks.py): the closed-form firing probability
against a Monte Carlo run of the QuickTest class itself, and hand-computed cases."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from quicktest_noise import (  # noqa: E402
    Rule,
    curve_at_tests,
    ema_weights,
    falling_curve,
    firing_probability,
    noise_free,
    parse_deltas,
    sigma_interval,
    simulate,
    summarise,
)

from fedpipe.rng import numpy_rng  # noqa: E402

SMOKE = Rule(gamma=0.4, threshold=0.0344, relative=True)  # params.yaml's fedddpm_plus


def within(p_cf: float, p_mc: float, reps: int) -> bool:
    """The closed form within 4 Monte Carlo standard errors (and a floor for p near 0 or 1)."""
    return abs(p_cf - p_mc) <= 4 * np.sqrt(max(p_cf * (1 - p_cf), 1e-4) / reps)


@pytest.mark.parametrize("sigma", [1.0, 2.5, 6.0])  # sigma / tau = 0.29, 0.73, 1.74 at the level 100
def test_closed_form_plateau_firing_matches_the_quicktest_class(sigma):
    reps, curve = 4000, [100.0] * 12
    sim = simulate(curve, sigma, SMOKE, reps, numpy_rng(0, "test-quicktest-noise", int(sigma * 10)))
    p_cf, p_mc = firing_probability(curve, sigma, SMOKE), sim.fires.mean(axis=0)
    assert p_cf[0] == 0 and not sim.fires[:, 0].any()  # the first test only initialises the EMA
    for j in (1, 2, 11):  # test 2 (the EMA one score), test 3, settled
        assert within(p_cf[j], p_mc[j], reps), (j, p_cf[j], p_mc[j])
    assert 0.05 < p_cf[11] < 0.999  # a case where the check can fail
    # the stopping run starts as the per-test firing does: P(stop at test 2) = p_2
    assert within(p_cf[1], float(np.mean(sim.stops == 1)), reps)
    assert p_cf[11] > p_cf[1]  # the settled EMA is less noisy than one score


def test_closed_form_falling_curve_matches_the_quicktest_class():
    reps, curve = 4000, falling_curve(100.0, 0.5, 20, SMOKE)
    sim = simulate(curve, 1.5, SMOKE, reps, numpy_rng(0, "test-quicktest-noise", 99), start=10)
    p_cf, p_mc = firing_probability(curve, 1.5, SMOKE), sim.fires.mean(axis=0)
    assert 0.05 < p_cf[-1] < 0.95
    assert all(within(p_cf[j], p_mc[j], reps) for j in (1, 5, 19))
    assert (sim.stops < 0).sum() + (sim.stops >= 10).sum() == reps  # no stop in the burn-in


def test_hand_computed_decisions_and_sigma_zero():
    # gamma 0.4, f 0.1: test 2 |100 - 80| = 20 > 10; EMA 0.4 80 + 0.6 100 = 92; test 3 |92 - 75| = 17
    # > 9.2; EMA 85.2; test 4 |85.2 - 84| = 1.2 <= 8.52: fires
    rule, curve = Rule(0.4, 0.1, True), [100.0, 80.0, 75.0, 84.0]
    np.testing.assert_allclose(ema_weights(4, 0.4) @ np.array(curve[:3]), 85.2)
    decisions, stop = noise_free(curve, rule)
    assert decisions.tolist() == [False, False, False, True] and stop == 3
    assert firing_probability(curve, 0.0, rule).tolist() == [0.0, 0.0, 0.0, 1.0]
    sim = simulate(curve, 0.0, rule, 50, numpy_rng(0, "test-quicktest-noise", 1))
    assert (sim.stops == 3).all() and sim.fires[:, 3].all() and not sim.fires[:, :3].any()
    res = summarise(curve, 0.0, rule, sim)
    assert res["noise_free_stop_test"] == 4 and res["false_stop_rate"] == 0 == res["p_false_fire"]


@pytest.mark.parametrize("rule", [Rule(0.4, 5.0, True), Rule(0.4, 1e9, False)])
def test_a_huge_threshold_always_stops_at_the_second_test(rule):
    curve = [200.0, 150.0, 120.0, 100.0]
    sim = simulate(curve, 5.0, rule, 200, numpy_rng(0, "test-quicktest-noise", 2))
    assert (sim.stops == 1).all()
    assert firing_probability(curve, 5.0, rule)[1] == pytest.approx(1.0)


def test_settled_lag_decides_a_falling_curve():
    # absolute threshold tau = 2, linear fall Delta: the noise-free EMA lags by Delta at test 2 and by
    # Delta / gamma = 2.5 Delta once settled, so it fires there iff Delta <= 0.4 tau
    rule = Rule(0.4, 2.0, False)
    for x, fires in ((0.3, True), (0.5, False)):
        curve = falling_curve(100.0, x, 40, rule)
        assert np.allclose(-np.diff(curve), x * 2.0)
        decisions, stop = noise_free(curve, rule, start=20)
        assert bool(decisions[-1]) is fires
        assert stop == (20 if fires else None)
    # with noise, every stop on the never-firing curve is a false stop
    curve = falling_curve(100.0, 0.5, 40, rule)
    res = summarise(curve, 0.8, rule, simulate(curve, 0.8, rule, 500,
                                               numpy_rng(0, "test-quicktest-noise", 3), start=20))
    assert res["noise_free_stop_test"] is None and res["tests"] == 20
    assert res["false_stop_rate"] == res["p_stop"] == res["p_false_fire"] > 0
    assert 0 < res["false_stop_rate_first_comparison"] < res["false_stop_rate"]
    assert res["false_stop_rate_first_comparison"] == res["p_stop_first_test"]


def test_curve_read_at_the_test_rounds(tmp_path):
    path = tmp_path / "history.csv"
    path.write_text("round,train_loss,test_fid\n1.0,0.5,\n5.0,0.3,200.0\n10.0,0.2,100.0\n"
                    "11.0,0.2,\n15.0,0.1,90.0\n")
    col, rounds, fids = curve_at_tests(path, None, 2)
    assert col == "test_fid" and rounds.tolist() == [6, 8, 10, 12, 14]
    np.testing.assert_allclose(fids, [180, 140, 100, 96, 92])
    with pytest.raises(SystemExit, match="needs columns round and fid"):
        curve_at_tests(path, "fid", 2)
    with pytest.raises(SystemExit, match="missing"):
        curve_at_tests(tmp_path / "none.csv", None, 2)
    with pytest.raises(SystemExit, match="two test rounds"):
        curve_at_tests(path, None, 20)


def test_bad_deltas_are_one_line():
    assert parse_deltas("0, 0.5,2") == [0.0, 0.5, 2.0]
    for bad in ("", "a", "-1", "nan"):
        with pytest.raises(SystemExit, match="--deltas"):
            parse_deltas(bad)


def test_sigma_interval():
    lo, hi = sigma_interval(3.512, 20)  # chi-square 19 df: 8.907 and 32.852
    assert lo == pytest.approx(3.512 * (19 / 32.852) ** 0.5, rel=1e-4)
    assert hi == pytest.approx(3.512 * (19 / 8.907) ** 0.5, rel=1e-4)
