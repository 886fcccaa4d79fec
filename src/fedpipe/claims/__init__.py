"""Claims: each paper's headline claims, encoded as checks on a study's numbers and judged over
training seeds (DESIGN.md §2, "Claims").

A :class:`Claim` compares two arms of one track (``diffusion`` or ``classification``) on one metric:
the method's value is ``lower`` or ``higher`` than the baseline's, or it ``match``-es the baseline's
within a relative tolerance. Each paper's claims live in one module of this package (``fedddpm``,
``baselines``, ...) with ``PAPERS``-style entry points ``claims(study) -> list[Claim]``; a later paper
adds its module and one line to :func:`paper_claims`. A claim is encoded as the paper states it; the
numbers decide whether it holds here.

The rule (:func:`judge`)
------------------------
A claim is judged over at least ``MIN_SEEDS = 3`` training seeds, never one.

- ``d`` is the difference in the claimed direction: ``baseline - method`` for ``lower``,
  ``method - baseline`` for ``higher`` and ``match`` (signed: FedDDPM+ FID - FedDDPM FID).
- **Paired** (the arms share at least 3 seeds, or have exactly the same seeds): ``d_s`` per shared
  seed, ``mean = mean(d_s)``, ``SE = std(d_s, ddof=1) / sqrt(n)``, ``n`` = shared seeds (seeds of only
  one arm are shown but not used).
- **Unpaired** (otherwise; each arm needs at least 3 seeds): Welch's standard error of the difference
  of the means, ``mean = mean_m - mean_b`` (signed as above) and
  ``SE = sqrt(var_m / n_m + var_b / n_b)`` with sample variances (ddof=1); ``n`` = the smaller arm.
- ``lower`` / ``higher`` hold when ``mean > SE``: the mean difference points the claimed way by more
  than its standard error (a one-SE rule, about a 84% one-sided level for a normal mean: weak
  evidence, but it cannot be met by one lucky seed, and the table shows every seed).
- ``match`` holds when ``|mean| + SE < tolerance * |mean of the baseline|``: the mean difference lies
  inside the tolerance band by more than its standard error (the equivalence form of the same rule).
- Statuses: ``held``; ``not held``; ``not judged`` (fewer than 3 seeds, or a non-finite value; the
  numbers are still shown and ``held`` is false); ``not evaluated`` (an arm, or its metric, is not in
  this study; listed in the table and counted, ``held`` false).

Outputs: :func:`claims_json` is the list of ``{paper, claim, held, values, ...}`` records;
:func:`claims_metrics` wraps it for ``data/report/claims.json``. DVC's metrics reader drops lists
(``dvc metrics show`` prints nothing of a top-level list), so the file is a mapping: ``summary``
(counts per status), ``held`` (claim key -> bool, one column per claim in ``dvc metrics show`` and
``dvc exp show``) and ``claims`` (the list).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from fedpipe.config.fl import StudyConfig

MIN_SEEDS = 3
TRACKS = ("diffusion", "classification")
DIRECTIONS = ("lower", "higher", "match")
STATUSES = ("held", "not held", "not judged", "not evaluated")
OPS = {"lower": "lt", "higher": "gt", "match": "match"}

RULE = ("Each claim is judged over ≥ 3 training seeds: d = the difference in the claimed direction "
        "(paired by seed where both arms share the seeds, SE = std(d)/√n; otherwise Welch, SE = "
        "√(s²ₘ/nₘ + s²ᵦ/nᵦ)); a lower/higher claim holds when mean(d) > SE, a match claim when "
        "|mean(d)| + SE < its tolerance. Fewer seeds: not judged; an arm missing from the study: "
        "not evaluated.")

Direction = Literal["lower", "higher", "match"]
Track = Literal["diffusion", "classification"]
Values = Mapping[str, Mapping[Any, float]]  # {algorithm: {seed: value}}


@dataclass(frozen=True)
class Claim:
    """One headline claim: ``method``'s ``metric`` is ``direction`` than ``baseline``'s.

    ``paper`` names who claims it (its first word is the paper's key, e.g. ``"FedDDPM (Peng et al.
    2025)"``); ``text`` is the claim as the paper states it; ``source`` where (table, column and the
    paper's numbers). ``tolerance`` (``match`` only) is relative to the baseline's mean.
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

    def __post_init__(self) -> None:
        if self.track not in TRACKS:
            raise ValueError(f"claim {self.text!r}: track {self.track!r} not in {TRACKS}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"claim {self.text!r}: direction {self.direction!r} not in {DIRECTIONS}")
        if (self.direction == "match") != (self.tolerance is not None):
            raise ValueError(f"claim {self.text!r}: a tolerance goes with direction 'match' only")
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
    """The verdict on one claim, with the numbers behind it (seeds as strings, in seed order)."""

    claim: Claim
    status: str
    method_values: dict[str, float] = field(default_factory=dict)
    baseline_values: dict[str, float] = field(default_factory=dict)
    mean_diff: float | None = None
    se: float | None = None
    n: int = 0
    test: str | None = None  # "paired" | "welch"
    threshold: float | None = None  # match claims: the absolute tolerance
    reason: str = ""

    @property
    def held(self) -> bool:
        return self.status == "held"


def _seed_key(s: Any) -> tuple[int, Any]:
    s = str(s)
    return (0, int(s)) if s.isdigit() else (1, s)


def _arm(values: Values, algorithm: str) -> dict[str, float]:
    per_seed = values.get(algorithm) or {}
    return {str(s): float(per_seed[s]) for s in sorted(per_seed, key=_seed_key)}


def _stats(claim: Claim, m: dict[str, float], b: dict[str, float]
           ) -> tuple[str, int, float, float | None]:
    """(test, n, mean difference in the claimed direction, SE or None when n < 2)."""
    sign = -1.0 if claim.direction == "lower" else 1.0
    shared = [s for s in m if s in b]
    if len(shared) >= MIN_SEEDS or (shared and set(m) == set(b)):
        d = np.array([sign * (m[s] - b[s]) for s in shared])
        se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else None
        return "paired", len(d), float(d.mean()), se
    a, c = np.array(list(m.values())), np.array(list(b.values()))
    se = (float(math.sqrt(a.var(ddof=1) / len(a) + c.var(ddof=1) / len(c)))
          if len(a) > 1 and len(c) > 1 else None)
    return "welch", min(len(a), len(c)), sign * float(a.mean() - c.mean()), se


def judge(claim: Claim, values: Values) -> ClaimResult:
    """Decide ``claim`` on ``values`` = {algorithm: {seed: value of claim.metric}} (see the rule in
    the module docstring)."""
    m, b = _arm(values, claim.method), _arm(values, claim.baseline)
    if claim.reference is not None:
        b = {s: float(claim.reference) for s in m}
    missing = [a for a, v in ((claim.method, m), (claim.baseline, b)) if not v]
    if missing:
        return ClaimResult(claim, "not evaluated", m, b, reason=(
            f"no {claim.metric} of {' and '.join(missing)} in this study's {claim.track} track"))
    bad = [f"{a} seed {s}" for a, v in ((claim.method, m), (claim.baseline, b))
           for s, x in v.items() if not math.isfinite(x)]
    if bad:
        return ClaimResult(claim, "not judged", m, b, reason=f"non-finite value: {', '.join(bad)}")
    test, n, mean, se = _stats(claim, m, b)
    threshold = (claim.tolerance * abs(float(np.mean(list(b.values()))))
                 if claim.direction == "match" else None)
    common = dict(mean_diff=mean, se=se, n=n, test=test, threshold=threshold)
    if n < MIN_SEEDS or se is None:
        why = (f"{n} paired seed(s)" if test == "paired"
               else f"unpaired, {len(m)} and {len(b)} seeds")
        return ClaimResult(claim, "not judged", m, b, **common,
                           reason=f"{why}; a claim is judged over at least {MIN_SEEDS} seeds")
    if claim.direction == "match":
        held = abs(mean) + se < threshold
        reason = f"|{mean:.4g}| + {se:.4g} {'<' if held else '≥'} tolerance {threshold:.4g}"
    else:
        held = mean > se
        reason = f"mean difference {mean:.4g} {'>' if held else '≤'} SE {se:.4g}"
    return ClaimResult(claim, "held" if held else "not held", m, b, **common, reason=reason)


def metric_values(per_seed: Mapping[str, Mapping[Any, Mapping[str, float]]], metric: str
                  ) -> dict[str, dict[str, float]]:
    """{algorithm: {seed: {metric: value}}} -> {algorithm: {seed: value of ``metric``}} (seeds
    without that metric left out)."""
    return {a: {str(s): m[metric] for s, m in seeds.items() if m.get(metric) is not None}
            for a, seeds in per_seed.items()}


def judge_all(claims: Iterable[Claim],
              tracks: Mapping[str, Mapping[str, Mapping[Any, Mapping[str, float]]]]
              ) -> list[ClaimResult]:
    """Judge each claim on its track's numbers: ``tracks[track]`` = {algorithm: {seed: metrics}}."""
    return [judge(c, metric_values(tracks.get(c.track, {}), c.metric)) for c in claims]


def paper_claims(study: StudyConfig) -> dict[str, list[Claim]]:
    """The registry: each paper's claims for ``study``. A later paper adds its module here."""
    from fedpipe.claims import baselines, equitable, fedddpm, fednh, fedptr, perada

    return {module.PAPER: module.claims(study)
            for module in (fedddpm, baselines, fedptr, equitable, fednh, perada)}


def absent_papers(records: Iterable[Any]) -> dict[str, int]:
    """{paper: number of claims} of the papers none of whose claims this study evaluates (every
    arm missing): tables list them in one line instead of one "not evaluated" row per claim.
    ``records`` are :class:`ClaimResult` objects or the dicts of :func:`claims_json`."""
    by_paper: dict[str, list[str]] = {}
    for r in records:
        paper = r["paper"] if isinstance(r, dict) else r.claim.paper
        by_paper.setdefault(paper, []).append(r["status"] if isinstance(r, dict) else r.status)
    return {p: len(st) for p, st in by_paper.items() if all(s == "not evaluated" for s in st)}


def all_claims(study: StudyConfig) -> list[Claim]:
    return [c for claims in paper_claims(study).values() for c in claims]


def _clean(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def claims_json(results: Iterable[ClaimResult]) -> list[dict[str, Any]]:
    """The list of ``{paper, claim, held, values, ...}`` records (values: {arm: {seed: value}})."""
    out = []
    for r in results:
        c = r.claim
        out.append({
            "paper": c.paper, "claim": c.text, "held": r.held, "status": r.status,
            "values": {c.method: {s: _clean(v) for s, v in r.method_values.items()},
                       c.baseline: {s: _clean(v) for s, v in r.baseline_values.items()}},
            "mean_diff": _clean(r.mean_diff), "se": _clean(r.se), "n": r.n, "test": r.test,
            "key": c.key, "track": c.track, "metric": c.metric, "method": c.method,
            "baseline": c.baseline, "direction": c.direction, "tolerance": c.tolerance,
            "threshold": _clean(r.threshold), "source": c.source, "reason": r.reason,
        })
    return out


def summary(results: Iterable[ClaimResult]) -> dict[str, int]:
    results = list(results)
    counts = {s.replace(" ", "_"): sum(r.status == s for r in results) for s in STATUSES}
    return {"claims": len(results), **counts}


def claims_metrics(results: Iterable[ClaimResult]) -> dict[str, Any]:
    """The content of ``claims.json``: ``summary``, ``held`` {key: bool} and ``claims`` (the list)."""
    results = list(results)
    return {"summary": summary(results), "held": {r.claim.key: r.held for r in results},
            "claims": claims_json(results)}
