"""Claims: each paper's headline claims, encoded as checks on a study's numbers and judged over the
study's replicates (the rule and what it can show: docs/claims.md).

A :class:`Claim` compares two arms of one track (``diffusion`` or ``classification``) on one metric:
the method's value is ``lower`` or ``higher`` than the baseline's, it ``match``-es the baseline's
within a relative tolerance, or it is ``at_least`` the baseline's less a relative tolerance (a
non-inferiority claim: "on par or better"). Each paper's claims live in one module of this package
(``fedddpm``, ``baselines``, ...) with ``KEY`` (the name ``study.papers`` uses), ``PAPER``, ``ARMS`` and
``claims(study) -> list[Claim]``; a later paper adds its module to :data:`MODULES`. A claim is
encoded as the paper states it; the numbers decide whether it holds here. A study judges the claims
of its own papers only (``study.papers``, or the papers whose arms it runs: :func:`study_papers`).

The rule (:func:`judge_all`)
----------------------------
A claim is judged over at least ``MIN_SEEDS = 3`` replicates (``study.seeds``), never fewer.

- ``d`` is the difference in the claimed direction: ``baseline - method`` for ``lower``,
  ``method - baseline`` for ``higher``, ``at_least`` and ``match`` (signed: FedDDPM+ FID - FedDDPM FID).
- **Paired** (the arms share at least 3 replicates, or have exactly the same ones): ``d_s`` per shared
  replicate, ``mean = mean(d_s)``, ``SE = std(d_s, ddof=1) / sqrt(n)``, ``df = n - 1``.
- **Welch** (otherwise; each arm needs at least 3): ``mean = mean_m - mean_b`` (signed as above),
  ``SE = sqrt(s_m^2 / n_m + s_b^2 / n_b)``, Welch-Satterthwaite ``df``.
- ``lower`` / ``higher``: one-sided t-test of "no difference" (``p = P(T_df >= mean / SE)``, the same
  p-value as ``scipy.stats.ttest_rel`` / ``ttest_ind(equal_var=False)`` with ``alternative=``);
  the opposite direction's p-value is ``1 - p``.
- ``match``: two one-sided tests (TOST) with the margin ``delta = tolerance * |mean of the
  baseline|``: ``p = max(P(T >= (mean + delta) / SE), P(T <= (mean - delta) / SE))``. Its opposite,
  "the difference is outside the margin", has ``p = 2 min(P(T >= (mean - delta) / SE),
  P(T <= (mean + delta) / SE))`` (both sides, Bonferroni).
- ``at_least``: one-sided test of "the method is worse by the margin or more" with ``delta =
  tolerance * |mean of the baseline|``: ``p = P(T >= (mean + delta) / SE)`` (the one-sided t-test
  of ``d + delta``; a non-inferiority test); its opposite, "worse by more than the margin", has
  ``p = 1 - p``.
- **Holm**: the p-values of the claims judged for one paper in one study (k of them) are Holm-adjusted
  (``p_(i)`` times ``k - i + 1``, made monotone); the opposite-direction p-values likewise.
- Verdicts: ``held`` (Holm-adjusted p <= ALPHA = 0.05); ``contradicted`` (the opposite test's
  Holm-adjusted p <= ALPHA); ``not shown`` (neither); ``not judged`` (fewer than 3 replicates, or a
  non-finite value); ``not evaluated`` (an arm, or its metric, is not in this study).
- **SE = 0** (every replicate gives the same difference, ties included): no test is possible, the
  claim is ``not shown`` and left out of its paper's Holm family; it never holds by itself. A
  property that is constant by construction is a :attr:`Claim.fact` instead.

Facts (``Claim(..., fact=True)``): deterministic properties (a parameter count, a trainable share, an
NMI that is 1 on every replicate); :func:`judge_fact` reports ``true`` when the relation holds on
every replicate (``false`` otherwise, ``not evaluated`` with an arm missing). Facts are listed beside
the claims and never counted among them.

Outputs: :func:`claims_metrics` is the content of ``data/report/claims.json``: ``summary`` (counts
per status), ``papers`` (the counts per paper), ``held`` (claim key -> bool, one column per claim in
``dvc metrics show`` / ``dvc exp show``), ``facts`` (fact key -> bool), ``claims`` and
``fact_records`` (the records). DVC's metrics reader drops lists, hence the mappings.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from scipy import stats

from fedpipe.config.fl import PAPER_KEYS  # the names study.papers takes, one module each

if TYPE_CHECKING:
    from fedpipe.config.fl import StudyConfig

MIN_SEEDS = 3
SE_ZERO = 1e-12
"""An SE below this fraction of the largest value is 0 (a constant difference up to rounding)."""
ALPHA = 0.05
TRACKS = ("diffusion", "classification")
DIRECTIONS = ("lower", "higher", "match", "at_least")
STATUSES = ("held", "not shown", "contradicted", "not judged", "not evaluated")
FACT_STATUSES = ("true", "false", "not evaluated")
MARGINED = ("match", "at_least")
"""The directions whose test has a margin (``Claim.tolerance``, relative to the baseline's mean)."""
OPS = {"lower": "lt", "higher": "gt", "match": "match", "at_least": "ge"}

RULE = ("Each claim is judged over ≥ 3 replicates (study.seeds): d = the difference in the claimed "
        "direction, paired by replicate where both arms share them (SE = std(d)/√n, df = n − 1), "
        "otherwise Welch (SE = √(s²ₘ/nₘ + s²ᵦ/nᵦ), Welch–Satterthwaite df). A lower/higher claim "
        "holds when the one-sided t-test rejects \"no difference\" at α = 0.05 after a Holm "
        "correction over the paper's judged claims in this study; a match claim holds when the "
        "equivalence test (two one-sided tests, the paper's tolerance as margin) does, at the same "
        "level; an at-least (\"on par or better\") claim when the one-sided test rejects \"worse "
        "by the margin or more\". Contradicted: the opposite test is significant at that level; not "
        "shown: neither. "
        "SE = 0 (no spread over replicates) is never a test: not shown. Fewer than 3 replicates: "
        "not judged; an arm missing from the study: not evaluated.")

Direction = Literal["lower", "higher", "match", "at_least"]
Track = Literal["diffusion", "classification"]
Values = Mapping[str, Mapping[Any, float]]  # {algorithm: {seed: value}}


@dataclass(frozen=True)
class Claim:
    """One headline claim: ``method``'s ``metric`` is ``direction`` than ``baseline``'s.

    ``paper`` names who claims it (its first word is the paper's key, e.g. ``"FedDDPM (Peng et al.
    2025)"``); ``text`` is the claim as the paper states it; ``source`` where (table, column and the
    paper's numbers). ``tolerance`` (``match`` and ``at_least`` only) is relative to the baseline's
    mean. ``fact``: a deterministic property, reported beside the claims and never counted as one
    (:func:`judge_fact`).
    """

    paper: str
    text: str
    track: Track
    metric: str
    method: str
    baseline: str
    direction: Direction
    source: str = ""
    tolerance: float | None = None
    reference: float | None = None
    """A constant baseline (Equitable-FL's "NMI close to 1"): the baseline arm is this value at every
    seed of the method (so the test is paired), and ``baseline`` only names it."""
    fact: bool = False

    def __post_init__(self) -> None:
        if self.track not in TRACKS:
            raise ValueError(f"claim {self.text!r}: track {self.track!r} not in {TRACKS}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"claim {self.text!r}: direction {self.direction!r} not in {DIRECTIONS}")
        if (self.direction in MARGINED) != (self.tolerance is not None):
            raise ValueError(f"claim {self.text!r}: a tolerance goes with directions {MARGINED} "
                             "only, and they need one")
        if self.tolerance is not None and not self.tolerance > 0:
            raise ValueError(f"claim {self.text!r}: tolerance must be > 0, got {self.tolerance}")
        if self.method == self.baseline:
            raise ValueError(f"claim {self.text!r}: method and baseline are both {self.method!r}")

    @property
    def key(self) -> str:
        """A stable id, usable as a DVC metrics key and an MLflow metric name:
        ``<paper>/<metric>/<method>-<lt|gt|match>-<baseline>``."""
        paper = re.sub(r"[^a-z0-9]+", "", self.paper.split()[0].lower()) or "paper"
        return f"{paper}/{self.metric}/{self.method}-{OPS[self.direction]}-{self.baseline}"


@dataclass(frozen=True)
class ClaimResult:
    """The verdict on one claim (or fact), with the numbers behind it (replicates as strings, in
    order). ``p`` / ``p_opposite``: one-sided p-values of the claim and of its opposite; ``p_holm`` /
    ``p_opposite_holm``: Holm-adjusted over the paper's ``family`` judged claims."""

    claim: Claim
    status: str
    method_values: dict[str, float] = field(default_factory=dict)
    baseline_values: dict[str, float] = field(default_factory=dict)
    mean_diff: float | None = None
    se: float | None = None
    n: int = 0
    test: str | None = None  # "paired" | "welch"
    threshold: float | None = None  # match / at_least claims: the absolute margin
    reason: str = ""
    df: float | None = None
    p: float | None = None
    p_opposite: float | None = None
    p_holm: float | None = None
    p_opposite_holm: float | None = None
    family: int = 0

    @property
    def held(self) -> bool:
        return self.status in ("held", "true")

    @property
    def ci(self) -> tuple[float, float] | None:
        """The 95% t-interval of the mean difference (None without a test)."""
        if self.mean_diff is None or not self.se or self.df is None:
            return None
        h = float(stats.t.ppf(0.975, self.df)) * self.se
        return self.mean_diff - h, self.mean_diff + h


# -- the statistics, vectorised (the simulation tests call these on arrays of draws) ----------------
def paired_stats(d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, SE, df) of the differences ``d`` along the last axis."""
    d = np.asarray(d, dtype=np.float64)
    n = d.shape[-1]
    return d.mean(-1), d.std(-1, ddof=1) / math.sqrt(n), np.full(d.shape[:-1], n - 1.0)


def welch_stats(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean(a) - mean(b), Welch's SE, Welch-Satterthwaite df) along the last axis."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    va, vb = a.var(-1, ddof=1) / a.shape[-1], b.var(-1, ddof=1) / b.shape[-1]
    se2 = va + vb
    with np.errstate(invalid="ignore", divide="ignore"):
        df = se2 ** 2 / (va ** 2 / (a.shape[-1] - 1) + vb ** 2 / (b.shape[-1] - 1))
    return a.mean(-1) - b.mean(-1), np.sqrt(se2), df


def directional_p(mean, se, df) -> tuple[np.ndarray, np.ndarray]:
    """One-sided p-values of "mean > 0" and of "mean < 0" (1 and 1 where SE = 0: no test)."""
    mean, se, df = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (mean, se, df)))
    ok = se > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(ok, mean / np.where(ok, se, 1.0), 0.0)
    dfs = np.where(ok, df, 1.0)
    return np.where(ok, stats.t.sf(t, dfs), 1.0), np.where(ok, stats.t.cdf(t, dfs), 1.0)


def equivalence_p(mean, se, df, margin) -> tuple[np.ndarray, np.ndarray]:
    """TOST p-value of "|mean| < margin", and the p-value of "|mean| > margin" (both sides,
    Bonferroni); 1 and 1 where SE = 0."""
    mean, se, df, margin = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64)
                                                 for x in (mean, se, df, margin)))
    ok = se > 0
    s, dfs = np.where(ok, se, 1.0), np.where(ok, df, 1.0)
    above_low = stats.t.sf((mean + margin) / s, dfs)  # H0: mean <= -margin
    below_high = stats.t.cdf((mean - margin) / s, dfs)  # H0: mean >= margin
    outside = np.minimum(1.0, 2 * np.minimum(stats.t.sf((mean - margin) / s, dfs),
                                             stats.t.cdf((mean + margin) / s, dfs)))
    return np.where(ok, np.maximum(above_low, below_high), 1.0), np.where(ok, outside, 1.0)


def holm(p: np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values along the last axis (NaN entries are not in the family)."""
    p = np.asarray(p, dtype=np.float64)
    k = np.sum(~np.isnan(p), axis=-1, keepdims=True)
    order = np.argsort(np.where(np.isnan(p), np.inf, p), axis=-1)
    sorted_p = np.take_along_axis(p, order, -1)
    rank = np.arange(p.shape[-1])
    adj = np.minimum(1.0, np.maximum.accumulate(np.where(np.isnan(sorted_p), 0.0,
                                                         (k - rank) * sorted_p), axis=-1))
    adj = np.where(np.isnan(sorted_p), np.nan, adj)
    out = np.empty_like(adj)
    np.put_along_axis(out, order, adj, -1)
    return out


def verdicts(p: np.ndarray, p_opposite: np.ndarray, alpha: float = ALPHA) -> np.ndarray:
    """Per claim (last axis = the paper's family; NaN = not in it): "held" / "contradicted" /
    "not shown" from the Holm-adjusted p-values of the claim and of its opposite."""
    held, contra = holm(p) <= alpha, holm(p_opposite) <= alpha
    return np.where(held, "held", np.where(contra, "contradicted", "not shown"))


def min_detectable_t(n: int, k: int = 1, alpha: float = ALPHA) -> float:
    """The smallest mean / SE that holds with ``n`` paired replicates as the first Holm step of ``k``
    judged claims (level alpha / k); k = 1: alone, or the last step once the others held."""
    return float(stats.t.isf(alpha / k, n - 1))


def power(effect: float, n: int, k: int = 1, alpha: float = ALPHA) -> float:
    """Probability that a paired directional claim holds at level alpha / k when the true mean
    difference is ``effect`` standard deviations of one replicate's difference (noncentral t)."""
    return float(stats.nct.sf(min_detectable_t(n, k, alpha), n - 1, effect * math.sqrt(n)))


def effect_for_power(target: float, n: int, k: int = 1, alpha: float = ALPHA) -> float:
    """The true mean difference, in standard deviations of one replicate's difference, at which a
    paired directional claim holds with probability ``target`` at level alpha / k (:func:`power`)."""
    from scipy.optimize import brentq

    return float(brentq(lambda e: power(e, n, k, alpha) - target, 1e-6, 100.0))


# -- one claim ---------------------------------------------------------------------------------------
def _seed_key(s: Any) -> tuple[int, Any]:
    s = str(s)
    return (0, int(s)) if s.isdigit() else (1, s)


def _arm(values: Values, algorithm: str) -> dict[str, float]:
    per_seed = values.get(algorithm) or {}
    return {str(s): float(per_seed[s]) for s in sorted(per_seed, key=_seed_key)}


def _stats(claim: Claim, m: dict[str, float], b: dict[str, float]
           ) -> tuple[str, int, float, float | None, float | None]:
    """(test, n, mean difference in the claimed direction, SE, df); SE and df None when n < 2."""
    sign = -1.0 if claim.direction == "lower" else 1.0
    shared = [s for s in m if s in b]
    if len(shared) >= MIN_SEEDS or (shared and set(m) == set(b)):
        d = np.array([sign * (m[s] - b[s]) for s in shared])
        if len(d) < 2:
            return "paired", len(d), float(d.mean()), None, None
        mean, se, df = paired_stats(d)
        return "paired", len(d), float(mean), float(se), float(df)
    a, c = np.array(list(m.values())), np.array(list(b.values()))
    if len(a) < 2 or len(c) < 2:
        return "welch", min(len(a), len(c)), sign * float(a.mean() - c.mean()), None, None
    mean, se, df = welch_stats(a, c)
    return "welch", min(len(a), len(c)), sign * float(mean), float(se), float(df)


def _arms(claim: Claim, values: Values) -> tuple[dict[str, float], dict[str, float]]:
    m, b = _arm(values, claim.method), _arm(values, claim.baseline)
    if claim.reference is not None:
        b = {s: float(claim.reference) for s in m}
    return m, b


def _unavailable(claim: Claim, m: dict[str, float], b: dict[str, float]) -> ClaimResult | None:
    missing = [a for a, v in ((claim.method, m), (claim.baseline, b)) if not v]
    if missing:
        return ClaimResult(claim, "not evaluated", m, b, reason=(
            f"no {claim.metric} of {' and '.join(missing)} in this study's {claim.track} track"))
    bad = [f"{a} seed {s}" for a, v in ((claim.method, m), (claim.baseline, b))
           for s, x in v.items() if not math.isfinite(x)]
    if bad:
        return ClaimResult(claim, "not judged", m, b, reason=f"non-finite value: {', '.join(bad)}")
    return None


def judge(claim: Claim, values: Values) -> ClaimResult:
    """The test of ``claim`` on ``values`` = {algorithm: {seed: value of claim.metric}}, alone (a
    family of one); :func:`judge_all` applies the Holm correction over a paper's claims."""
    if claim.fact:
        return judge_fact(claim, values)
    m, b = _arms(claim, values)
    early = _unavailable(claim, m, b)
    if early is not None:
        return early
    test, n, mean, se, df = _stats(claim, m, b)
    threshold = (claim.tolerance * abs(float(np.mean(list(b.values()))))
                 if claim.direction in MARGINED else None)
    common = dict(mean_diff=mean, se=se, n=n, test=test, threshold=threshold, df=df)
    if n < MIN_SEEDS or se is None:
        why = (f"{n} paired replicate(s)" if test == "paired"
               else f"unpaired, {len(m)} and {len(b)} replicates")
        return ClaimResult(claim, "not judged", m, b, **common,
                           reason=f"{why}; a claim is judged over at least {MIN_SEEDS} replicates")
    scale = max(abs(x) for x in (*m.values(), *b.values()))
    if se <= SE_ZERO * scale:  # rounding noise of a constant difference is no spread either
        common["se"] = 0.0
        return ClaimResult(claim, "not shown", m, b, **common, reason=(
            "SE = 0: every replicate gives the same difference, so there is no test; never held "
            "by itself"))
    if claim.direction == "match":
        p, p_opp = equivalence_p(mean, se, df, threshold)
    elif claim.direction == "at_least":
        p, p_opp = directional_p(mean + threshold, se, df)
    else:
        p, p_opp = directional_p(mean, se, df)
    return _decide(ClaimResult(claim, "", m, b, **common, p=float(p), p_opposite=float(p_opp)), 1)


def _decide(r: ClaimResult, family: int, p_holm: float | None = None,
            p_opp_holm: float | None = None) -> ClaimResult:
    ph = r.p if p_holm is None else p_holm
    po = r.p_opposite if p_opp_holm is None else p_opp_holm
    status = "held" if ph <= ALPHA else "contradicted" if po <= ALPHA else "not shown"
    what = {"match": "equivalence (TOST)", "at_least": "non-inferiority (one-sided t)"}.get(
        r.claim.direction, "one-sided t")
    reason = (f"{what}: p = {r.p:.3g}, Holm over {family} = {ph:.3g}; opposite p = "
              f"{r.p_opposite:.3g}, Holm = {po:.3g}; level {ALPHA}")
    return replace(r, status=status, p_holm=ph, p_opposite_holm=po, family=family, reason=reason)


def judge_fact(claim: Claim, values: Values) -> ClaimResult:
    """A fact: ``true`` when the relation holds on every replicate (the method's value below /
    above the baseline's, or within the tolerance of it), ``false`` otherwise."""
    m, b = _arms(claim, values)
    early = _unavailable(claim, m, b)
    if early is not None:
        return early
    shared = [s for s in m if s in b] or list(m)
    bm = float(np.mean(list(b.values())))
    pairs = [(m[s], b.get(s, bm)) for s in shared]
    if claim.direction == "lower":
        ok = [x < y for x, y in pairs]
    elif claim.direction == "higher":
        ok = [x > y for x, y in pairs]
    elif claim.direction == "at_least":
        ok = [x >= y - claim.tolerance * abs(y) for x, y in pairs]
    else:
        ok = [abs(x - y) <= claim.tolerance * abs(y) for x, y in pairs]
    sign = -1.0 if claim.direction == "lower" else 1.0
    d = [sign * (x - y) for x, y in pairs]
    status = "true" if all(ok) else "false"
    return ClaimResult(claim, status, m, b, mean_diff=float(np.mean(d)), n=len(d),
                       reason=f"{sum(ok)} of {len(ok)} replicates")


def judge_all(claims: Iterable[Claim],
              tracks: Mapping[str, Mapping[str, Mapping[Any, Mapping[str, float]]]]
              ) -> list[ClaimResult]:
    """Judge each claim on its track's numbers (``tracks[track]`` = {algorithm: {seed: metrics}}),
    with the Holm correction over the tested claims of each paper; facts by :func:`judge_fact`."""
    results = [judge(c, metric_values(tracks.get(c.track, {}), c.metric)) for c in claims]
    by_paper: dict[str, list[int]] = {}
    for i, r in enumerate(results):
        if r.p is not None:
            by_paper.setdefault(r.claim.paper, []).append(i)
    for idx in by_paper.values():
        p = np.array([results[i].p for i in idx])
        po = np.array([results[i].p_opposite for i in idx])
        for i, a, b in zip(idx, holm(p), holm(po), strict=True):
            results[i] = _decide(results[i], len(idx), float(a), float(b))
    return results


def metric_values(per_seed: Mapping[str, Mapping[Any, Mapping[str, float]]], metric: str
                  ) -> dict[str, dict[str, float]]:
    """{algorithm: {seed: {metric: value}}} -> {algorithm: {seed: value of ``metric``}} (seeds
    without that metric left out)."""
    return {a: {str(s): m[metric] for s, m in seeds.items() if m.get(metric) is not None}
            for a, seeds in per_seed.items()}


def _modules() -> dict[str, Any]:
    """{paper key: its claims module} (imported on use: the modules import this one)."""
    from fedpipe.claims import baselines, equitable, fedddpm, fednh, fedptr, perada

    mods = {m.KEY: m for m in (fedddpm, baselines, fedptr, equitable, fednh, perada)}
    assert tuple(mods) == PAPER_KEYS, (tuple(mods), PAPER_KEYS)
    return mods


def study_papers(study: StudyConfig) -> list[str]:
    """The papers a study reports: ``study.papers`` when set, else every paper one of whose arms
    (its module's ``ARMS``; the baselines' on the classification track only) the study runs."""
    if study.papers is not None:
        return list(study.papers)
    classification = set(study.algorithms)
    both = classification | set(study.diffusion_algorithms)
    return [k for k, m in _modules().items()
            if set(m.ARMS) & (classification if getattr(m, "ARM_TRACK", None) else both)]


def report_sections(study: StudyConfig, metrics: Mapping[str, Mapping[str, float]],
                    algorithms: Mapping[str, Any] | None = None) -> list[str]:
    """Markdown: the paper's tables beside ours, for each of the study's papers
    (:func:`study_papers`) whose module has ``report_section(study, metrics, algorithms)``
    (``metrics``: the classification track's per-algorithm means; ``algorithms``: the params'
    ``algorithms`` section), in the registry's order. The report calls this and knows no paper by
    name: a later paper adds its section to its own module."""
    mods, lines = _modules(), []
    for key in study_papers(study):
        section = getattr(mods[key], "report_section", None)
        if section is not None:
            lines += section(study, metrics, algorithms or {})
    return lines


def mean_pm_std(mean: float, std: float | None, seeds: int, digits: int = 2) -> str:
    """``mean ± std`` to ``digits`` decimals; the mean alone over one seed or without a std."""
    out = f"{mean:.{digits}f}"
    return out + (f" ± {std:.{digits}f}" if std is not None and seeds > 1 else "")


def metric_cell(m: Mapping[str, Any], key: str, scale: float = 100.0, digits: int = 2) -> str:
    """One algorithm's ``key`` in a report table: ``scale`` times its mean over seeds ± its std
    (``<key>_std``, when ``m["seeds"]`` > 1), "—" when absent. Every paper's section and the
    report's classification table write their cells with it."""
    if m.get(key) is None:
        return "—"
    std = m.get(f"{key}_std")
    return mean_pm_std(scale * m[key], None if std is None else scale * std, int(m.get("seeds", 1)),
                       digits)


def paper_claims(study: StudyConfig) -> dict[str, list[Claim]]:
    """The registry: the claims (and facts) of each of the study's papers (:func:`study_papers`)."""
    mods = _modules()
    return {mods[k].PAPER: mods[k].claims(study) for k in study_papers(study)}


def all_claims(study: StudyConfig) -> list[Claim]:
    return [c for claims in paper_claims(study).values() for c in claims]


def _clean(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def claims_json(results: Iterable[ClaimResult]) -> list[dict[str, Any]]:
    """The list of ``{paper, claim, held, values, ...}`` records (values: {arm: {seed: value}})."""
    out = []
    for r in results:
        c = r.claim
        ci = r.ci
        out.append({
            "paper": c.paper, "claim": c.text, "held": r.held, "status": r.status, "fact": c.fact,
            "values": {c.method: {s: _clean(v) for s, v in r.method_values.items()},
                       c.baseline: {s: _clean(v) for s, v in r.baseline_values.items()}},
            "mean_diff": _clean(r.mean_diff), "se": _clean(r.se), "n": r.n, "test": r.test,
            "df": _clean(r.df), "ci95": None if ci is None else [ci[0], ci[1]],
            "p": _clean(r.p), "p_holm": _clean(r.p_holm), "p_opposite": _clean(r.p_opposite),
            "p_opposite_holm": _clean(r.p_opposite_holm), "family": r.family,
            "key": c.key, "track": c.track, "metric": c.metric, "method": c.method,
            "baseline": c.baseline, "direction": c.direction, "tolerance": c.tolerance,
            "threshold": _clean(r.threshold), "source": c.source, "reason": r.reason,
        })
    return out


def _status(r: ClaimResult | Mapping[str, Any]) -> tuple[str, str, bool]:
    """(paper, status, is a fact) of a result or a claims.json record."""
    if isinstance(r, ClaimResult):
        return r.claim.paper, r.status, r.claim.fact
    return r["paper"], r["status"], bool(r.get("fact"))


def summary(results: Iterable[ClaimResult | Mapping[str, Any]]) -> dict[str, int]:
    """Counts per status over the claims (facts are counted apart, as ``facts``)."""
    rows = [_status(r) for r in results]
    claims = [st for _, st, fact in rows if not fact]
    counts = {s.replace(" ", "_"): claims.count(s) for s in STATUSES}
    return {"claims": len(claims), **counts, "facts": sum(fact for *_, fact in rows)}


def paper_summaries(results: Iterable[ClaimResult | Mapping[str, Any]]) -> dict[str, str]:
    """{paper: "k of n held, m contradicted, j not shown[, ...]"} in the order of the papers."""
    by: dict[str, list[ClaimResult | Mapping[str, Any]]] = {}
    for r in results:
        by.setdefault(_status(r)[0], []).append(r)
    out = {}
    for paper, rs in by.items():
        c = summary(rs)
        line = (f"{c['held']} of {c['claims']} held, {c['contradicted']} contradicted, "
                f"{c['not_shown']} not shown")
        line += "".join(f", {c[k]} {k.replace('_', ' ')}" for k in ("not_judged", "not_evaluated")
                        if c[k])
        out[paper] = line + (f"; {c['facts']} fact(s) apart" if c["facts"] else "")
    return out


def min_detectable_lines(results: Sequence[ClaimResult]) -> list[str]:
    """What can hold at this study's replicate counts: per paper with judged claims, the smallest
    mean / SE that holds (paired test) as the first Holm step (level alpha / k) and alone."""
    lines = []
    for paper, rs in _by_paper(results).items():
        tested = [r for r in rs if r.p is not None]
        if not tested:
            continue
        n, k = min(r.n for r in tested), len(tested)
        line = (f"{paper}: {k} judged claim(s) over {n} replicates: a claim holds only when "
                f"mean(d) / SE ≥ {min_detectable_t(n, k):.2f}")
        line += (f" (level {ALPHA})" if k == 1 else
                 f" (first Holm step, level {ALPHA}/{k}) down to {min_detectable_t(n):.2f} (level "
                 f"{ALPHA}, once the others held)")
        lines.append(line + "; paired t, df = n − 1.")
    return lines


def _by_paper(results: Iterable[ClaimResult]) -> dict[str, list[ClaimResult]]:
    by: dict[str, list[ClaimResult]] = {}
    for r in results:
        by.setdefault(r.claim.paper, []).append(r)
    return by


def claims_metrics(results: Iterable[ClaimResult]) -> dict[str, Any]:
    """The content of ``claims.json``: ``summary``, ``papers`` (the summary per paper), ``held`` {claim
    key: bool}, ``facts`` {fact key: bool}, ``claims`` and ``fact_records`` (the lists)."""
    results = list(results)
    claims = [r for r in results if not r.claim.fact]
    facts = [r for r in results if r.claim.fact]
    return {"summary": summary(results),
            "papers": {paper: summary(rs) for paper, rs in _by_paper(results).items()},
            "held": {r.claim.key: r.held for r in claims},
            "facts": {r.claim.key: r.held for r in facts},
            "claims": claims_json(claims), "fact_records": claims_json(facts)}
