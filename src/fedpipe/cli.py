"""Entry-point helper for stage scripts: logging set-up (log lines printed above the progress bars,
never onto them), one-line errors with exit code 2 (a folder the stage cannot write too), Ctrl-C as one
line saying what was kept and how to resume, with exit code 130, and, under DVC, a stage that stops
the same way when the DVC process that started it is gone (:func:`watch_dvc`), and one that ran a
project file its stage file's code does not list fails (:func:`check_stage_code`)."""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import signal
import sys
import threading
import time
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
THREADS_AUTO = "auto"
DEFAULT_THREADS = 1
"""Torch threads per stage when ``FEDPIPE_THREADS`` is unset. One: a stage's results are then the same
bits on any machine and under any load (a float sum splits differently over 2 threads than over
1), and a stage never waits for a sibling thread that another process has pushed off its core (two
threads on 2 cores with one core taken ran federated DDPM stages 16-20x slower: 591-772 s against
31-38 s idle). Two threads on an idle 2-core machine gain about 10% (docs/results.md)."""
TAKEN_SHARE = 0.25
"""``FEDPIPE_THREADS=auto``: a core counts as taken once other processes use more than this share
of it."""


def auto_threads(cores: int, busy: float) -> int:
    """``FEDPIPE_THREADS=auto``: one torch thread per core that other processes leave free, at least
    one: ``cores`` usable by this process (its CPU affinity), ``busy`` the cores' worth of CPU time
    other processes use (0.0 idle, 1.0 one core taken). A core is free unless others use more than
    :data:`TAKEN_SHARE` of it."""
    if cores < 1 or busy < 0:
        raise ValueError(f"cores {cores} and busy {busy}: cores >= 1 and busy >= 0")
    free = math.floor(cores - busy + TAKEN_SHARE)
    return max(1, min(cores, free))


def busy_cores(cpus: set[int] | None = None, seconds: float = 0.2) -> float:
    """The cores' worth of CPU time that processes use on ``cpus`` (default: this process's
    affinity) over ``seconds``, from two reads of /proc/stat (this process sleeps in between, so
    it is not counted); the 1-minute load average where /proc/stat cannot be read."""
    cpus = os.sched_getaffinity(0) if cpus is None else cpus

    def ticks() -> dict[int, tuple[int, int]]:
        out = {}
        with open("/proc/stat") as f:
            for line in f:
                name, *fields = line.split()
                if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                    values = [int(v) for v in fields]
                    out[int(name[3:])] = (sum(values), values[3] + values[4])  # all, idle + iowait
        return out

    try:
        first = ticks()
        time.sleep(seconds)
        second = ticks()
    except (OSError, ValueError, IndexError):
        return min(float(len(cpus)), os.getloadavg()[0])
    busy = 0.0
    for cpu, (total, idle) in second.items():
        if cpu in first and total > first[cpu][0]:
            busy += 1 - (idle - first[cpu][1]) / (total - first[cpu][0])
    return max(0.0, busy)


def stage_threads(raw: str | None = None) -> int:
    """The torch thread count of a stage: ``FEDPIPE_THREADS`` (``raw``; default: the environment's)
    as an integer >= 1, or ``auto`` (:func:`auto_threads` of the cores free now), or
    :data:`DEFAULT_THREADS` when unset. Anything else is a ConfigError naming the variable."""
    raw = (os.environ.get(THREADS_ENV, "") if raw is None else raw).strip()
    if not raw:
        return DEFAULT_THREADS
    if raw == THREADS_AUTO:
        return auto_threads(len(os.sched_getaffinity(0)), busy_cores())
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(THREADS_ENV, raw, "an integer >= 1 (torch threads per stage) or auto "
                          "(one per core that other processes leave free)")
    return int(raw)


def set_threads() -> None:
    """Set torch's thread count for the stage: :func:`stage_threads` (``FEDPIPE_THREADS``; unset:
    :data:`DEFAULT_THREADS`). Results are bit-identical only at the same thread count (it is
    logged with every MLflow run), so ``auto``, which follows the machine's load, trades that for
    speed."""
    threads = stage_threads()
    import torch

    torch.set_num_threads(threads)


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
    """Run a stage's ``main``; bad params or missing data print one line and exit with code 2, and so
    does a folder it cannot write (:func:`permission_message`); Ctrl-C prints one line
    (:func:`interrupted_message`) and exits with code 130, and so does a stage whose DVC is gone
    (:func:`watch_dvc`, run by DVC only). Log lines go through ``tqdm.write`` while ``main`` runs,
    so they print above a progress bar instead of onto it."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("alembic", "mlflow", "urllib3", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    done = threading.Event()
    try:
        try:
            if os.environ.get("DVC_STAGE"):
                watch_dvc(os.environ["DVC_STAGE"], done)
            set_threads()
            with logging_redirect_tqdm():
                main()
            check_stage_code()
        except BaseException as e:
            if not isinstance(e, SystemExit) or e.code not in (None, 0):
                _track_failure(e)
            raise
    except KeyboardInterrupt:
        line = interrupted_message()
        if _ORPHANED:  # watch_dvc's SIGINT: one line saying both
            line = f"{_ORPHANED[0]}; {line.removeprefix('interrupted: ')}"
        print(line, file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except (ConfigError, DatasetNotFoundError, InputError, SkippedStageError) as e:
        _fail(f"error: {e}", EXIT_CONFIG)
    except DivergenceError as e:
        _fail(f"error: {e}", EXIT_DIVERGED)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        _fail(permission_message(e), EXIT_CONFIG)
    finally:
        done.set()


def stage_name() -> str:
    """The running stage's DVC name (``DVC_STAGE`` without a ``dvc.yaml:`` prefix), else its
    script's name (``python stages/plan.py`` by hand: ``plan``)."""
    stage = os.environ.get("DVC_STAGE", "")
    if stage:
        return stage.split(":", 1)[1] if ":" in stage.split("@", 1)[0] else stage
    return Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "stage"


def _track_failure(error: BaseException) -> None:
    """The pipeline's parent run shows that this stage failed, however it failed: a failure no
    stage run recorded (one before the stage's run opened: its params, inputs or folders refused)
    is spooled as a FAILED run of the stage (:func:`fedpipe.tracking.record_failure`)."""
    from fedpipe.tracking import record_failure

    record_failure(stage_name(), error)


def permission_message(e: OSError) -> str:
    """The one line for a file or folder the stage may not write (or read): the folder that refused
    (the nearest one that exists on the way to the file) or the file itself, and what to do."""
    from fedpipe.tracking import SPOOL_DIR

    if not e.filename:
        return f"error: {e.strerror or e}; check the permissions of the folders the stage writes"
    path = Path(os.fsdecode(e.filename))
    try:
        shown = path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        shown = path
    while not shown.exists() and shown.parent != shown and str(shown.parent) != ".":
        shown = shown.parent
    if not shown.exists():
        shown = shown.parent if str(shown.parent) != "." else Path(".")
    why = "read-only file system" if e.errno == errno.EROFS else "permission denied"
    if shown.is_dir():
        line = (f"error: cannot write in folder {shown} ({why}); make it writable for this user "
                f"(chmod -R u+w {shown}, or chown it to this user) and run the stage again")
    else:
        line = (f"error: cannot open {shown} ({why}); make it readable and writable for this user "
                f"(chmod u+rw {shown}, or chown it to this user) and run the stage again")
    if SPOOL_DIR in shown.parts:
        line += "; or run without tracking: FEDPIPE_TRACKING=off"
    return line


# -- a stage whose DVC is gone --------------------------------------------------------------------
DVC_POLL_S = 2.0
"""How often a stage run by DVC checks that the DVC process that started it is still there."""
DVC_GONE_GRACE_S = 60.0
"""After its SIGINT, how long a stage whose DVC is gone has to stop (its Ctrl-C handling keeps
its checkpoints) before it is ended with exit code 130 regardless."""

_ORPHANED: list[str] = []  # watch_dvc's line, once DVC is gone


def _proc_stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from field 3 (state) on; None for a process that is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return None if not fields or fields[0] in ("Z", "X") else fields


def _is_dvc(pid: int) -> bool:
    try:
        argv = [a.decode(errors="replace") for a in
                Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return False
    if any(os.path.basename(a) == "dvc" for a in argv[:3]):
        return True
    return "-m" in argv[:3] and argv[argv.index("-m") + 1:][:1] == ["dvc"]


def dvc_ancestor() -> int | None:
    """The pid of the DVC process that runs this stage: the nearest ancestor whose command is
    ``dvc`` (DVC starts a stage's command through ``$SHELL -c``, which may stay in between); None
    where there is none (or no ``/proc``)."""
    pid = os.getppid()
    for _ in range(4):
        if pid <= 1:
            return None
        if _is_dvc(pid):
            return pid
        stat = _proc_stat(pid)
        if stat is None:
            return None
        pid = int(stat[1])
    return None


def watch_dvc(stage: str, done: threading.Event, poll: float = DVC_POLL_S) -> threading.Thread:
    """Stop the stage when the DVC process that started it is gone (``kill -9`` of ``dvc repro``
    would leave it running with no one to record its result): a daemon thread checks every
    ``poll`` seconds that the parent process is the same (a dead parent's child is handed to
    init) and that the ``dvc`` ancestor (:func:`dvc_ancestor`) still runs (by its start time: a
    pid can be reused). When either is gone it sends the main thread SIGINT, so the stage stops
    as on Ctrl-C, keeping what :func:`keep_on_interrupt` names, and :func:`run_stage` prints one
    line (``error: DVC, which started stage X, is gone: ...``) and exits with code 130; a stage
    that has not stopped :data:`DVC_GONE_GRACE_S` seconds later (or ignores SIGINT) is ended with
    that line and code 130. The thread ends when ``done`` is set."""
    parent = os.getppid()
    dvc = dvc_ancestor()
    dvc_stat = _proc_stat(dvc) if dvc is not None else None
    dvc_started = dvc_stat[19] if dvc_stat is not None and len(dvc_stat) > 19 else None

    def gone() -> bool:
        if os.getppid() != parent:
            return True
        if dvc is None or dvc_started is None:
            return False
        now = _proc_stat(dvc)
        return now is None or len(now) <= 19 or now[19] != dvc_started

    def stop() -> None:
        head = f"error: DVC, which started stage {stage}, is gone: stopping"
        _ORPHANED.append(head)
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):  # Python's own (KeyboardInterrupt) or the stage's
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            if done.wait(DVC_GONE_GRACE_S):
                return
        # SIGINT ignored (a stage started in the background by a shell without job control) or the
        # stage did not stop in time: the same one line, from here
        line = f"{head}; {interrupted_message().removeprefix('interrupted: ')}"
        try:
            print(line, file=sys.stderr, flush=True)
        except OSError:
            pass
        os._exit(EXIT_INTERRUPTED)

    def watch() -> None:
        while not done.wait(poll):
            if gone():
                stop()
                return

    thread = threading.Thread(target=watch, name="fedpipe-watch-dvc", daemon=True)
    thread.start()
    return thread


# -- the code a stage ran, held to its code file -----------------------------------------------------
STAGE_FILES_DIR = Path("data/plan/stages")
"""Where the plan stage writes each stage's one file, ``{"code": {file: md5}, "params": {...}}``
(``"inputs"`` too for a federate stage): the code it runs and the params it reads, its one plan dep
(:func:`fedpipe.pipeline.plan.write_stage_files`; :func:`check_stage_code` reads the running
stage's code)."""
STAGES_DIR = Path("stages")


def package_root() -> Path:
    """The folder that holds the ``fedpipe`` package that runs (``src/`` of the repository)."""
    import fedpipe

    return Path(fedpipe.__file__).resolve().parents[1]


def stage_file(address: str, root: str | Path = ".") -> Path:
    """The plan's file of DVC stage ``address`` (``federate@fedavg-0`` -> ``federate/fedavg.json``
    when the stage has a file per method, else ``federate.json``)."""
    name, _, item = address.partition("@")
    per_method = Path(root) / STAGE_FILES_DIR / name
    if item and per_method.is_dir():
        return per_method / f"{item.rpartition('-')[0] or item}.json"
    return Path(root) / STAGE_FILES_DIR / f"{name}.json"


def loaded_project_files(src: Path | None = None, stages: Path = STAGES_DIR) -> set[str]:
    """The project's files (named as in a code file) that this process has imported."""
    src = (src or package_root()).resolve()
    stages = stages.resolve()
    out = set()
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if not f:
            continue
        path = Path(f).resolve()
        if path.is_relative_to(src):
            out.add(path.relative_to(src).as_posix())
        elif path.is_relative_to(stages):
            out.add((Path(STAGES_DIR.name) / path.relative_to(stages)).as_posix())
    return out


def check_loaded_code(address: str, root: str | Path = ".") -> list[str]:
    """The project files this process loaded that stage ``address``'s stage file does not list
    (empty when the file covers them, or when there is no stage file, or one without code, to hold
    the stage to)."""
    path = stage_file(address, root)
    code = json.loads(path.read_text()).get("code") if path.is_file() else None
    if code is None:
        return []
    listed = set(code)
    return sorted(loaded_project_files(stages=Path(root) / STAGES_DIR) - listed)


def check_stage_code() -> None:
    """Under DVC, a stage script that loaded a file of the project its stage file does not list fails:
    DVC would call the stage up to date after an edit to that file (:mod:`fedpipe.pipeline.code`;
    the registry's dynamic import of a method the stage's ``METHOD_LOOKUPS`` entry does not name)."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    stage = os.environ.get("DVC_STAGE")
    if not stage or not main_file or Path(main_file).resolve().parent.name != "stages":
        return
    missing = check_loaded_code(stage)
    if missing:
        _fail(f"error: stage {stage} ran code that its stage file ({stage_file(stage)}) does not "
              f"list ({', '.join(missing)}): a fedpipe bug (fedpipe.pipeline.code.METHOD_LOOKUPS); "
              "its outputs may be called up to date after an edit to those files", 1)


def _fail(line: str, code: int) -> None:
    """One line (and under ``dvc exp run`` in the workspace, the way back), then exit ``code``."""
    print(line, file=sys.stderr)
    hint = failed_experiment_hint()
    if hint:
        print(hint, file=sys.stderr)
    sys.exit(code)
