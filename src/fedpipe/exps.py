"""``python -m fedpipe.exps`` (``make exps``): DVC's experiments as one compact table, readable in a
120-column terminal: one row per experiment (the workspace, each branch and each ``dvc exp run``),
with the dataset, partition and rounds it ran, the params that differ between the rows (what a
sweep's ``-S`` overrides changed, a column each) and each classification method's final global test
accuracy (``data/evaluate/metrics.json``), and its claim count (``data/report/claims.json``); when
that is wider than the terminal (a study of many methods), a column per experiment instead.

Plain ``dvc exp show`` has a column per param and metric of every stage (over a thousand); its
``--drop/--keep`` recipe in the README keeps the same columns under their full names, which is
wider than 120 columns with four methods. Here a method's column is headed by its name alone. The
rows come from DVC's own API (:func:`dvc.api.exp_show`), so what it reads is what ``dvc exp show``
reads; a cell a row lacks is ``-``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# (header, key in DVC's row) of the leading columns; the methods' accuracies follow
FIXED = (("dataset", "dataset.name"), ("partition", "partition.scheme"),
         ("alpha", "partition.alpha"), ("rounds", "fl.rounds"))
ACCURACY = re.compile(r"^([a-z0-9_]+)\.test_accuracy$")  # data/evaluate/metrics.json's mean


def _cell(value: Any) -> str:
    if value is None or value in ("", "None"):  # DVC gives a null param as "None"
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if value < 1 or not value.is_integer() else f"{value:g}"
    return str(value)


def _grid(lines: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
                     for r in lines)


def varying(rows: list[Mapping[str, Any]], params: Iterable[str]) -> list[str]:
    """The keys of ``params`` (param names, as DVC's rows hold them) whose cells differ between
    ``rows``, other than the leading columns': what a sweep's ``-S`` overrides changed."""
    fixed = {k for _, k in FIXED}
    return sorted(k for k in set(params) - fixed
                  if len({_cell(row.get(k)) for row in rows}) > 1)


def table(rows: Iterable[Mapping[str, Any]], width: int = 120,
          params: Iterable[str] = ()) -> str:
    """The compact table of DVC's experiment rows (:func:`dvc.api.exp_show`'s dicts): a row per
    experiment, with a column per param of ``params`` whose value differs between the rows
    (:func:`varying`); where that is wider than ``width`` (many methods), a column per
    experiment."""
    rows = list(rows)
    methods = sorted({m.group(1) for row in rows for k in row if (m := ACCURACY.match(k))})
    swept = varying(rows, params)
    header = ["experiment", *(h for h, _ in FIXED), *swept, *methods, "held"]
    body = []
    for row in rows:
        name = row.get("Experiment") or row.get("rev") or "-"
        held = (f"{row.get('summary.held', 0):.0f}/{row['summary.claims']:.0f}"
                if isinstance(row.get("summary.claims"), (int, float)) else "-")
        body.append([str(name)[:24], *(_cell(row.get(k)) for _, k in FIXED),
                     *(_cell(row.get(k)) for k in swept),
                     *(_cell(row.get(f"{m}.test_accuracy")) for m in methods), held])
    wide = _grid([header, *body])
    if max(len(line) for line in wide.splitlines()) <= width:
        return wide
    return _grid([list(col) for col in zip(header, *body, strict=True)])  # transposed


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        sys.exit(f"error: python -m fedpipe.exps takes no arguments, got {' '.join(argv)}")
    import shutil

    import dvc.api
    from dvc.exceptions import DvcException

    try:
        rows = dvc.api.exp_show()
    except DvcException as err:  # not a DVC repository (or no git), a broken one
        sys.exit(f"error: no DVC experiments to show in {Path.cwd()}: {err}; run `make exps` in "
                 "the fedpipe repository")
    print(table(rows, max(shutil.get_terminal_size((120, 24)).columns, 80), param_keys(rows)))


def param_keys(rows: Iterable[Mapping[str, Any]]) -> set[str]:
    """The keys of DVC's rows that are params: the workspace's params.yaml flattened (DVC's own
    names), as ``params.yaml:<key>`` where DVC names it so (a metric has the same name)."""
    from fedpipe.config.core import ConfigError, load_params
    from fedpipe.tracking import flatten

    try:
        keys = set(flatten(load_params()))
    except (ConfigError, OSError):
        return set()
    present = {k for row in rows for k in row}
    named = {key: f"params.yaml:{key}" if f"params.yaml:{key}" in present else key for key in keys}
    return {k for k in named.values() if k in present}


if __name__ == "__main__":
    main()
