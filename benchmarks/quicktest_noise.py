"""QuickTest noise: the sampling noise of FedDDPM+'s QuickTest score against its threshold, and the
false-stop rate it causes.

FedDDPM+ (Peng et al., arXiv 2503.06426, Algorithm 3; ``fedpipe.algorithms.fedddpm.QuickTest``)
scores the global model every ``test_every`` rounds with S = FID of ``test_size`` samples drawn with
``fid.sampler`` (a fresh generator per test) and fires when |AvgScore - S| <= limit, AvgScore being
the EMA (weight gamma) of the earlier scores, before S is added; in fedpipe the limit is relative,
``relative_threshold`` f times AvgScore (docs/papers/fedddpm.md). A firing test stops training.

1. **Score noise.** Loads one trained model of the federate_ddpm stage (default
   ``data/federate_ddpm/fedavg/seed_0/model.safetensors``, with params.yaml's diffusion, fid and
   ``algorithms.fedddpm_plus`` settings and the FID extractor of ``data/fid/``) and draws ``--k``
   QuickTest scores of it exactly as the pipeline's score does (``federate_ddpm.fid_of``), the i-th
   with the generator ``torch_generator(seed, "quicktest-noise", i)``. Prints their mean mu, their
   sample std sigma, the threshold tau = f x mu in FID points and sigma / tau.

2. **False stops**, the scores modelled as S_j = m_j + e_j, m_j a noise-free curve at the tests
   j = 1..n and e_j iid N(0, sigma^2) (sigma the measured one, the same at every level).
   QuickTest fires at test j when it would on S_1..S_j (the EMA of every earlier score, as it holds
   it when it has not fired before); it **stops** at its first firing test. Definitions:

   - *per-test firing probability* p_j: P(QuickTest fires at test j), the rule run on every earlier
     score without stopping (for j = 2 it is also the probability of stopping at test 2);
   - *hazard*: P(it fires at test j | it has not fired before), pooled over the second half of the
     tests (what the stopping run sees once it has gone on that long);
   - *noise-free decision* d_j: whether QuickTest fires at test j on the curve m itself (sigma = 0),
     its EMA following every earlier m_i; the *noise-free stop*: the first j with d_j;
   - *false fire*: the run stops at a test j where d_j is false;
   - **false-stop rate**: P(the run stops before the noise-free stop), a run on a curve whose
     noise-free rule never fires within the tests counting as false whenever it stops at all.

   Closed form of p_j (scores Gaussian, AvgScore > 0): AvgScore before test j is A = sum_i w_i S_i,
   w the EMA's weights (w_1 = (1 - gamma)^(j-2), w_i = gamma (1 - gamma)^(j-1-i) for 2 <= i < j),
   so A ~ N(a, v sigma^2) with a = sum w_i m_i and v = sum w_i^2, independent of S_j. The relative
   rule fires when (1 - f) A <= S_j <= (1 + f) A, hence
   p_j = Phi((c_hi a - m_j) / (sigma sqrt(1 + c_hi^2 v))) - Phi((c_lo a - m_j) / (sigma sqrt(1 + c_lo^2 v)))
   with c_hi = 1 + f, c_lo = 1 - f (the absolute rule: c = 1, the bounds shifted by +-tau).
   The hazard and the stop distribution have no such form (each test conditions on every earlier
   miss); they come from a Monte Carlo run of the ``QuickTest`` class itself along ``--reps`` noisy
   curves, the noise from the numpy streams ``numpy_rng(seed, "quicktest-noise-mc", row)`` ((a) and
   (b), ``row`` the index in ``--deltas``) and ``numpy_rng(seed, "quicktest-noise-curve")`` ((c)),
   which also estimates p_j to check the closed form.

   (a) plateau, x = 0 below; (b) a curve still falling by Delta = x tau per test at every level
   (m_j = mu (1 + x f)^(n - j), reaching mu at the last test; linear for an absolute rule), for x in
   ``--deltas``. The EMA first follows ``--burn-in`` tests (10) of the same curve without firing, as
   in a run that has gone on for a while, and then a QuickTest takes it over (as a resumed run does)
   for the horizon's tests. The noise-free EMA lags the curve by Delta / gamma once settled, so the
   noise-free rule fires on it (at the horizon's first test) iff Delta <= about gamma tau, and never
   otherwise: then every stop is false. p and d are given at the last test, where the curve is at
   the model's level and the lag has settled. The plateau row also gives p at test 2 of a run that
   starts on the plateau (the EMA one score).
   (c) a FedAvg FID curve (``--curve``, a federate_ddpm ``history.csv``; default the one beside the
       model): its FIDs (column ``fid``, else ``test_fid``) interpolated linearly at the test rounds
       within its evaluated rounds (QuickTest's EMA starts at the first of them), rescaled by
       mu / (its last FID) to the score's level, plus noise sigma: the distribution of stop rounds
       against the noise-free stop round, and the false-stop rate. Its last line is
       ``false-stop rate X`` (``n/a`` without a curve). A curve has noise of its own (its FIDs are of
       ``fid.curve_samples`` samples): the noise-free rule is run on it as it is.

The horizon is ``--rounds`` / ``--test-every`` tests, by default the fedddpm_smoke study's (60 rounds,
a test every 2), the smoke's other QuickTest settings being the defaults (test_size 500, DDIM 50
steps). Writes everything to ``--out`` (JSON).

    python benchmarks/quicktest_noise.py [--model PATH] [--params params.yaml] [--k 20]
        [--test-every 2] [--rounds 60] [--curve history.csv] [--reps 20000] [--threads 1]
        [--scores earlier_out.json] [--out data/benchmarks/quicktest_noise.json]

``--scores PATH`` takes the scores of an earlier run's ``--out`` instead of sampling (to analyse
another curve without drawing them again).

``--quick``: in a temporary directory, the FID extractor trained for one epoch and an untrained UNet
(T = 10), 3 scores of 8 DDIM samples (2 steps), a made-up falling curve and 300 Monte Carlo runs: it
checks that the benchmark runs, its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _ddpm_models import add_model_args
from scipy.stats import chi2, norm

from fedpipe.algorithms.fedddpm import QuickTest
from fedpipe.errors import InputError
from fedpipe.io import read_json, read_table, write_json
from fedpipe.rng import numpy_rng

SMOKE_TEST_EVERY, SMOKE_ROUNDS = 2, 60  # conf/study/fedddpm_smoke.yaml
DELTAS = "0,0.2,0.3,0.4,0.5,0.6,0.75,1,1.5,2"
BURN_IN = 10  # (a, b): (1 - gamma)^10 = 0.6% of the first score left in the EMA


# -- the rule and its statistics (no sampling) ------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """QuickTest's settings: EMA weight ``gamma``, ``threshold`` (f when ``relative``, else FID
    points)."""
    gamma: float
    threshold: float
    relative: bool

    def quicktest(self, ema: float | None = None) -> QuickTest:
        return QuickTest(self.gamma, self.threshold, ema, self.relative)

    def tracker(self) -> QuickTest:
        """A QuickTest that never fires (threshold -inf): its EMA follows every score, as QuickTest's
        own does up to its first firing test."""
        return QuickTest(self.gamma, -math.inf, None, False)

    def limit(self, level: float) -> float:
        """The threshold in FID points at AvgScore ``level``."""
        return self.quicktest().limit(level)


def ema_weights(j: int, gamma: float) -> np.ndarray:
    """The weights of scores 1..j-1 in AvgScore before test j (1-based, j >= 2): the first score
    initialises it, each later one enters with weight gamma (Algorithm 3, lines 8 and 11)."""
    w = np.zeros(j - 1)
    w[0] = 1.0
    for i in range(1, j - 1):
        w[:i] *= 1 - gamma
        w[i] = gamma
    return w


def firing_probability(curve: Sequence[float], sigma: float, rule: Rule) -> np.ndarray:
    """Closed form of p_j (module docstring) for tests j = 1..n of the noise-free ``curve`` with iid
    N(0, sigma^2) score noise; p_1 = 0 (the first test only initialises the EMA). With sigma = 0 the
    noise-free decisions as 0/1."""
    m = np.asarray(curve, dtype=float)
    p = np.zeros(len(m))
    c_hi, c_lo, t = ((1 + rule.threshold, 1 - rule.threshold, 0.0) if rule.relative
                     else (1.0, 1.0, rule.threshold))
    for j in range(2, len(m) + 1):
        w = ema_weights(j, rule.gamma)
        a, v, s = float(w @ m[:j - 1]), float(w @ w), m[j - 1]
        hi, lo = c_hi * a + t - s, c_lo * a - t - s  # fires when lo <= noise terms <= hi
        if sigma == 0:
            p[j - 1] = float(lo <= 0 <= hi)
            continue
        p[j - 1] = max(0.0, norm.cdf(hi / (sigma * math.sqrt(1 + c_hi ** 2 * v)))
                       - norm.cdf(lo / (sigma * math.sqrt(1 + c_lo ** 2 * v))))
    return p


def noise_free(curve: Sequence[float], rule: Rule, start: int = 0) -> tuple[np.ndarray, int | None]:
    """(d, stop): QuickTest's decision at every test on ``curve`` itself, its EMA following every
    earlier value, and the 0-based test at which a QuickTest that takes over the EMA at test
    ``start`` (:func:`simulate`) stops (None: never)."""
    tracker, decisions = rule.tracker(), np.zeros(len(curve), dtype=bool)
    for j, x in enumerate(curve):
        decisions[j] = tracker.ema is not None and rule.quicktest(tracker.ema)(x)
        tracker(x)
    tracker = rule.tracker()
    for x in curve[:start]:
        tracker(x)
    quick = rule.quicktest(tracker.ema)
    stop = next((j for j, x in enumerate(curve) if j >= start and quick(x)), None)
    return decisions, stop


@dataclass
class Simulation:
    stops: np.ndarray
    """Per run, the 0-based test at which QuickTest stopped it (-1: it never fired)."""
    fires: np.ndarray
    """Per run and test, whether QuickTest fires there, its EMA following every earlier score."""
    start: int
    """The first test at which a run may stop."""


def simulate(curve: Sequence[float], sigma: float, rule: Rule, reps: int, rng: np.random.Generator,
             start: int = 0) -> Simulation:
    """``reps`` runs of QuickTest along ``curve`` plus iid N(0, sigma^2) noise drawn from ``rng``.
    The tests before ``start`` only feed the EMA (a burn-in: the EMA has followed the curve for a
    while, as in a run that has not stopped yet); at ``start`` one QuickTest per run takes the EMA
    over (as a resumed run does) and stops the run at its first firing test. A never-firing tracker
    and a QuickTest made at each test from the tracker's EMA give the firing at every test without
    stopping."""
    scores = np.asarray(curve, dtype=float)[None, :] + sigma * rng.standard_normal((reps, len(curve)))
    stops = np.full(reps, -1)
    fires = np.zeros(scores.shape, dtype=bool)
    for r, path in enumerate(scores.tolist()):
        tracker, quick = rule.tracker(), None
        for j, s in enumerate(path):
            if j == start:
                quick = rule.quicktest(tracker.ema)
            if j:
                fires[r, j] = rule.quicktest(tracker.ema)(s)
            tracker(s)
            if quick is not None and stops[r] < 0 and quick(s):
                stops[r] = j
    return Simulation(stops, fires, start)


def summarise(curve: Sequence[float], sigma: float, rule: Rule, sim: Simulation) -> dict[str, Any]:
    """The definitions of the module docstring for one curve, over the tests from ``sim.start`` on
    (the horizon): p at its last test (closed form, and Monte Carlo with its standard error), the
    noise-free decision there, the hazard pooled over the horizon's second half, P(stop at its first
    test), P(stop within it), P(false fire), the false-stop rate, the median stop test and the
    noise-free stop (tests 1-based and counted from the horizon's first test in the result)."""
    n, reps, start = len(curve), len(sim.stops), sim.start
    decisions, nf_stop = noise_free(curve, rule, start)
    p_cf = firing_probability(curve, sigma, rule)
    p_mc = sim.fires.mean(axis=0)
    stopped = sim.stops >= 0
    half = range(start + (n - start) // 2, n)
    at_risk = sum(int(np.sum((sim.stops < 0) | (sim.stops >= j))) for j in half)
    hazard = int(np.sum(sim.stops >= half.start)) / at_risk if at_risk else float("nan")
    false_fire = stopped & ~decisions[np.where(stopped, sim.stops, 0)]
    early = stopped & (sim.stops < (n if nf_stop is None else nf_stop))
    first = max(start, 1)  # the first test with an EMA to compare with
    last = n - 1
    return {"tests": n - start, "burn_in_tests": start, "reps": reps, "sigma": sigma,
            "noise_free_stop_test": None if nf_stop is None else nf_stop - start + 1,
            "noise_free_fires_at_last": bool(decisions[last]),
            "p_closed_form": float(p_cf[last]), "p_monte_carlo": float(p_mc[last]),
            "p_monte_carlo_se": math.sqrt(max(p_mc[last] * (1 - p_mc[last]), 1e-12) / reps),
            "p_false_fire_per_test": 0.0 if decisions[last] else float(p_cf[last]),
            "hazard_second_half": hazard, "p_stop_first_test": float(np.mean(sim.stops == start)),
            "p_stop": float(stopped.mean()),
            "median_stop_test": (float(np.median(sim.stops[stopped]) - start + 1) if stopped.any()
                                 else None),
            "p_false_fire": float(false_fire.mean()), "false_stop_rate": float(early.mean()),
            "false_stop_rate_first_comparison": float(np.mean(early & (sim.stops == first))),
            "p_closed_form_all": p_cf[start:].tolist(), "p_monte_carlo_all": p_mc[start:].tolist()}


def falling_curve(level: float, x: float, tests: int, rule: Rule) -> list[float]:
    """A curve reaching ``level`` at the last of ``tests`` tests and falling by ``x`` thresholds per
    test at every level: geometric for a relative rule (each value x f of the next one above it),
    linear for an absolute one."""
    if rule.relative:
        return [level * (1 + x * rule.threshold) ** (tests - 1 - j) for j in range(tests)]
    return [level + x * rule.threshold * (tests - 1 - j) for j in range(tests)]


def curve_at_tests(path: Path, column: str | None, test_every: int) -> tuple[str, np.ndarray,
                                                                              np.ndarray]:
    """(column, test rounds, FIDs) of a federate_ddpm ``history.csv``: ``column`` (default ``fid``,
    else ``test_fid``) interpolated linearly at the multiples of ``test_every`` within its evaluated
    rounds. Bad input: SystemExit with one line."""
    try:
        rows = read_table(path, "federate_ddpm")
    except InputError as e:
        raise SystemExit(f"error: --curve: {e}") from None
    names = set().union(*rows)
    col = column or next((c for c in ("fid", "test_fid") if c in names), None)
    if "round" not in names or col not in names:
        raise SystemExit(f"error: --curve {path}: needs columns round and {column or 'fid or test_fid'}"
                         f", has {', '.join(sorted(names))}")
    points = sorted((r["round"], r[col]) for r in rows if col in r and "round" in r)
    rounds, fids = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    tests = np.arange(math.ceil(rounds[0] / test_every) * test_every, rounds[-1] + 1, test_every)
    if len(tests) < 2 or not np.isfinite(fids).all():
        raise SystemExit(f"error: --curve {path}: needs finite FIDs at two test rounds or more "
                         f"(multiples of {test_every}) within its rounds {rounds.tolist()}")
    return col, tests, np.interp(tests, rounds, fids)


# -- the benchmark ------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(ap)
    ap.add_argument("--k", type=int, default=20, help="QuickTest scores to draw (>= 2)")
    ap.add_argument("--test-size", type=int, default=None,
                    help="samples per score (default: algorithms.fedddpm_plus.test_size)")
    ap.add_argument("--test-every", type=int, default=SMOKE_TEST_EVERY, help="rounds between tests")
    ap.add_argument("--rounds", type=int, default=SMOKE_ROUNDS, help="rounds of the horizon")
    ap.add_argument("--deltas", default=DELTAS, help="(a, b): slopes in thresholds per test")
    ap.add_argument("--burn-in", type=int, default=BURN_IN,
                    help="(a, b): tests that only feed the EMA before the horizon's")
    ap.add_argument("--curve", type=Path, default=None,
                    help="(c): a federate_ddpm history.csv (default: the model's own, if any)")
    ap.add_argument("--curve-column", default=None, help="its FID column (default fid, else test_fid)")
    ap.add_argument("--reps", type=int, default=20000, help="Monte Carlo runs per row (>= 100)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the score and Monte Carlo streams")
    ap.add_argument("--scores", type=Path, default=None,
                    help="take the scores of an earlier --out JSON instead of sampling")
    ap.add_argument("--out", type=Path, default=Path("data/benchmarks/quicktest_noise.json"))
    ap.add_argument("--quick", action="store_true",
                    help="tiny inputs in a temporary directory; 3 scores of 8 samples, 300 runs")
    args = ap.parse_args()
    if args.quick:
        args.k, args.test_size, args.reps, args.rounds = 3, 8, 300, 20
    with quick_inputs(args) if args.quick else contextlib.nullcontext():
        run(args)


@contextlib.contextmanager
def quick_inputs(args):
    """A temporary working directory with the FID extractor (1 epoch), an untrained UNet at
    ``args.model`` and a made-up FID curve beside it."""
    from _ddpm_models import tiny_models
    from _quick import note

    with tiny_models((args.model,), args.fid_dir, "bench-quicktest-noise"):
        rounds = range(2, args.rounds + 1, 2)
        (args.model.parent / "history.csv").write_text(
            "round,test_fid\n" + "".join(f"{r}.0,{100 + 300 / r:.4f}\n" for r in rounds))
        note("inputs built in a temporary directory: a 1-epoch FID classifier, an untrained UNet "
             "(T = 10), a made-up curve; CPU")
        yield


def sigma_interval(sigma: float, k: int) -> tuple[float, float]:
    """The 95% interval of the std of normal scores from the sample std ``sigma`` of ``k`` (chi-square
    with k - 1 degrees of freedom)."""
    return (sigma * math.sqrt((k - 1) / chi2.ppf(0.975, k - 1)),
            sigma * math.sqrt((k - 1) / chi2.ppf(0.025, k - 1)))


def fmt(x: float) -> str:
    """A probability with 3 decimals, ``-`` for NaN (no run left at risk)."""
    return "-" if math.isnan(x) else f"{x:.3f}"


def parse_deltas(text: str) -> list[float]:
    try:
        deltas = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        deltas = []
    if not deltas or not all(math.isfinite(x) and x >= 0 for x in deltas):
        raise SystemExit(f"error: --deltas must be comma-separated numbers >= 0, got {text!r}")
    return deltas


def draw_scores(args, test_size: int) -> dict[str, Any]:
    """``args.k`` QuickTest scores of the model (the pipeline's score, fresh generators)."""
    import torch
    from _ddpm_models import load_models

    from fedpipe.pipeline.federate_ddpm import fid_of
    from fedpipe.rng import torch_generator

    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_models([args.model], args.params, args.fid_dir)
    cfg = loaded.cfg
    score = fid_of(loaded.task, loaded.tools, cfg, loaded.class_counts)  # FedDDPM+'s round score
    t0 = time.perf_counter()
    scores = [score(loaded.models[0], test_size,
                    torch_generator(args.seed, "quicktest-noise", i, device=loaded.device))
              for i in range(args.k)]
    return {"scores": scores, "seconds": time.perf_counter() - t0, "extractor": loaded.tools.fid.name,
            "sampler": cfg.fid.sampler, "ddim_steps": cfg.fid.ddim_steps, "device": str(loaded.device),
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def run(args) -> None:
    from fedpipe.config import load_params
    from fedpipe.pipeline.federate_ddpm import ddpm_train_config

    deltas = parse_deltas(args.deltas)
    tests = args.rounds // args.test_every if args.test_every >= 1 else 0
    if args.k < 2 or args.reps < 100 or tests < 2 or args.burn_in < 0:
        raise SystemExit("error: --k must be >= 2, --reps >= 100, --burn-in >= 0, --test-every >= 1 "
                         "and --rounds at least 2 tests' worth")
    if not args.params.is_file():
        raise SystemExit(f"error: missing {args.params}")
    plus = ddpm_train_config(load_params(args.params), "fedddpm_plus").algo_cfg
    relative = plus.relative_threshold is not None
    rule = Rule(plus.gamma, plus.relative_threshold if relative else plus.threshold, relative)
    test_size = args.test_size or plus.test_size
    curve_path = args.curve or (args.model.parent / "history.csv")
    if args.curve is None and not curve_path.is_file():
        curve_path = None
    curve = curve_at_tests(curve_path, args.curve_column, args.test_every) if curve_path else None
    if args.scores:  # before any sampling: its scores, from an earlier run
        try:
            drawn = read_json(args.scores)
            drawn["scores"] = [float(s) for s in drawn["scores"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"error: --scores {args.scores}: not a quicktest_noise JSON ({e})") from None
    else:
        drawn = draw_scores(args, test_size)
    scores = np.asarray(drawn["scores"])
    if len(scores) < 2 or not np.isfinite(scores).all():
        raise SystemExit(f"error: need 2 finite scores or more, got {scores.tolist()}")
    mu, sigma = float(scores.mean()), float(scores.std(ddof=1))
    sigma_ci = sigma_interval(sigma, len(scores))
    tau = rule.limit(mu)
    print(f"{args.model}: {len(scores)} QuickTest scores ({test_size} samples, {drawn.get('sampler')} "
          f"sampler, {drawn.get('extractor')}, {drawn.get('device')}, {drawn.get('seconds', 0):.0f} s"
          f"{', from ' + str(args.scores) if args.scores else ''})")
    print(f"  mean {mu:.3f}  std sigma {sigma:.3f}  threshold {'f x mean' if relative else ''} "
          f"tau {tau:.3f}  sigma/tau {sigma / tau if tau else math.inf:.3f}  (sigma's 95% interval "
          f"{sigma_ci[0]:.3f}-{sigma_ci[1]:.3f})")
    print("  scores: " + " ".join(f"{s:.2f}" for s in scores))
    print(f"QuickTest: gamma {rule.gamma}, {'relative' if relative else 'absolute'} threshold "
          f"{rule.threshold}, a test every {args.test_every} rounds, {tests} tests in {args.rounds} "
          f"rounds; {args.reps} Monte Carlo runs a row")

    rows = []
    print(f"(a) plateau (x = 0) and (b) a curve falling by Delta = x tau per test, its EMA settled over "
          f"{args.burn_in} earlier tests; per test, at the mean's level: the noise-free decision, p "
          f"(closed form / Monte Carlo), p of a false fire; over the {tests} tests:")
    print(f"{'x':>5} {'nf fires':>8} {'p cf':>6} {'p mc':>6} {'p false':>7} {'hazard':>6} "
          f"{'P(stop 1st)':>11} {'P(stop)':>7} {'P(false fire)':>13} {'false-stop':>10}")
    for i, x in enumerate(deltas):
        m = falling_curve(mu, x, args.burn_in + tests, rule)
        sim = simulate(m, sigma, rule, args.reps, numpy_rng(args.seed, "quicktest-noise-mc", i),
                       args.burn_in)
        res = summarise(m, sigma, rule, sim)
        row = {"delta_thresholds": x, "delta_fid_at_mean": x * tau, **res}
        if x == 0 and args.burn_in:  # a plateau from the first test on: test 2, the EMA one score
            row["p_test2_closed_form"] = float(firing_probability(m[:2], sigma, rule)[1])
            row["p_test2_monte_carlo"] = float(sim.fires[:, 1].mean())
        rows.append(row)
        print(f"{x:>5.2f} {'yes' if res['noise_free_fires_at_last'] else 'no':>8} "
              f"{res['p_closed_form']:>6.3f} {res['p_monte_carlo']:>6.3f} "
              f"{res['p_false_fire_per_test']:>7.3f} {fmt(res['hazard_second_half']):>6} "
              f"{res['p_stop_first_test']:>11.3f} {res['p_stop']:>7.3f} {res['p_false_fire']:>13.3f} "
              f"{res['false_stop_rate']:>10.3f}")
    plateau = next((r for r in rows if "p_test2_closed_form" in r), None)
    if plateau:
        print(f"  plateau from the first test on: p at test 2 (the EMA one score) "
              f"{plateau['p_test2_closed_form']:.3f} / {plateau['p_test2_monte_carlo']:.3f}")

    result_c = None
    if curve is not None:
        col, rounds, fids = curve
        scale = mu / fids[-1]
        m = (fids * scale).tolist()
        sim = simulate(m, sigma, rule, args.reps, numpy_rng(args.seed, "quicktest-noise-curve"))
        res = summarise(m, sigma, rule, sim)
        nf = res["noise_free_stop_test"]
        nf_round = None if nf is None else int(rounds[nf - 1])
        sim_rounds = stop_round_distribution(sim, rounds)
        at_ci = [summarise(m, sg, rule, simulate(m, sg, rule, args.reps, numpy_rng(
            args.seed, "quicktest-noise-curve")))["false_stop_rate"] for sg in sigma_ci]
        result_c = {"curve": str(curve_path), "column": col, "test_rounds": rounds.tolist(),
                    "curve_at_tests": fids.tolist(), "scale": scale, "noise_free_stop_round": nf_round,
                    **res, **sim_rounds, "false_stop_rate_at_sigma_interval": at_ci}
        print(f"(c) {curve_path} ({col}) at the {len(rounds)} test rounds {int(rounds[0])}-"
              f"{int(rounds[-1])}, x{scale:.3f} to the score level: "
              + " ".join(f"{v:.1f}" for v in m))
        print(f"  noise-free rule: {'never fires' if nf_round is None else f'stops after round {nf_round}'}"
              f"; with noise: stops in {res['p_stop']:.1%} of runs, stop round quantiles 10/50/90% "
              f"{sim_rounds['stop_round_quantiles']}, earliest {sim_rounds['stop_round_min']}")
        first = int(rounds[1])
        print(f"  false-stop rate {res['false_stop_rate']:.4f}, of which "
              f"{res['false_stop_rate_first_comparison']:.4f} at round {first} (the first comparison: "
              f"the EMA holds one score, so it lags the curve by one test's fall, not 1 / gamma of it); "
              f"{at_ci[0]:.4f} / {at_ci[1]:.4f} at the ends of sigma's interval")
        print("  stop rounds (share of runs): " + ", ".join(
            f"{r}: {s:.3f}" for r, s in sim_rounds["stop_round_shares"].items() if s >= 0.001))
    write_json(args.out, {"model": str(args.model), "params": str(args.params), **drawn,
                          "test_size": test_size, "mean": mu, "sigma": sigma, "threshold_fid": tau,
                          "sigma_over_threshold": sigma / tau if tau else None,
                          "sigma_interval_95": list(sigma_ci),
                          "rule": {"gamma": rule.gamma, "threshold": rule.threshold,
                                   "relative": rule.relative, "test_every": args.test_every,
                                   "rounds": args.rounds, "tests": tests},
                          "falling": rows, "curve": result_c, "seed": args.seed, "reps": args.reps})
    print(f"wrote {args.out}")
    print("false-stop rate " + ("n/a (no --curve)" if result_c is None
                                else f"{result_c['false_stop_rate']:.4f}"))


def stop_round_distribution(sim: Simulation, rounds: np.ndarray) -> dict[str, Any]:
    """The stop rounds of ``sim``'s runs, test j stopping after round ``rounds[j]``: the share of
    runs per round (and ``never``), their 10/50/90% quantiles and the earliest."""
    stopped = sim.stops[sim.stops >= 0]
    at = rounds[stopped].astype(int)
    shares = {str(int(r)): float(np.mean(sim.stops == j)) for j, r in enumerate(rounds)}
    shares["never"] = float(np.mean(sim.stops < 0))
    return {"stop_round_shares": shares,
            "stop_round_quantiles": ([int(q) for q in np.quantile(at, [0.1, 0.5, 0.9],
                                                                  method="inverted_cdf")]
                                     if len(at) else None),
            "stop_round_min": int(at.min()) if len(at) else None}


if __name__ == "__main__":
    main()
