"""``python -m fedpipe.algorithms``: every registered method and the hooks it changes, by where they
run (the table in docs/architecture.md)."""

from fedpipe.algorithms import ALGORITHMS
from fedpipe.fl.strategy import hook_table

print(hook_table(ALGORITHMS), end="")
