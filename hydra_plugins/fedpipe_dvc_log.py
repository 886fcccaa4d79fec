"""Drops one DVC warning that a user cannot act on from ``dvc exp run -S ...``.

Every experiment starts with DVC checking out the outputs that ``dvc.lock`` records
(``dvc/repo/experiments/executor/base.py``: ``checkout(force=True, allow_missing=True)``, skipped only
by ``--dry``). An output of a stage that ``dvc.lock`` does not list yet (any stage the new params
add: another algorithm, another replicate, a new study's stages) has no hash to check out, and
dvc-data warns once per such output: "No file hash info found for '<path>'. It won't be created."
(six per federate stage: several hundred for a smoke study of eight replicates). The stage then runs
and writes that output: nothing is missing, and the user can do nothing about it. DVC has no
option to skip that checkout or that warning (``-q`` silences all of DVC's output, stage logs
included).

DVC loads the Hydra plugins of ``hydra_plugins/`` (see ``fedpipe_overrides.py``) in its own process
before ``dvc exp run -S`` composes params.yaml, which comes before that checkout. Importing this
module filters exactly that record of dvc-data's checkout loggers; every other message passes. A
queued experiment (``--queue``) checks out in a worker process that loads no plugins: its log
(``dvc queue logs``) keeps the warnings.
"""

from __future__ import annotations

import logging

MESSAGE = "No file hash info found for "
LOGGERS = ("dvc_data.index.checkout", "dvc_data.hashfile.checkout")


def unactionable(record: logging.LogRecord) -> bool:
    """Whether ``record`` is dvc-data's warning about an output that dvc.lock does not list."""
    return record.levelno == logging.WARNING and str(record.msg).startswith(MESSAGE)


class NoHashInfoFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not unactionable(record)


def _install() -> None:
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, NoHashInfoFilter) for f in logger.filters):
            logger.addFilter(NoHashInfoFilter())


_install()
