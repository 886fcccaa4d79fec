"""Print the claims of one or more reports: ``python -m fedpipe.claims [data/report/claims.json ...]``,
or of DVC experiments by name: ``python -m fedpipe.claims --exp <name> ...`` (the report's claims.json
as that experiment committed it; ``make smoke`` names each after its study). Per paper its summary
line ("k of n held, m contradicted, j not shown"), then one line per claim: verdict, claim, the mean
difference with its 95% t-interval, the Holm-adjusted p-value and each arm's per-replicate values; the
facts after. ``--markdown <claims.json>...`` prints the per-family tables of docs/results.md, and
``[--collect <study>...] [--update-docs docs/results.md]`` regenerates them there
(:mod:`fedpipe.claims.docs`; ``make claims-docs``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fedpipe.claims import _by_family, paper_summaries, resolution_text, summary
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
    if record.get("resolution"):
        effect = (record.get("paper_effect") or {}).get("value")
        diff += "  " + resolution_text(record["resolution"], record.get("upper_bound"), effect,
                                       record.get("n_for_power"))
    return f"  [{record['status'].upper():13s}] {record['claim']}{diff}  ({_arms(record)})"


def describe_fact(record: dict) -> str:
    return f"  [FACT {record['status'].upper():8s}] {record['claim']}  ({_arms(record)})"


CLAIMS = "data/report/claims.json"


def _load(source: str, exp: bool) -> dict | None:
    """The claims document of a file, or of a DVC experiment (kept in git: ``cache: false``)."""
    if not exp:
        return read_json(source) if Path(source).is_file() else None
    import dvc.api
    from dvc.exceptions import DvcException
    from dvc.scm import RevError

    try:
        return json.loads(dvc.api.read(CLAIMS, repo=".", rev=source))
    except (DvcException, RevError, FileNotFoundError):
        return None


def generate(argv: list[str]) -> int:
    """``--markdown FILE...``: print each claims.json's tables; ``[--collect STUDY...]
    [--update-docs MD]``: copy each study's claims.json from its DVC experiment to docs/runs/, then
    regenerate the claims blocks of MD (fedpipe.claims.docs)."""
    from fedpipe.claims import docs
    from fedpipe.io import write_json

    if argv[0] == "--markdown":
        for source in argv[1:]:
            doc = _load(source, False)
            if doc is None:
                print(f"error: no claims in {source}", file=sys.stderr)
                return 2
            print("\n".join(docs.markdown(doc)))
        return 0
    studies, target, i = [], None, 0
    while i < len(argv):
        if argv[i] == "--collect":
            i += 1
            while i < len(argv) and not argv[i].startswith("--"):
                studies.append(argv[i])
                i += 1
        elif argv[i] == "--update-docs" and i + 1 < len(argv):
            target, i = Path(argv[i + 1]), i + 2
        else:
            print(f"error: unknown argument {argv[i]!r} (--collect STUDY... --update-docs MD)",
                  file=sys.stderr)
            return 2
    for study in studies:
        doc = _load(study, True)
        if doc is None:
            print(f"{study}: no experiment of that name with a claims.json; kept what is on disk")
            continue
        write_json(docs.RUNS_DIR / f"{study}.claims.json", doc)
        print(f"{study}: claims.json -> {docs.RUNS_DIR / f'{study}.claims.json'}")
    if target is not None:
        if not target.is_file():
            print(f"error: {target}: no such file", file=sys.stderr)
            return 2
        text, needed = docs.update(target)
        target.write_text(text)
        print(f"{target}: claims blocks regenerated" + (
            f"; no claims.json (re-run needed): {', '.join(needed)}" if needed else ""))
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("--markdown", "--collect", "--update-docs"):
        return generate(argv)
    exp = bool(argv) and argv[0] == "--exp"
    sources = argv[1:] if exp else argv
    if exp and not sources:
        print("error: --exp needs an experiment name (dvc exp list)", file=sys.stderr)
        return 2
    for source in sources or [CLAIMS]:
        doc = _load(source, exp)
        if doc is None:
            where = f"experiment {source!r} (dvc exp list; did it fail? dvc queue logs {source})" \
                if exp else f"{source} (run the report stage first)"
            print(f"error: no claims in {where}", file=sys.stderr)
            return 2
        path = f"{source}:{CLAIMS}" if exp else source
        claims, facts = doc["claims"], doc.get("fact_records", [])
        s = summary(claims)
        print(f"{path}: {s['held']} of {s['claims']} claims held, {s['contradicted']} contradicted, "
              f"{s['not_shown']} not shown ({len(facts)} facts apart)")
        if doc.get("stand_in"):  # the report's note: these numbers judge nothing
            print(f" {doc['stand_in']}")
        lines = paper_summaries(claims)
        for label, records in _by_family(claims).items():
            print(f" {label}: {lines[label]}")
            for record in records:
                print(describe(record))
        for record in facts:
            print(describe_fact(record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
