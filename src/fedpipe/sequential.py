"""Sequential mode: a study's replicates added in steps until its papers' claims are decided
(docs/claims.md, "Sequential mode").

``python -m fedpipe.sequential <study> --min N --max M --step K [-S override ...]`` (``make sequential
STUDY=<study> ARGS="..."``) plans the looks ``N, N + K, ..., M`` (the last is ``M``). At each look it
runs ``dvc exp run -S study=<study> -S study.seeds=[...]`` (and ``study.diffusion_seeds``, the same
list, when the study has the diffusion track) with the first ``n`` replicates of the study's seeds
(continued by the next integers), so that DVC runs only the new replicates' stages, the aggregating
``evaluate`` and ``report`` and the always-run ``plan``; then it reads the report's ``claims.json``
and decides each claim against the group-sequential boundaries below. It stops at the first look at
which every claim of the study's papers (not the "ordering" family, when claims carry one) is held or
contradicted, or at ``M``. It prints a table per look and writes ``sequential.json`` (the design,
every look with its seeds, seconds and the stages DVC ran, each claim's numbers and verdict, and the
final verdicts) after every look.

The design
----------
- Spending: Lan & DeMets' (1983) O'Brien-Fleming-type function for a one-sided level ``a``,
  ``a(t) = 2 (1 - Phi(z_{1 - a/2} / sqrt(t)))``, over the information fractions ``t_j = n_j / M``
  of the planned looks. The z boundaries ``c_j`` solve ``P(Z_1 < c_1, ..., Z_{j-1} < c_{j-1},
  Z_j >= c_j) = a(t_j) - a(t_{j-1})`` for the canonical joint law of the statistics (Brownian
  motion: ``corr(Z_i, Z_j) = sqrt(t_i / t_j)``, i <= j), by recursive numerical integration
  (:func:`_crossings`; scipy's multivariate normal CDF gives the same to its 1e-5 tolerance, at
  hundreds of times the cost, and no Python library we know of computes spending boundaries).
- t statistics: the claims' tests are t tests (df = n - 1 at small n), so a look compares the
  claim's p-value (``fedpipe.claims``' one-sided t p-value) with the boundary's nominal level
  ``1 - Phi(c_j)`` (Jennison & Turnbull 2000, §3.8, the significance-level approach).
- Holm per paper (``sequential Holm``, Maurer & Bretz 2013; Ye et al. 2013): in a family of k claims
  of which m are not yet rejected, each is tested at look j against the boundary of the spending
  function at level ``ALPHA / m``; a rejection frees its level, and the rest are re-tested at the
  same look with ``ALPHA / (m - 1)``, until none more rejects. Held and contradicted are two such
  procedures (the claims' p-values and their opposites'), each at ``ALPHA``, as in the fixed rule.
  A match claim's opposite ("outside the margin") is a two-sided statement: the smaller of its two
  one-sided p-values is tested at half the claim's level (Bonferroni, as the fixed rule's factor 2).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import optimize, special, stats

from fedpipe import claims as claims_mod
from fedpipe.claims.docs import t_text

ALPHA = claims_mod.ALPHA
SPENDING = "Lan-DeMets O'Brien-Fleming-type: a(t) = 2 (1 - Phi(z_{1-a/2} / sqrt(t)))"
CLAIMS_JSON = "data/report/claims.json"

# verdict codes of the vectorised procedure
OPEN, HELD, CONTRADICTED = 0, 1, 2


# -- the design --------------------------------------------------------------------------------------
def obf_spending(t: float | np.ndarray, level: float) -> float | np.ndarray:
    """The one-sided level spent by information fraction ``t`` (Lan & DeMets 1983, O'Brien-Fleming
    type): ``2 (1 - Phi(z_{1 - level/2} / sqrt(t)))``; ``level`` at t = 1."""
    t = np.asarray(t, dtype=np.float64)
    return 2.0 * stats.norm.sf(stats.norm.isf(level / 2.0) / np.sqrt(t))


GRID = 401  # points per look of the recursive integration (odd: Simpson's rule; 1601 agrees to 1e-8)
SPAN = 9.0  # the grid's lower end, in standard deviations below the statistic's mean


def _simpson(n: int, h: float) -> np.ndarray:
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return w * h / 3.0


def _pdf(x: np.ndarray, sd: float) -> np.ndarray:
    return np.exp(-0.5 * (x / sd) ** 2) / (sd * math.sqrt(2 * math.pi))


@dataclass
class _Region:
    """The sub-density of the score ``S_j = Z_j sqrt(t_j)`` on the continuation region
    ``S_j < b_j`` after look j (no crossing so far), on a grid with Simpson's weights folded in."""

    t: float
    grid: np.ndarray
    mass: np.ndarray  # density times weight

    @classmethod
    def first(cls, t: float, b: float, drift: float) -> _Region:
        sd = math.sqrt(t)
        hi = b if math.isfinite(b) else drift * t + SPAN * sd
        grid = np.linspace(min(drift * t - SPAN * sd, hi - 1e-9), hi, GRID)
        return cls(t, grid, _pdf(grid - drift * t, sd) * _simpson(GRID, grid[1] - grid[0]))

    def cross(self, t: float, b: float, drift: float) -> float:
        """P(no crossing so far, S at fraction ``t`` >= b)."""
        if not math.isfinite(b):
            return 0.0
        dt = t - self.t
        return float(np.sum(self.mass * special.ndtr((self.grid + drift * dt - b) / math.sqrt(dt))))

    def next(self, t: float, b: float, drift: float) -> _Region:
        dt = t - self.t
        sd = math.sqrt(t)
        hi = b if math.isfinite(b) else drift * t + SPAN * sd
        grid = np.linspace(min(drift * t - SPAN * sd, hi - 1e-9), hi, GRID)
        dens = _pdf(grid[:, None] - self.grid[None, :] - drift * dt, math.sqrt(dt)) @ self.mass
        return _Region(t, grid, dens * _simpson(GRID, grid[1] - grid[0]))


def _crossings(fractions: Sequence[float], z: Sequence[float], drift: float = 0.0) -> list[float]:
    """P(first crossing at look j) of the score process ``S_j = Z_j sqrt(t_j)`` (Brownian motion
    with ``drift``: ``S_j ~ N(drift t_j, t_j)``, independent increments) against the upper
    boundaries ``z_j`` on the Z scale, by recursive numerical integration over the continuation
    region (Armitage, McPherson & Rowe 1969; Jennison & Turnbull 2000, ch. 19)."""
    out, region = [], None
    for j, (t, c) in enumerate(zip(fractions, z, strict=True)):
        b = c * math.sqrt(t)
        if region is None:
            out.append(float(stats.norm.sf(b, drift * t, math.sqrt(t))))
            region = _Region.first(t, b, drift)
        else:
            out.append(region.cross(t, b, drift))
            if j + 1 < len(fractions):
                region = region.next(t, b, drift)
    return out


@functools.cache
def z_boundaries(fractions: tuple[float, ...], level: float) -> tuple[float, ...]:
    """The upper z boundaries ``c_j`` of a one-sided group-sequential test at ``level`` with looks at
    ``fractions`` (increasing, the last 1), O'Brien-Fleming-type spending: ``c_j`` solves
    P(no crossing before j, Z_j >= c_j) = a(t_j) - a(t_{j-1}) (:func:`_crossings`)."""
    spent = obf_spending(np.array(fractions), level)
    out: list[float] = []
    region: _Region | None = None
    for j, t in enumerate(fractions):
        step = float(spent[j] - (spent[j - 1] if j else 0.0))
        if step <= 1e-15:  # nothing to spend here: a look that cannot reject
            c = math.inf
        elif region is None:
            c = float(stats.norm.isf(step))
        else:
            r = region
            c = float(optimize.brentq(lambda c, r=r, t=t, a=step: r.cross(t, c * math.sqrt(t), 0.0) - a,
                                      float(stats.norm.isf(step)) - 3.0, 40.0, xtol=1e-9))
        out.append(c)
        b = c * math.sqrt(t)
        region = _Region.first(t, b, 0.0) if region is None else region.next(t, b, 0.0)
    return tuple(out)


CALIBRATION_DRAWS = 400_000
CALIBRATION_SEED = 42
CALIBRATION_LEVELS = np.geomspace(1e-4, 0.08, 41)


@functools.cache
def calibration(looks: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(levels, upper size): for each spending level of :data:`CALIBRATION_LEVELS`, the probability
    that a paired t test on normal differences with no effect crosses the level's boundaries at some
    look (the boundaries compared with the t p-value), plus two binomial SEs; estimated on
    :data:`CALIBRATION_DRAWS` null studies drawn with a fixed seed. The t statistics' joint law is
    not the z statistics' Brownian motion (their estimated SDs differ by look), so the boundaries of
    level ``a`` give a t test of size a little above ``a`` at small n (2-7% relative at 5-14
    replicates); :meth:`Design.calibrated` lowers the level until this upper size is within it."""
    rng = np.random.default_rng(CALIBRATION_SEED)
    n_max, idx = looks[-1], np.full(CALIBRATION_DRAWS, len(CALIBRATION_LEVELS))
    fractions = tuple(n / n_max for n in looks)
    nominal = np.array([stats.norm.sf(z_boundaries(fractions, float(a))) for a in CALIBRATION_LEVELS])
    for start in range(0, CALIBRATION_DRAWS, 100_000):
        d = rng.standard_normal((min(100_000, CALIBRATION_DRAWS - start), n_max))
        first = np.full(len(d), len(CALIBRATION_LEVELS))
        for j, n in enumerate(looks):
            mean, se, df = claims_mod.paired_stats(d[:, :n])
            p = claims_mod.directional_p(mean, se, df)[0]
            # the smallest calibration level whose boundary at look j this p-value crosses
            first = np.minimum(first, np.searchsorted(nominal[:, j], p, side="left"))
        idx[start:start + len(d)] = first
    size = np.array([np.mean(idx <= g) for g in range(len(CALIBRATION_LEVELS))])
    return CALIBRATION_LEVELS, size + 2 * np.sqrt(size * (1 - size) / CALIBRATION_DRAWS)


@dataclass(frozen=True)
class Design:
    """The planned looks (replicate counts ``looks``, increasing) and the overall one-sided level
    ``alpha`` of each of a paper's two procedures (held; contradicted)."""

    looks: tuple[int, ...]
    alpha: float = ALPHA

    def __post_init__(self) -> None:
        if not self.looks or list(self.looks) != sorted(set(self.looks)):
            raise ValueError(f"looks must be increasing replicate counts, got {self.looks}")
        if self.looks[0] < claims_mod.MIN_SEEDS:
            raise ValueError(f"the first look needs at least {claims_mod.MIN_SEEDS} replicates "
                             f"(a claim is judged over at least that many), got {self.looks[0]}")

    @classmethod
    def plan(cls, first: int, last: int, step: int, alpha: float = ALPHA) -> Design:
        """Looks at ``first, first + step, ...`` and ``last`` (always the last look)."""
        if step < 1:
            raise ValueError(f"--step must be at least 1, got {step}")
        if last < first:
            raise ValueError(f"--max ({last}) must be at least --min ({first})")
        looks = list(range(first, last, step)) + [last]
        return cls(tuple(looks), alpha)

    @property
    def fractions(self) -> tuple[float, ...]:
        return tuple(n / self.looks[-1] for n in self.looks)

    def calibrated(self, level: float) -> float:
        """The spending level whose boundaries give the t test a size of at most ``level``
        (:func:`calibration`: its simulated size plus two SEs), interpolated in log-log."""
        levels, upper = calibration(self.looks)
        if not levels[0] <= level <= levels[-1]:
            raise ValueError(f"level {level:g} outside the calibrated range "
                             f"[{levels[0]:g}, {levels[-1]:g}] (too many claims in one family?)")
        ok = upper > 0
        return float(np.exp(np.interp(np.log(level), np.log(upper[ok]), np.log(levels[ok]))))

    def z(self, level: float) -> np.ndarray:
        """The z boundaries the procedure uses for a test at ``level`` (calibrated)."""
        return np.array(z_boundaries(self.fractions, self.calibrated(float(level))))

    def nominal(self, level: float) -> np.ndarray:
        """The nominal one-sided p-value each look rejects at, for a test at ``level``."""
        return stats.norm.sf(self.z(level))

    def nominal_table(self, k: int) -> np.ndarray:
        """[sides - 1, m - 1, look]: the nominal level of a claim tested at ``alpha / (sides m)``
        (m = claims not yet rejected in its family, 1..k; sides 2: a two-sided opposite)."""
        return np.array([[self.nominal(self.alpha / (s * m)) for m in range(1, k + 1)]
                         for s in (1, 2)])

    def describe(self) -> dict[str, Any]:
        return {"looks": list(self.looks), "fractions": [round(t, 6) for t in self.fractions],
                "alpha": self.alpha, "spending": SPENDING,
                "spending_level_at_alpha": round(self.calibrated(self.alpha), 6),
                "z_boundaries_at_alpha": [round(float(c), 4) for c in self.z(self.alpha)],
                "nominal_p_at_alpha": [float(f"{a:.4g}") for a in self.nominal(self.alpha)]}


# -- the procedure (vectorised: the simulation tests call it on arrays of studies) ------------------
def sequential_holm(p: np.ndarray, design: Design, sides: np.ndarray | None = None,
                    start: np.ndarray | None = None) -> np.ndarray:
    """The look at which each claim of a family is rejected (-1: never) by the sequential Holm
    procedure (module docstring). ``p``: [..., looks, k] one-sided p-values (NaN: no test at that
    look; the claim stays in the family, so the others' levels never rise by it); the looks are
    the design's first ``p.shape[-2]``. ``sides`` [k] (1 or 2): a claim tested at
    ``alpha / (sides m)``. ``start`` [..., k]: looks already decided (-1 open), e.g. from earlier
    calls."""
    p = np.asarray(p, dtype=np.float64)
    *batch, n_looks, k = p.shape
    if n_looks > len(design.looks):
        raise ValueError(f"{n_looks} looks of p-values, the design plans {len(design.looks)}")
    sides = np.ones(k, dtype=int) if sides is None else np.asarray(sides, dtype=int)
    table = design.nominal_table(k) if k else np.zeros((2, 0, len(design.looks)))
    at = (np.full((*batch, k), -1, dtype=int) if start is None
          else np.array(start, dtype=int, copy=True))
    for j in range(n_looks):
        pj = np.nan_to_num(p[..., j, :], nan=2.0)
        while True:
            m = np.sum(at < 0, axis=-1, keepdims=True)  # open claims of the family
            level = table[sides - 1, np.maximum(m, 1) - 1, j]  # [..., k]
            new = (at < 0) & (pj <= level)
            if not new.any():
                break
            at = np.where(new, j, at)
    return at


def verdict_codes(held_at: np.ndarray, contra_at: np.ndarray) -> np.ndarray:
    """HELD / CONTRADICTED / OPEN from the looks of the two procedures: the earlier decision, held
    where both fall on the same look (the fixed rule's precedence)."""
    h = np.where(held_at < 0, np.iinfo(int).max, held_at)
    c = np.where(contra_at < 0, np.iinfo(int).max, contra_at)
    return np.where((held_at >= 0) & (h <= c), HELD, np.where(contra_at >= 0, CONTRADICTED, OPEN))


def power(effect: float, design: Design, level: float | None = None) -> float:
    """Probability that a claim whose true mean difference is ``effect`` standard deviations of one
    replicate's difference crosses a boundary at some look, tested alone at ``level`` (default
    alpha; the first Holm step of k claims: alpha / k), for a z statistic (known SD), by the
    recursive integration with the statistic's mean ``effect sqrt(n_j)`` at look j. The t tests of
    the real procedure lose against it at small n (docs/claims.md gives both)."""
    level = design.alpha if level is None else level
    drift = effect * math.sqrt(design.looks[-1])
    return float(sum(_crossings(design.fractions, list(design.z(level)), drift)))


def fixed_power_same_level(effect: float, n: int, level: float) -> float:
    """The fixed-sample paired t test's power at ``n`` replicates and ``level`` (the claims module's
    noncentral t, for comparison with :func:`power`)."""
    return claims_mod.power(effect, n, 1, level)


# -- one look on a study's claims --------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One claim at one look, as the sequential procedure needs it."""

    key: str
    paper: str
    family: str  # "paper" (the paper's own claims) or "ordering"; the Holm family is (paper, family)
    text: str
    direction: str
    status: str  # the fixed rule's status at this look (claims.json)
    n: int
    mean: float | None
    se: float | None
    df: float | None
    threshold: float | None

    @property
    def tested(self) -> bool:
        return self.status not in ("not evaluated", "not judged")


def rows_from_claims(doc: Mapping[str, Any]) -> list[Row]:
    """The adapter to ``fedpipe.claims``: one :class:`Row` per claim record of a ``claims.json``
    (:func:`fedpipe.claims.claims_metrics`; facts are not claims). A record's ``family`` is a
    label ("paper" / "ordering") where the claims module gives one, else every claim is its
    paper's ("family" was the Holm family's size)."""
    rows = []
    for r in doc.get("claims", []):
        if r.get("fact"):
            continue
        fam = r.get("family")
        rows.append(Row(key=r["key"], paper=r["paper"], family=fam if isinstance(fam, str) else "paper",
                        text=r["claim"], direction=r["direction"], status=r["status"],
                        n=int(r.get("n") or 0), mean=r.get("mean_diff"), se=r.get("se"),
                        df=r.get("df"), threshold=r.get("threshold")))
    return rows


def p_values(row: Row) -> tuple[float, float, int]:
    """(p of the claim, p of its opposite, sides of the opposite) from the claims module's tests;
    NaN without a test (fewer than 3 replicates, an arm missing, SE = 0). A match claim's
    opposite is the smaller of its two one-sided p-values, tested at half the level (sides 2)."""
    sides = 2 if row.direction == "match" else 1
    if not row.tested or row.se is None or row.mean is None or row.df is None or not row.se > 0:
        return math.nan, math.nan, sides
    if row.direction == "match":
        p, outside = claims_mod.equivalence_p(row.mean, row.se, row.df, row.threshold)
        return float(p), float(outside) / 2.0, sides
    shift = row.threshold if row.direction == "at_least" else 0.0
    p, p_opp = claims_mod.directional_p(row.mean + shift, row.se, row.df)
    return float(p), float(p_opp), sides


def decide(history: Sequence[Sequence[Row]], design: Design) -> dict[str, dict[str, Any]]:
    """The verdict of every claim after the looks in ``history`` (one list of rows per look, the
    same claims at each): {key: {status, look, n, level, t_bound, p, p_opposite}}; status "held" /
    "contradicted" (at the look given), "open" (undecided so far), "not evaluated" (no test at the
    last look and never decided: an arm or its metric missing, or fewer than 3 replicates)."""
    last = list(history[-1])
    keys = [r.key for r in last]
    families: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(last):
        if r.tested:
            families.setdefault((r.paper, r.family), []).append(i)
    out: dict[str, dict[str, Any]] = {}
    j_last = len(history) - 1
    for idx in families.values():
        fam_keys = [keys[i] for i in idx]
        pv = np.full((len(history), len(idx), 2), np.nan)
        sides = np.ones(len(idx), dtype=int)
        for j, rows in enumerate(history):
            by_key = {r.key: r for r in rows}
            for c, key in enumerate(fam_keys):
                if key in by_key:
                    p, po, s = p_values(by_key[key])
                    pv[j, c] = p, po
                    sides[c] = s
        held_at = sequential_holm(pv[..., 0], design)
        contra_at = sequential_holm(pv[..., 1], design, sides)
        codes = verdict_codes(held_at, contra_at)
        m_held, m_contra = int(np.sum(held_at < 0)), int(np.sum(contra_at < 0))
        for c, key in enumerate(fam_keys):
            row = last[idx[c]]
            status = {HELD: "held", CONTRADICTED: "contradicted", OPEN: "open"}[int(codes[c])]
            look = int(held_at[c] if codes[c] == HELD else contra_at[c] if codes[c] else -1)
            # the boundary this claim would face at the last look (its family's open count)
            level = design.alpha / max(m_held, 1)
            a = float(design.nominal(level)[j_last])
            t_bound = (float(stats.t.isf(a, row.df)) if row.df and math.isfinite(a) and a > 0
                       else None)
            out[key] = {"status": status, "look": look, "n_decided": design.looks[look]
                        if look >= 0 else None, "level": level, "nominal_p": a, "t_bound": t_bound,
                        "p": _finite(pv[j_last, c, 0]), "p_opposite": _finite(pv[j_last, c, 1]),
                        "opposite_level": design.alpha / max(m_contra, 1) / sides[c]}
    for r in last:
        if r.key not in out:
            out[r.key] = {"status": "not evaluated", "look": -1, "n_decided": None,
                          "reason": r.status}
    return out


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def all_decided(rows: Sequence[Row], verdicts: Mapping[str, Mapping[str, Any]]) -> bool:
    """Every tested claim of the papers' own family held or contradicted (the "ordering" family
    and claims that cannot be tested in this study do not hold the study back)."""
    return all(verdicts[r.key]["status"] in ("held", "contradicted")
               for r in rows if r.tested and r.family == "paper")


def look_table(rows: Sequence[Row], verdicts: Mapping[str, Mapping[str, Any]], n: int) -> str:
    """The table printed at a look: claim, n, mean, SE, boundary (the t the claim's statistic must
    reach at this look, and its nominal p), verdict."""
    lines = [f"{'claim':58s} {'n':>3s} {'mean':>10s} {'SE':>9s} {'t':>7s} {'bound':>7s} "
             f"{'p':>8s} {'p-level':>8s}  verdict"]
    for r in rows:
        v = verdicts[r.key]
        text = (r.key if len(r.key) <= 58 else r.key[:55] + "...")
        mean = "—" if r.mean is None else f"{r.mean:+.4g}"
        se = "—" if r.se is None else f"{r.se:.3g}"
        t = t_text(r.direction, r.mean, r.se, r.threshold)
        bound = "—" if v.get("t_bound") is None else f"{v['t_bound']:.2f}"
        p = "—" if v.get("p") is None else f"{v['p']:.3g}"
        lvl = "—" if v.get("nominal_p") is None else f"{v['nominal_p']:.3g}"
        verdict = v["status"]
        if verdict in ("held", "contradicted") and v["n_decided"] != n:
            verdict += f" (at n = {v['n_decided']})"
        lines.append(f"{text:58s} {r.n:3d} {mean:>10s} {se:>9s} {t:>7s} {bound:>7s} {p:>8s} "
                     f"{lvl:>8s}  {verdict}")
    return "\n".join(lines)


# -- the command -------------------------------------------------------------------------------------
def seeds_for(base: Sequence[int], n: int) -> list[int]:
    """The first ``n`` replicates: the study's own seeds, continued by the integers after them."""
    out = list(dict.fromkeys(int(s) for s in base))
    nxt = max(out, default=-1) + 1
    while len(out) < n:
        out.append(nxt)
        nxt += 1
    return out[:n]


def _seed_list(seeds: Sequence[int]) -> str:
    return "[" + ",".join(str(s) for s in seeds) + "]"


def look_command(study: str, seeds: Sequence[int], diffusion: bool, overrides: Sequence[str],
                 name: str | None = None) -> list[str]:
    """The ``dvc exp run`` of one look: the study, its first replicates (the diffusion track's too
    when the study has one), then the user's overrides."""
    cmd = ["dvc", "exp", "run"]
    if name:
        cmd += ["--name", name]
    cmd += ["-S", f"study={study}", "-S", f"study.seeds={_seed_list(seeds)}"]
    if diffusion:
        cmd += ["-S", f"study.diffusion_seeds={_seed_list(seeds)}"]
    for o in overrides:
        cmd += ["-S", o]
    return cmd


def _run_look(cmd: list[str], root: Path) -> tuple[int, list[str], float]:
    """Run a look's DVC command, its output passed through; (return code, stages run, seconds)."""
    t0 = time.monotonic()
    ran = []
    with subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            m = re.match(r"Running stage '([^']+)'", line)
            if m:
                ran.append(m.group(1))
        rc = proc.wait()
    return rc, ran, time.monotonic() - t0


def study_setup(root: Path, study: str, overrides: Sequence[str]) -> dict[str, Any]:
    """The study as composed with the user's overrides (checked before any run): its seeds and
    whether it has the diffusion track's replicates."""
    import tempfile

    from fedpipe.config.core import load_params
    from fedpipe.pipeline.compose import compose_params

    with tempfile.TemporaryDirectory() as tmp:
        path = compose_params(root, [f"study={study}", *overrides],
                              output=str(Path(tmp) / "params.yaml"))
        params = load_params(path)
    s = params["study"]
    seeds = [int(x) for x in s.get("seeds") or []]
    dseeds = s.get("diffusion_seeds")
    return {"seeds": seeds, "diffusion": bool(dseeds if dseeds is not None else seeds),
            "papers": s.get("papers")}


def parse(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m fedpipe.sequential", description=(
        "Run a study's replicates in steps until its papers' claims are held or contradicted "
        "(group-sequential: docs/claims.md, Sequential mode)."))
    ap.add_argument("study", help="a study of conf/study/ (e.g. fedddpm_smoke)")
    ap.add_argument("--min", type=int, required=True, dest="first", help="replicates at the first look")
    ap.add_argument("--max", type=int, required=True, dest="last", help="replicates at the last look")
    ap.add_argument("--step", type=int, required=True, help="replicates added per look")
    ap.add_argument("-S", dest="overrides", action="append", default=[],
                    help="an override as dvc exp run -S takes it (repeatable)")
    ap.add_argument("--json", default=None,
                    help="where to write the record (default data/sequential/<study>/sequential.json)")
    ap.add_argument("--design", action="store_true",
                    help="print the planned looks and boundaries and run nothing")
    return ap.parse_args(list(argv))


def run(argv: Sequence[str], root: Path | None = None) -> int:
    args = parse(argv)
    root = Path(root or ".").resolve()
    try:
        design = Design.plan(args.first, args.last, args.step)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not (root / "conf" / "study" / f"{args.study}.yaml").is_file():
        known = sorted(p.stem for p in (root / "conf" / "study").glob("*.yaml"))
        print(f"error: no study {args.study!r} in conf/study/ (one of: {', '.join(known)})",
              file=sys.stderr)
        return 2
    bad = [o for o in args.overrides if re.match(r"\+*study(\.(diffusion_)?seeds)?=", o)]
    if bad:
        print(f"error: {bad[0]!r}: the study and its replicates are set by the command "
              "(the study argument, --min/--max/--step)", file=sys.stderr)
        return 2
    d = design.describe()
    print(f"sequential {args.study}: looks at {d['looks']} replicates, one-sided α = {design.alpha} "
          f"per paper (held; contradicted), {SPENDING}; z boundaries at α: "
          f"{d['z_boundaries_at_alpha']}, nominal p: {d['nominal_p_at_alpha']}")
    if args.design:
        return 0
    from fedpipe.errors import CompositionError

    try:
        setup = study_setup(root, args.study, args.overrides)
    except CompositionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.json) if args.json else root / "data" / "sequential" / args.study / "sequential.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"study": args.study, "overrides": list(args.overrides),
                              "design": d, "looks": [], "verdicts": {}, "stopped": None}
    history: list[list[Row]] = []
    t_start = time.monotonic()
    env_note = os.environ.get("FEDPIPE_THREADS")
    for j, n in enumerate(design.looks):
        seeds = seeds_for(setup["seeds"], n)
        cmd = look_command(args.study, seeds, setup["diffusion"], args.overrides,
                           name=f"{args.study}-seq{n}")
        subprocess.run(["dvc", "exp", "remove", f"{args.study}-seq{n}"], cwd=root,
                       capture_output=True)  # a name from an earlier sequential run
        print(f"== look {j + 1} of {len(design.looks)}: n = {n}: {' '.join(cmd)}", flush=True)
        rc, ran, seconds = _run_look(cmd, root)
        if rc != 0:
            print(f"error: look {j + 1} (n = {n}) failed: dvc exp run exited {rc}", file=sys.stderr)
            record["stopped"] = f"dvc exp run failed at n = {n}"
            _write(out, record)
            return 1
        doc = json.loads((root / CLAIMS_JSON).read_text())
        rows = rows_from_claims(doc)
        history.append(rows)
        verdicts = decide(history, design)
        done = all_decided(rows, verdicts)
        final = done or j == len(design.looks) - 1
        if final:  # what is still open at the last look is not shown
            for v in verdicts.values():
                if v["status"] == "open":
                    v["status"] = "not shown"
        print(look_table(rows, verdicts, n))
        record["looks"].append({"n": n, "seeds": seeds, "seconds": round(seconds, 1),
                                "stages_run": ran, "threads": env_note,
                                "claims": [{**_row_json(r), **verdicts[r.key]} for r in rows]})
        record["verdicts"] = verdicts
        record["seconds"] = round(time.monotonic() - t_start, 1)
        if final:
            record["stopped"] = ("every claim of the papers decided" if done
                                 else "maximum replicates reached")
            _write(out, record)
            counts = {s: sum(v["status"] == s for v in verdicts.values())
                      for s in ("held", "contradicted", "not shown", "not evaluated")}
            print(f"stopped at n = {n}: {record['stopped']}; {counts}; {out}")
            return 0
        _write(out, record)
    return 0  # pragma: no cover (the loop returns at its last look)


def _row_json(r: Row) -> dict[str, Any]:
    return {"key": r.key, "paper": r.paper, "family": r.family, "claim": r.text,
            "direction": r.direction, "fixed_rule_status": r.status, "n": r.n, "mean": r.mean,
            "se": r.se, "df": r.df, "threshold": r.threshold}


def _write(path: Path, record: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=float) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
