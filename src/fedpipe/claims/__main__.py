"""Print the claims of one or more reports: ``python -m fedpipe.claims [data/report/claims.json ...]``
(``make smoke`` calls it after each smoke study). One line per claim: verdict, paper, claim, and the
mean difference ± SE over the seeds with each arm's per-seed values."""

from __future__ import annotations

import sys
from pathlib import Path

from fedpipe.claims import absent_papers
from fedpipe.io import read_json


def describe(record: dict) -> str:
    verdict = "HELD" if record["held"] else record["status"].upper()
    diff = ("" if record["mean_diff"] is None else
            f"  diff {record['mean_diff']:+.4g}" + (f" ± {record['se']:.4g}" if record["se"] else ""))
    arms = "; ".join(f"{arm}: " + ", ".join("nan" if v is None else f"{v:.4g}" for v in vals.values())
                     for arm, vals in record["values"].items())
    return f"  [{verdict:13s}] {record['paper']}: {record['claim']}{diff}  ({arms})"


def main(paths: list[str]) -> int:
    for path in paths or ["data/report/claims.json"]:
        if not Path(path).is_file():
            print(f"error: no claims at {path} (run the report stage first)", file=sys.stderr)
            return 2
        doc = read_json(path)
        s = doc["summary"]
        print(f"{path}: {s['held']} of {s['claims']} claims held")
        absent = absent_papers(doc["claims"])
        for record in doc["claims"]:
            if record["paper"] not in absent:
                print(describe(record))
        if absent:
            print("  not in this study: " + "; ".join(f"{p} ({n} claims)" for p, n in absent.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
