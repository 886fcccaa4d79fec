"""Entry-point helper for stage scripts: logging set-up (log lines printed above the progress bars,
never onto them), one-line errors with exit code 2, and Ctrl-C as one line saying what was kept and how
to resume, with exit code 130."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from fedpipe.config import ConfigError
from fedpipe.data import DatasetNotFoundError
from fedpipe.errors import DivergenceError, InputError, SkippedStageError

EXIT_CONFIG = 2
EXIT_DIVERGED = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C

_KEPT: list[str] = []  # what the running stage keeps when interrupted (see keep_on_interrupt)


def keep_on_interrupt(what: str) -> None:
    """Register what an interrupted stage keeps, e.g. ``"checkpoint kept in data/checkpoints/..."``;
    :func:`run_stage` names it in its one line on Ctrl-C."""
    if what not in _KEPT:
        _KEPT.append(what)


def interrupted_message() -> str:
    """The one line printed when a stage is interrupted."""
    if _KEPT:
        return f"interrupted: {'; '.join(_KEPT)}; run `dvc repro` to resume"
    return ("interrupted: no partial result kept (outputs are written only when the stage finishes, "
            "the earlier ones are unchanged); run `dvc repro` to run it again")


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


def failed_experiment_hint() -> str | None:
    """The way back after a stage of a ``dvc exp run`` in the workspace fails: DVC has already written
    the experiment's params.yaml, deleted the outputs of the failed stage and updated dvc.lock for
    the stages before it. None outside ``dvc exp run``, or in a queued experiment's temporary copy
    (which DVC deletes; the workspace is untouched)."""
    from pathlib import Path

    if "DVC_EXP_NAME" not in os.environ:
        return None
    if ".dvc/tmp/exps/" in Path.cwd().resolve().as_posix() + "/":
        return None
    return ("hint: the workspace now holds this experiment's params.yaml, and the failed stage's "
            "outputs are deleted; `git checkout params.yaml dvc.lock && dvc repro` returns to the "
            "last commit (from DVC's cache where it can, re-running the rest)")


def run_stage(main: Callable[[], None]) -> None:
    """Run a stage's ``main``; bad params or missing data print one line and exit with code 2; Ctrl-C
    prints one line (:func:`interrupted_message`) and exits with code 130. Log lines go through
    ``tqdm.write`` while ``main`` runs, so they print above a progress bar instead of onto it."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("alembic", "mlflow", "urllib3", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        set_threads()
        with logging_redirect_tqdm():
            main()
        check_stage_code()
    except KeyboardInterrupt:
        print(interrupted_message(), file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except (ConfigError, DatasetNotFoundError, InputError, SkippedStageError) as e:
        _fail(f"error: {e}", EXIT_CONFIG)
    except DivergenceError as e:
        _fail(f"error: {e}", EXIT_DIVERGED)


def check_stage_code() -> None:
    """Under DVC, a stage script that loaded a file of the project its code file does not list fails:
    DVC would call the stage up to date after an edit to that file (:mod:`fedpipe.pipeline.code`;
    the registry's dynamic import of a method the stage's ``METHOD_LOOKUPS`` entry does not name)."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    stage = os.environ.get("DVC_STAGE")
    if not stage or not main_file or Path(main_file).resolve().parent.name != "stages":
        return
    from fedpipe.pipeline.code import check_loaded_code

    missing = check_loaded_code(stage)
    if missing:
        _fail(f"error: stage {stage} ran code that its code file does not list ({', '.join(missing)}):"
              " a fedpipe bug (fedpipe.pipeline.code.METHOD_LOOKUPS); its outputs may be called up "
              "to date after an edit to those files", 1)


def _fail(line: str, code: int) -> None:
    """One line (and under ``dvc exp run`` in the workspace, the way back), then exit ``code``."""
    print(line, file=sys.stderr)
    hint = failed_experiment_hint()
    if hint:
        print(hint, file=sys.stderr)
    sys.exit(code)
