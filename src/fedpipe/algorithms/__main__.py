"""``python -m fedpipe.algorithms``: every registered method and the hooks it changes, by where they
run (the table in docs/architecture.md). ``--write <file>`` puts the table in ``<file>`` between its
``<!-- hook-table: begin -->`` and ``<!-- hook-table: end -->`` lines instead (a new method's row)."""

import sys
from pathlib import Path

from fedpipe.algorithms import ALGORITHMS
from fedpipe.fl.strategy import hook_table

BEGIN, END = "<!-- hook-table: begin -->\n", "<!-- hook-table: end -->"


def write_table(path: Path, table: str) -> None:
    """Replace the table between the markers of ``path`` (written whole, atomically)."""
    from fedpipe.io import write_text

    doc = path.read_text()
    if BEGIN not in doc or END not in doc:
        sys.exit(f"error: {path} has no {BEGIN.strip()} ... {END} lines to put the table between")
    head, rest = doc.split(BEGIN, 1)
    write_text(path, head + BEGIN + table + END + rest.split(END, 1)[1])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        write_table(Path(sys.argv[2]), hook_table(ALGORITHMS))
    elif len(sys.argv) == 1:
        print(hook_table(ALGORITHMS), end="")
    else:
        sys.exit("usage: python -m fedpipe.algorithms [--write docs/architecture.md]")
