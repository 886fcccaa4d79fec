"""Entry-point helper for stage scripts: logging set-up and one-line errors with exit code 2."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

from fedpipe.config import ConfigError
from fedpipe.data import DatasetNotFoundError
from fedpipe.errors import DivergenceError, InputError, SkippedStageError

EXIT_CONFIG = 2
EXIT_DIVERGED = 3


def stage_argument(argv: list[str], name: str) -> str:
    """The single positional argument of a stage script (e.g. the algorithm of `federate@x`)."""
    return stage_arguments(argv, name)[0]


def stage_arguments(argv: list[str], *names: str) -> list[str]:
    """The positional arguments ``names`` of a stage script (e.g. algorithm and seed).

    Run by DVC, a matrix stage gets none: dvc.yaml's ``cmd`` holds no params (DVC runs it through a
    shell, and params are data, never shell code); the values come from the stage's own name,
    which DVC passes in the environment variable ``DVC_STAGE`` (``federate@<algorithm>-<seed>``:
    DVC joins the matrix values with ``-``; the last one, the seed, has no ``-``). By hand, give
    them as arguments: ``python stages/federate.py fedavg 0``.
    """
    if len(argv) == 1 and os.environ.get("DVC_STAGE"):
        return matrix_values(os.environ["DVC_STAGE"], len(names))
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


def matrix_values(stage: str, n: int) -> list[str]:
    """The ``n`` matrix values of DVC stage address ``stage`` (``[dvc.yaml:]name@v1-...-vn``)."""
    name = stage.split(":", 1)[1] if ":" in stage.split("@", 1)[0] else stage
    _, at, key = name.partition("@")
    values = key.rsplit("-", n - 1) if at else []
    if len(values) != n or not all(values):
        raise ConfigError("DVC_STAGE", stage, f"a matrix stage address <name>@<{n} values joined "
                          "by '-'> (or give the values as arguments)")
    return values


def run_stage(main: Callable[[], None]) -> None:
    """Run a stage's ``main``; bad params or missing data print one line and exit with code 2."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("alembic", "mlflow", "urllib3", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        set_threads()
        main()
    except (ConfigError, DatasetNotFoundError, InputError, SkippedStageError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    except DivergenceError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_DIVERGED)
