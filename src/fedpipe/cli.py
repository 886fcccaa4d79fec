"""Entry-point helper for stage scripts: logging set-up and one-line errors with exit code 2."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

from fedpipe.config import ConfigError
from fedpipe.data import DatasetNotFoundError
from fedpipe.errors import DivergenceError, SkippedStageError

EXIT_CONFIG = 2
EXIT_DIVERGED = 3


def stage_argument(argv: list[str], name: str) -> str:
    """The single positional argument of a stage script (e.g. the algorithm of `federate@x`)."""
    return stage_arguments(argv, name)[0]


def stage_arguments(argv: list[str], *names: str) -> list[str]:
    """The positional arguments ``names`` of a stage script (e.g. algorithm and seed)."""
    if len(argv) != len(names) + 1:
        raise ConfigError(" ".join(names), argv[1:], f"exactly the arguments: {' '.join(names)}")
    return argv[1:]


THREADS_ENV = "FEDPIPE_THREADS"


def set_threads() -> None:
    """``FEDPIPE_THREADS`` (an integer >= 1) sets torch's thread count for the stage; unset, torch
    uses one per core. Results are bit-identical only at the same thread count (it is logged with
    every MLflow run); set 1 when experiments run side by side (``dvc queue start -j 2``)."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(THREADS_ENV, raw, "an integer >= 1 (torch threads per stage)")
    import torch

    torch.set_num_threads(int(raw))


def run_stage(main: Callable[[], None]) -> None:
    """Run a stage's ``main``; bad params or missing data print one line and exit with code 2."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("alembic", "mlflow", "urllib3", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        set_threads()
        main()
    except (ConfigError, DatasetNotFoundError, SkippedStageError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    except DivergenceError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_DIVERGED)
