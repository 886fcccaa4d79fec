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

FAMILIES = ("paper", "ordering")
FAMILY_LABELS = {"paper": "the paper's claims",
                 "ordering": "orderings among baselines and controls (not the paper's claims)"}
PAPER_UNITS = ("percent", "same", "relative")
POWER = 0.8
"""The power at which "undecided" states the replicates needed (:func:`replicates_for_power`)."""
RULED_OUT = "smaller than the paper's"
RESOLUTION_RULE = (
    "Not shown, with a test, says which: \"smaller than the paper's\" when the paper's effect (its "
    "table's difference in our units: percent points / 100 against our fractions, relative to the "
    "baseline where the scales differ, e.g. FID) lies above the one-sided upper confidence bound of "
    "our difference at level α/k (k: the judged claims of its family); otherwise \"undecided\", with "
    "about how many paired replicates give 80% power at the observed effect as the first Holm step.")
UNDECIDED = "undecided"
Family = Literal["paper", "ordering"]
PaperUnits = Literal["percent", "same", "relative"]
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
    quote: str = ""
    """The paper's own sentence (or table line) this claim encodes, verbatim; ``source`` says where."""
    family: Family = "paper"
    """``paper``: a claim the paper makes about its method; ``ordering``: an ordering among baselines
    or a project control that the paper's tables show but that is not the paper's claim. Each family
    of a paper is Holm-corrected on its own (:func:`judge_all`)."""
    paper_values: tuple[float, float] | None = None
    """The paper's (method, baseline) numbers this claim reads, in the paper's units (Table 1: 91.82,
    90.74): the paper's effect, :func:`paper_effect`."""
    paper_units: PaperUnits | None = None
    """How the paper's effect becomes the study's units: ``percent`` (the paper's percent points,
    ours fractions: / 100), ``same`` (the same quantity and scale), ``relative`` (another scale, e.g.
    Inception FID against ours: the paper's relative difference times our baseline's mean)."""

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
        if self.family not in FAMILIES:
            raise ValueError(f"claim {self.text!r}: family {self.family!r} not in {FAMILIES}")
        if (self.paper_values is None) != (self.paper_units is None):
            raise ValueError(f"claim {self.text!r}: paper_values and paper_units go together")
        if self.paper_units is not None and self.paper_units not in PAPER_UNITS:
            raise ValueError(f"claim {self.text!r}: paper_units {self.paper_units!r} not in "
                             f"{PAPER_UNITS}")

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
    family_size: int = 0
    """How many judged claims share this claim's Holm family (its paper and ``claim.family``)."""
    paper_effect: float | None = None
    """The paper's effect in the study's units and the claimed direction (:func:`paper_effect`)."""
    upper_bound: float | None = None
    """Not shown: the one-sided upper confidence bound of the difference at level alpha / k (k =
    ``family_size``; for an at-least claim, of the difference plus its margin)."""
    resolution: str | None = None
    """Not shown, with a test: ``"smaller than the paper's"`` (the paper's effect lies above
    ``upper_bound``) or ``"undecided"``."""
    n_for_power: int | None = None
    """Undecided: about how many paired replicates give :data:`POWER` at the observed effect, as the
    first Holm step of the family (None when the observed effect points the other way)."""
    alpha: float = ALPHA

    @property
    def held(self) -> bool:
        return self.status in ("held", "true")

    @property
    def family(self) -> str:
        """``paper`` or ``ordering`` (the claim's)."""
        return self.claim.family

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


def judge(claim: Claim, values: Values, alpha: float = ALPHA) -> ClaimResult:
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
        return ClaimResult(claim, "not shown", m, b, **common, paper_effect=paper_effect(claim, b),
                           reason=(
            "SE = 0: every replicate gives the same difference, so there is no test; never held "
            "by itself"))
    if claim.direction == "match":
        p, p_opp = equivalence_p(mean, se, df, threshold)
    elif claim.direction == "at_least":
        p, p_opp = directional_p(mean + threshold, se, df)
    else:
        p, p_opp = directional_p(mean, se, df)
    return _decide(ClaimResult(claim, "", m, b, **common, p=float(p), p_opposite=float(p_opp),
                               paper_effect=paper_effect(claim, b)), 1, alpha=alpha)


def _decide(r: ClaimResult, family: int, p_holm: float | None = None,
            p_opp_holm: float | None = None, alpha: float = ALPHA) -> ClaimResult:
    ph = r.p if p_holm is None else p_holm
    po = r.p_opposite if p_opp_holm is None else p_opp_holm
    status = "held" if ph <= alpha else "contradicted" if po <= alpha else "not shown"
    what = {"match": "equivalence (TOST)", "at_least": "non-inferiority (one-sided t)"}.get(
        r.claim.direction, "one-sided t")
    reason = (f"{what}: p = {r.p:.3g}, Holm over {family} = {ph:.3g}; opposite p = "
              f"{r.p_opposite:.3g}, Holm = {po:.3g}; level {alpha:.3g}")
    r = replace(r, status=status, p_holm=ph, p_opposite_holm=po, family_size=family, reason=reason,
                alpha=alpha, upper_bound=None, resolution=None, n_for_power=None)
    return _resolve(r) if status == "not shown" else r


# -- not shown: ruled out, or undecided ----------------------------------------------------------------
def paper_effect(claim: Claim, baseline: Mapping[str, float]) -> float | None:
    """The paper's effect in the study's units, signed in the claimed direction (positive = the
    paper's way), from ``claim.paper_values`` = (method, baseline) in the paper's table:

    - ``percent``: the paper's difference in percent points / 100 (our accuracies are fractions);
    - ``same``: the paper's difference as it is (the same quantity on the same scale);
    - ``relative``: the paper's relative difference (method - baseline) / |baseline| times |the mean
      of our baseline arm| (FID: the paper's Inception FID against our small extractor's).

    For a ``lower`` claim the sign is flipped (baseline - method). None without paper values."""
    if claim.paper_values is None:
        return None
    pm, pb = claim.paper_values
    diff = pm - pb
    if claim.paper_units == "percent":
        effect = diff / 100.0
    elif claim.paper_units == "same":
        effect = diff
    else:
        ours = [v for v in baseline.values() if math.isfinite(v)]
        if not ours or pb == 0:
            return None
        effect = diff / abs(pb) * abs(float(np.mean(ours)))
    return -effect if claim.direction == "lower" else effect


def upper_bound(mean: float, se: float, df: float, k: int = 1, alpha: float = ALPHA) -> float:
    """The one-sided upper confidence bound of a mean difference at level ``alpha / k``:
    ``mean + t(1 - alpha / k, df) * SE`` (Bonferroni over the k judged claims of the family)."""
    return float(mean + stats.t.isf(alpha / k, df) * se)


def replicates_for_power(effect: float, k: int = 1, target: float = POWER, alpha: float = ALPHA,
                         cap: int = 100_000) -> int | None:
    """The smallest number of paired replicates (at least :data:`MIN_SEEDS`) at which a directional
    claim whose true difference is ``effect`` standard deviations of one replicate's difference holds
    with probability ``target`` as the first Holm step of ``k`` claims (:func:`power`); None when
    ``effect`` <= 0 or more than ``cap`` would be needed."""
    if not effect > 0:
        return None
    lo, hi = MIN_SEEDS, MIN_SEEDS
    while power(effect, hi, k, alpha) < target:
        lo, hi = hi, hi * 2
        if hi > cap:
            return None
    while lo < hi:  # power rises with n: the first n that reaches the target
        mid = (lo + hi) // 2
        if power(effect, mid, k, alpha) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def observed_effect_sd(r: ClaimResult) -> float | None:
    """The observed effect in standard deviations of one replicate's difference, the quantity the
    power of the claim's test rests on: ``mean / (SE * sqrt(n))`` for a directional claim (Welch:
    n = the smaller arm), ``(mean + margin) / ...`` for an at-least claim, ``(margin - |mean|) / ...``
    for a match claim (the nearer of TOST's two tests)."""
    if r.se is None or not r.se > 0 or r.mean_diff is None or r.n < 2:
        return None
    d = r.mean_diff
    if r.claim.direction == "at_least":
        d = d + (r.threshold or 0.0)
    elif r.claim.direction == "match":
        d = (r.threshold or 0.0) - abs(d)
    return d / (r.se * math.sqrt(r.n))


def _resolve(r: ClaimResult) -> ClaimResult:
    """A not-shown claim with a test: ruled out (the paper's effect lies above the one-sided upper
    bound at level alpha / k: "smaller than the paper's") or undecided (with about how many replicates
    would give 80% power at the observed effect). Match claims are never ruled out (their paper's
    effect is a tolerance, not a difference to reach)."""
    if r.p is None or r.se is None or r.df is None:
        return r
    k = max(r.family_size, 1)
    shift = r.threshold if r.claim.direction == "at_least" and r.threshold else 0.0
    bound = upper_bound(r.mean_diff + shift, r.se, r.df, k, r.alpha)
    effect = r.paper_effect
    if (r.claim.direction in ("lower", "higher") and effect is not None and effect > 0
            and effect > bound):
        return replace(r, upper_bound=bound, resolution=RULED_OUT, reason=(
            f"{r.reason}; {RULED_OUT}: the paper's effect {effect:.4g} is above the one-sided "
            f"{1 - r.alpha / k:.4g} upper bound {bound:.4g}"))
    e = observed_effect_sd(r)
    n = None if e is None else replicates_for_power(e, k, alpha=r.alpha)
    why = (f"about {n} replicates for {POWER:.0%} power at the observed effect ({e:.3g} SD)"
           if n is not None else "the observed effect points the other way: no replicate count "
           f"gives {POWER:.0%} power at it")
    return replace(r, upper_bound=bound, resolution=UNDECIDED, n_for_power=n,
                   reason=f"{r.reason}; {UNDECIDED}: {why}")


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
              tracks: Mapping[str, Mapping[str, Mapping[Any, Mapping[str, float]]]],
              alpha: float = ALPHA) -> list[ClaimResult]:
    """Judge each claim on its track's numbers (``tracks[track]`` = {algorithm: {seed: metrics}}),
    with the Holm correction over the tested claims of each paper's family (``paper`` and
    ``ordering`` apart) at level ``alpha``; facts by :func:`judge_fact`."""
    results = [judge(c, metric_values(tracks.get(c.track, {}), c.metric), alpha) for c in claims]
    families: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(results):
        if r.p is not None:
            families.setdefault((r.claim.paper, r.claim.family), []).append(i)
    for idx in families.values():
        p = np.array([results[i].p for i in idx])
        po = np.array([results[i].p_opposite for i in idx])
        for i, a, b in zip(idx, holm(p), holm(po), strict=True):
            results[i] = _decide(results[i], len(idx), float(a), float(b), alpha)
    return results


def study_verdicts(study: StudyConfig,
                   tracks: Mapping[str, Mapping[str, Mapping[Any, Mapping[str, float]]]],
                   alpha: float = ALPHA) -> list[dict[str, Any]]:
    """The verdicts of a study's claims on its per-replicate metrics, one record per claim (facts
    left out): ``tracks`` = {"diffusion" | "classification": {algorithm: {seed: {metric: value}}}},
    the report's input (``federate_ddpm`` metrics and ``data/evaluate/seeds.json``). Each record has
    ``key``, ``paper``, ``family`` (``paper`` / ``ordering``), ``claim``, ``mean`` (the difference
    in the claimed direction), ``se``, ``n``, ``df``, ``status`` (held / contradicted / not shown /
    not judged / not evaluated), ``resolution`` (not shown: "smaller than the paper's" / "undecided"),
    ``p``, ``p_holm``, ``p_opposite_holm``, ``family_size``, ``paper_effect``, ``upper_bound`` and
    ``n_for_power``. ``alpha``: the level of each family (a sequential design passes its spent
    level per look). The API a caller outside the report uses (e.g. a sequential design)."""
    out = []
    for r in judge_all(all_claims(study), tracks, alpha):
        if r.claim.fact:
            continue
        out.append({"key": r.claim.key, "paper": r.claim.paper, "family": r.claim.family,
                    "claim": r.claim.text, "mean": r.mean_diff, "se": r.se, "n": r.n, "df": r.df,
                    "status": r.status, "resolution": r.resolution, "p": r.p, "p_holm": r.p_holm,
                    "p_opposite_holm": r.p_opposite_holm, "family_size": r.family_size,
                    "paper_effect": r.paper_effect, "upper_bound": r.upper_bound,
                    "n_for_power": r.n_for_power})
    return out


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
            "p_opposite_holm": _clean(r.p_opposite_holm), "family": c.family,
            "family_size": r.family_size,
            "key": c.key, "track": c.track, "metric": c.metric, "method": c.method,
            "baseline": c.baseline, "direction": c.direction, "tolerance": c.tolerance,
            "threshold": _clean(r.threshold), "source": c.source, "quote": c.quote,
            "paper_effect": None if c.paper_values is None else {
                "value": _clean(r.paper_effect), "paper_method": c.paper_values[0],
                "paper_baseline": c.paper_values[1], "units": c.paper_units, "source": c.source},
            "upper_bound": _clean(r.upper_bound), "resolution": r.resolution,
            "n_for_power": r.n_for_power, "reason": r.reason,
        })
    return out


def resolution_text(resolution: str | None, bound: float | None, effect: float | None,
                    n: int | None) -> str:
    """The words of a not-shown claim's resolution: "smaller than the paper's (upper bound ... <
    paper's ...)" or "undecided: about n replicates for 80% power at the observed effect"."""
    if resolution == RULED_OUT and bound is not None and effect is not None:
        return f"{RULED_OUT} (upper bound {bound:+.4g} < paper's {effect:+.4g})"
    if resolution == UNDECIDED:
        return (f"{UNDECIDED}: about {n} replicates for {POWER:.0%} power at the observed effect"
                if n is not None else f"{UNDECIDED}: the observed effect points the other way")
    return resolution or ""


def family_of(r: ClaimResult | Mapping[str, Any]) -> str:
    """``paper`` or ``ordering`` of a result or a claims.json record (older records: ``paper``)."""
    if isinstance(r, ClaimResult):
        return r.claim.family
    fam = r.get("family")
    return fam if fam in FAMILIES else "paper"


def family_label(paper: str, family: str) -> str:
    """How a family is named in the report, claims.md, claims.json and the CLI: the paper's name for
    its own claims, ``"<paper> · orderings ..."`` for the second family."""
    return paper if family == "paper" else f"{paper} · {FAMILY_LABELS['ordering']}"


def _status(r: ClaimResult | Mapping[str, Any]) -> tuple[str, str, bool, str | None]:
    """(paper, status, is a fact, resolution) of a result or a claims.json record."""
    if isinstance(r, ClaimResult):
        return r.claim.paper, r.status, r.claim.fact, r.resolution
    return r["paper"], r["status"], bool(r.get("fact")), r.get("resolution")


def summary(results: Iterable[ClaimResult | Mapping[str, Any]]) -> dict[str, int]:
    """Counts per status over the claims (facts are counted apart, as ``facts``); the not-shown
    claims split into ``smaller_than_paper`` and ``undecided`` (their sum is less than ``not_shown``
    by the claims with no test, SE = 0)."""
    rows = [_status(r) for r in results]
    claims = [(st, res) for _, st, fact, res in rows if not fact]
    statuses = [st for st, _ in claims]
    counts = {s.replace(" ", "_"): statuses.count(s) for s in STATUSES}
    return {"claims": len(claims), **counts,
            "smaller_than_paper": sum(res == RULED_OUT for _, res in claims),
            "undecided": sum(res == UNDECIDED for _, res in claims),
            "facts": sum(fact for _, _, fact, _ in rows)}


def _by_family(results: Iterable[Any]) -> dict[str, list[Any]]:
    """{family label: its results or records}, papers in order, each paper's own claims first."""
    items = list(results)
    order: list[tuple[str, str]] = []
    for r in items:
        key = (_status(r)[0], family_of(r))
        if key not in order:
            order.append(key)
    papers = list(dict.fromkeys(p for p, _ in order))
    order.sort(key=lambda k: (papers.index(k[0]), FAMILIES.index(k[1])))
    return {family_label(*k): [r for r in items if (_status(r)[0], family_of(r)) == k]
            for k in order}


def summary_line(c: Mapping[str, int]) -> str:
    """ "k of n held, m contradicted, j not shown (a smaller than the paper's, b undecided)[, ...]"."""
    line = f"{c['held']} of {c['claims']} held, {c['contradicted']} contradicted, {c['not_shown']} not shown"
    if c["not_shown"]:
        line += f" ({c.get('smaller_than_paper', 0)} {RULED_OUT}, {c.get('undecided', 0)} {UNDECIDED})"
    line += "".join(f", {c[k]} {k.replace('_', ' ')}" for k in ("not_judged", "not_evaluated")
                    if c[k])
    return line + (f"; {c['facts']} fact(s) apart" if c["facts"] else "")


def paper_summaries(results: Iterable[ClaimResult | Mapping[str, Any]]) -> dict[str, str]:
    """{family label: "k of n held, m contradicted, j not shown (...)[, ...]"}: per paper its own
    claims (labelled with the paper's name), then its orderings (:func:`family_label`)."""
    return {label: summary_line(summary(rs)) for label, rs in _by_family(results).items()}


def min_detectable_lines(results: Sequence[ClaimResult]) -> list[str]:
    """What can hold at this study's replicate counts: per family with judged claims, the smallest
    mean / SE that holds (paired test) as the first Holm step (level alpha / k) and alone."""
    lines = []
    for label, rs in _by_family(results).items():
        tested = [r for r in rs if r.p is not None]
        if not tested:
            continue
        n, k = min(r.n for r in tested), len(tested)
        line = (f"{label}: {k} judged claim(s) over {n} replicates: a claim holds only when "
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
    """The content of ``claims.json``: ``summary``, ``papers`` (the summary per paper, both
    families), ``families`` (the summary per family label), ``held`` {claim key: bool}, ``facts``
    {fact key: bool}, ``claims`` and ``fact_records`` (the lists)."""
    results = list(results)
    claims = [r for r in results if not r.claim.fact]
    facts = [r for r in results if r.claim.fact]
    return {"summary": summary(results),
            "papers": {paper: summary(rs) for paper, rs in _by_paper(results).items()},
            "families": {label: summary(rs) for label, rs in _by_family(results).items()},
            "held": {r.claim.key: r.held for r in claims},
            "facts": {r.claim.key: r.held for r in facts},
            "claims": claims_json(claims), "fact_records": claims_json(facts)}
