"""Print the claims of one or more reports: ``python -m fedpipe.claims [data/report/claims.json ...]``
(``make smoke`` calls it after each smoke study). Per paper its summary line ("k of n held, m
contradicted, j not shown"), then one line per claim: verdict, claim, the mean difference with its
95% t-interval, the Holm-adjusted p-value and each arm's per-replicate values; the facts after."""

from __future__ import annotations

import sys
from pathlib import Path

from fedpipe.claims import paper_summaries, summary
from fedpipe.io import read_json


def _arms(record: dict) -> str:
    return "; ".join(f"{arm}: " + ", ".join("nan" if v is None else f"{v:.4g}" for v in vals.values())
                     for arm, vals in record["values"].items())


def describe(record: dict) -> str:
    diff = ""
    if record["mean_diff"] is not None:
        diff = f"  diff {record['mean_diff']:+.4g}"
        if record.get("ci95"):
            lo, hi = record["ci95"]
            diff += f" [{lo:+.4g}, {hi:+.4g}]"
    if record.get("p_holm") is not None:
        diff += f"  p(Holm) {record['p_holm']:.3g}"
    return f"  [{record['status'].upper():13s}] {record['claim']}{diff}  ({_arms(record)})"


def describe_fact(record: dict) -> str:
    return f"  [FACT {record['status'].upper():8s}] {record['claim']}  ({_arms(record)})"


def main(paths: list[str]) -> int:
    for path in paths or ["data/report/claims.json"]:
        if not Path(path).is_file():
            print(f"error: no claims at {path} (run the report stage first)", file=sys.stderr)
            return 2
        doc = read_json(path)
        claims, facts = doc["claims"], doc.get("fact_records", [])
        s = summary(claims)
        print(f"{path}: {s['held']} of {s['claims']} claims held, {s['contradicted']} contradicted, "
              f"{s['not_shown']} not shown ({len(facts)} facts apart)")
        lines = paper_summaries(claims)
        for paper, line in lines.items():
            print(f" {paper}: {line}")
            for record in claims:
                if record["paper"] == paper:
                    print(describe(record))
        for record in facts:
            print(describe_fact(record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
