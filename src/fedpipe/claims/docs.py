"""The per-study claims tables of docs/results.md, generated from each study's ``claims.json`` (issue
42: text and table cannot drift). ``make claims-docs`` runs ``python -m fedpipe.claims --collect
<studies> --update-docs docs/results.md``: it copies each study's claims.json from its DVC experiment
(``make smoke`` names them after the studies) to ``docs/runs/<study>.claims.json`` where one exists,
and rewrites every block of docs/results.md between ``<!-- claims: <study> -->`` and
``<!-- /claims -->`` from that file, or, without one, with a line saying the study needs a re-run.
``python -m fedpipe.claims --markdown <claims.json> ...`` prints the same tables.

A block between ``<!-- sequential: <study> -->`` and ``<!-- /sequential -->`` is rewritten the same way
from ``docs/runs/<study>.sequential.json``, the record ``python -m fedpipe.sequential`` writes
(``--json``): the design, one row per look (replicates, seconds, stages DVC ran) and the verdict of
every claim at the last look, with the look it was decided at."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedpipe.claims import _by_family, resolution_text, summary, summary_line

RUNS_DIR = Path("docs/runs")
BLOCK = re.compile(r"(<!-- (?P<kind>claims|sequential): (?P<study>[A-Za-z0-9_.]+) -->\n)(?P<body>.*?)"
                   r"(?P<end><!-- /(?P=kind) -->)", re.S)


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:+.4g}"


def _difference(r: Mapping[str, Any]) -> str:
    if r.get("mean_diff") is None:
        return "—"
    out = _num(r["mean_diff"])
    if r.get("se") is not None:
        out += f" ± {r['se']:.2g}"
    if r.get("ci95"):
        out += f" [{r['ci95'][0]:+.3g}, {r['ci95'][1]:+.3g}]"
    return out


def _verdict(r: Mapping[str, Any]) -> str:
    st = r["status"]
    if st in ("held", "contradicted"):
        p = r.get("p_holm") if st == "held" else r.get("p_opposite_holm")
        return f"**{st}** (Holm p {p:.2g})" if p is not None else f"**{st}**"
    if r.get("resolution"):
        words = resolution_text(r["resolution"], r.get("upper_bound"), _effect(r), r.get("n_for_power"))
        return f"{st}, {words} (Holm p {r['p_holm']:.2g})" if r.get("p_holm") is not None else st
    if st == "not shown" and r.get("p") is None:
        return "not shown (SE = 0: no test)"
    return f"{st} (Holm p {r['p_holm']:.2g})" if r.get("p_holm") is not None else st


def _effect(r: Mapping[str, Any]) -> float | None:
    pe = r.get("paper_effect")
    return pe.get("value") if isinstance(pe, Mapping) else None


def markdown(doc: Mapping[str, Any]) -> list[str]:
    """One table per family of each paper (the paper's claims, then its orderings), with the summary
    line, from a claims.json document; facts listed after."""
    claims = doc.get("claims", [])
    s = summary(claims)
    lines = [f"{summary_line(s)} (all families)."]
    if doc.get("stand_in"):
        lines += ["", f"> {doc['stand_in']}"]
    if claims and "quote" not in claims[0]:
        lines += ["", "This claims.json predates issue 42 (one family per paper, no quotes or paper's "
                      "effects): its verdicts are those of the old families; re-run the study."]
    for label, rs in _by_family(claims).items():
        lines += ["", f"**{label}**: {summary_line(summary(rs))}.", "",
                  "| claim | the paper's numbers | paper's effect (our units) | difference ± SE "
                  "[95% CI] (positive = the paper's way) | n | verdict |",
                  "|---|---|---|---|---|---|"]
        for r in rs:
            lines.append(f"| {r['claim']} | {r.get('source', '')} | {_num(_effect(r))} | "
                         f"{_difference(r)} | {r.get('n', '—')} | {_verdict(r)} |")
    facts = doc.get("fact_records", [])
    if facts:
        lines += ["", "Facts (never counted as claims): " + "; ".join(
            f"{f['claim']}: {f['status']} ({f.get('reason', '')})" for f in facts) + "."]
    return lines


def t_text(direction: str, mean: float | None, se: float | None, threshold: float | None) -> str:
    """A claim's t statistic as the sequential tables print it: ``TOST`` for a match claim (two
    one-sided tests, no single t), the difference shifted by the threshold for an ``at_least``
    claim, ``—`` without a test."""
    if direction == "match":
        return "TOST"
    if not se or mean is None:
        return "—"
    shift = (threshold or 0.0) if direction == "at_least" else 0.0
    return f"{(mean + shift) / se:.2f}"


def _seq_verdict(v: Mapping[str, Any], n_last: int) -> str:
    st = v["status"]
    if st in ("held", "contradicted"):
        return f"**{st}** at n = {v['n_decided']}"
    if st == "not evaluated":
        return f"not evaluated ({v.get('reason', 'no test')})"
    return f"{st} at n = {n_last}"


def sequential_markdown(record: Mapping[str, Any]) -> list[str]:
    """The design, the looks and every claim's sequential verdict from a sequential.json record
    (:func:`fedpipe.sequential.run`); a record whose run has not reached its last look says so."""
    d, looks = record["design"], record.get("looks", [])
    z = ", ".join(f"{x:.3g}" for x in d["z_boundaries_at_alpha"])
    p = ", ".join(f"{x:.3g}" for x in d["nominal_p_at_alpha"])
    over = " ".join(f"`{o}`" for o in record.get("overrides", []))
    lines = [f"Design: looks at {d['looks']} replicates, one-sided α = {d['alpha']} per paper and "
             f"family, {d['spending']} (spending level {d['spending_level_at_alpha']:.4g}, "
             f"calibrated); z boundaries at α {z} (nominal p {p})."
             + (f" Overrides: {over}." if over else "")]
    if not looks:
        return lines + ["", "No look has finished yet."]
    stopped = record.get("stopped") or (f"still running after look {len(looks)} of "
                                        f"{len(d['looks'])}: the verdicts are those so far")
    lines += ["", f"Stopped: {stopped}, after {record.get('seconds', 0):,.0f} s.", "",
              "| look | replicates | seconds | stages run |", "|---|---|---|---|"]
    for j, look in enumerate(looks):
        ran = look.get("stages_run", [])
        lines.append(f"| {j + 1} | {look['n']} | {look['seconds']:,.0f} | {len(ran)} |")
    last = looks[-1]
    n_last = last["n"]
    by_family: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for c in last["claims"]:
        by_family.setdefault((c["paper"], c["family"]), []).append(c)
    for (paper, family), cs in by_family.items():
        label = paper if family == "paper" else f"{paper} · orderings among baselines and controls"
        counts = {s: sum(c["status"] == s for c in cs) for s in ("held", "contradicted")}
        lines += ["", f"**{label}**: {counts['held']} of {len(cs)} held, {counts['contradicted']} "
                      f"contradicted at n = {n_last}.", "",
                  "| claim | n | difference ± SE (positive = the paper's way) | t | t to cross | p "
                  "| nominal p | verdict |", "|---|---|---|---|---|---|---|---|"]
        for c in cs:
            diff = "—" if c.get("mean") is None else _num(c["mean"])
            if c.get("se") is not None and c.get("mean") is not None:
                diff += f" ± {c['se']:.2g}"
            t = t_text(c["direction"], c.get("mean"), c.get("se"), c.get("threshold"))
            bound = "—" if c.get("t_bound") is None else f"{c['t_bound']:.2f}"
            pv = "—" if c.get("p") is None else f"{c['p']:.2g}"
            lvl = "—" if c.get("nominal_p") is None else f"{c['nominal_p']:.2g}"
            lines.append(f"| {c['claim']} | {c['n']} | {diff} | {t} | {bound} | {pv} | {lvl} | "
                         f"{_seq_verdict(c, n_last)} |")
    return lines


def missing(study: str, runs: Path) -> list[str]:
    return [f"No claims.json of {study} on disk ({runs / f'{study}.claims.json'}): this study needs "
            f"a re-run under the current claims (`dvc exp run -S study={study}`, then `make "
            "claims-docs`)."]


def update(md_path: Path, runs: Path = RUNS_DIR) -> tuple[str, list[str]]:
    """The text of ``md_path`` with every claims block regenerated, and the studies without a
    claims.json (whose blocks say so)."""
    from fedpipe.io import read_json

    text, needed = md_path.read_text(), []

    def fill(m: re.Match) -> str:
        study = m["study"]
        path = runs / f"{study}.{'claims' if m['kind'] == 'claims' else 'sequential'}.json"
        if path.is_file():
            doc = read_json(path)
            body = markdown(doc) if m["kind"] == "claims" else sequential_markdown(doc)
        elif m["kind"] == "sequential":
            needed.append(f"{study} (sequential)")
            body = [f"No sequential record of {study} on disk ({path}): `python -m "
                    f"fedpipe.sequential {study} ... --json {path}`."]
        else:
            needed.append(study)
            body = missing(study, runs)
        return (m.group(1) + "<!-- generated by `make claims-docs` from "
                f"{path.as_posix()}: do not edit -->\n" + "\n".join(body) + "\n"
                + m["end"])

    return BLOCK.sub(fill, text), needed
