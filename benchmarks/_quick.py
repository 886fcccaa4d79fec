"""Set-up shared by the benchmarks' ``--quick`` runs (not a benchmark itself): a temporary working
directory with a tiny ``params.yaml`` (the repository's, with a few sections overridden), into which
a benchmark that reads a study's stage outputs writes those outputs itself at a tiny size, through
the same library functions the stages call. ``tests/test_benchmarks.py`` runs every benchmark with
``--quick``, so that a change of the library's API breaks a test, not a user's first run.

Run as a script it runs every benchmark with ``--quick`` (or those named) and prints each one's exit
status and seconds:

    python benchmarks/_quick.py [engine_overhead sampling ...]

Each runs in a process of its own, forked from this one after it imported torch and the pipeline's
modules once (:func:`serve`): a benchmark's own imports would otherwise cost more than its quick run.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import os
import runpy
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]

# CPU-tiny settings (those of tests/test_diffusion_stages.py): 4 IID clients of digits, T = 10,
# 1 warm-up epoch, a 1-epoch FID classifier, 1 FL round.
TINY: dict[str, Any] = {
    "partition": {"scheme": "iid", "num_clients": 4},
    "fl": {"rounds": 1},
    "diffusion": {"num_train_timesteps": 10},
    "warmup": {"epochs": 1, "batch_size": 64},
    "generate": {"ratio": 0.05, "sampler": "ddpm", "batch_size": 64},
    "fid": {"classifier_epochs": 1, "num_samples": 20, "sampler": "ddim", "ddim_steps": 2,
            "batch_size": 64},
    "diffusion_fl": {"rounds": 1},
}


def tiny_params(*layers: dict[str, Any]) -> dict[str, Any]:
    """The repository's params.yaml with :data:`TINY` and then each of ``layers`` laid over it,
    section by section (a mapping's keys are updated, any other value replaced)."""
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    for layer in (TINY, *layers):
        for section, values in layer.items():
            if isinstance(values, dict) and isinstance(params.get(section), dict):
                params[section] = {**params[section], **copy.deepcopy(values)}
            else:
                params[section] = copy.deepcopy(values)
    if params["partition"]["scheme"] == "iid":  # the shards scheme's key is refused by iid
        params["partition"].pop("shards_per_client", None)
    return params


@contextlib.contextmanager
def tiny_workdir(*layers: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Inside: the working directory is a fresh temporary one holding ``params.yaml`` from
    :func:`tiny_params` (returned); tracking is off. Restored and deleted on exit."""
    params = tiny_params(*layers)
    old_cwd, old_tracking = Path.cwd(), os.environ.get("FEDPIPE_TRACKING")
    with tempfile.TemporaryDirectory(prefix="fedpipe-bench-") as tmp:
        os.chdir(tmp)
        os.environ["FEDPIPE_TRACKING"] = "off"
        try:
            Path("params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
            yield params
        finally:
            os.chdir(old_cwd)
            if old_tracking is None:
                os.environ.pop("FEDPIPE_TRACKING", None)
            else:
                os.environ["FEDPIPE_TRACKING"] = old_tracking


def write_partition(params: dict[str, Any], seed: int = 0) -> Path:
    """The ``partition@<seed>`` stage's output, where the stages read it (relative to the cwd)."""
    from fedpipe.pipeline.inputs import partition_file
    from fedpipe.pipeline.partition import partition_and_write, partition_stage_config

    path = partition_file(seed)
    partition_and_write(partition_stage_config(params, seed), path.parent)
    return path


def note(message: str) -> None:
    """One line saying what a ``--quick`` run does differently (what it built, what it skipped)."""
    print(f"[quick] {message}", flush=True)


# -- running benchmarks with --quick, each in a forked process ------------------------------------------
PRELOAD = ("torch", "numpy", "sklearn.cluster", "matplotlib.pyplot", "fedpipe.fl", "fedpipe.algorithms",
           "fedpipe.tasks", "fedpipe.models", "fedpipe.pipeline.federate", "fedpipe.pipeline.evaluate",
           "fedpipe.pipeline.warmup", "fedpipe.pipeline.generate", "fedpipe.pipeline.feature_extractor",
           "fedpipe.pipeline.federate_ddpm", "fedpipe.tasks.diffusion", "fedpipe.models.unet")
"""Imported once by :func:`serve` before it forks (an import that fails is left to the benchmark,
which then reports it itself). Not Ray: a benchmark that needs it imports it."""


def benchmarks() -> list[Path]:
    """Every benchmark script: ``benchmarks/*.py`` but the helpers (``_*.py``)."""
    return sorted(p for p in Path(__file__).resolve().parent.glob("*.py") if not p.name.startswith("_"))


def _run_child(script: Path, args: list[str], log: Path) -> None:
    """In the forked process: output to ``log``, then ``script`` as ``__main__``; never returns."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent))  # as `python benchmarks/<script>.py` has it
    code = 0
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:  # as the interpreter does with it
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
    os._exit(code)


def run_forked(script: Path, args: list[str], log: Path, timeout: float) -> dict[str, Any]:
    """Run ``script`` with ``args`` in a process forked from this one, its output into ``log``:
    ``{"rc": exit status (-9: killed at the timeout), "seconds": wall seconds, "timed_out": bool}``."""
    sys.stdout.flush()
    sys.stderr.flush()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        _run_child(script, args, log)
    timed_out = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.perf_counter() - t0 > timeout:
            timed_out = True
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.02)
    return {"rc": os.waitstatus_to_exitcode(status), "seconds": time.perf_counter() - t0,
            "timed_out": timed_out}


def preload() -> None:
    for name in PRELOAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    if threading.active_count() > 1:  # forking a process with threads is unsafe
        raise RuntimeError(f"preloading started threads: {threading.enumerate()}")


def serve() -> None:
    """Preload, then answer requests on stdin, one JSON object a line, ``{"script": path, "args":
    [...], "log": path, "timeout": seconds}``, each with one JSON line on stdout (:func:`run_forked`)
    until stdin closes. tests/test_benchmarks.py's server."""
    preload()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        out = run_forked(Path(req["script"]), req.get("args", ["--quick"]), Path(req["log"]),
                         float(req.get("timeout", 300)))
        print(json.dumps(out), flush=True)
    os._exit(0)  # nothing to clean up: skip the interpreter's slow teardown of torch and the rest


def main(argv: list[str]) -> int:
    if argv[:1] == ["--serve"]:
        serve()
        return 0
    wanted = set(argv)
    scripts = [p for p in benchmarks() if not wanted or p.stem in wanted]
    preload()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="fedpipe-bench-logs-") as tmp:
        for script in scripts:
            log = Path(tmp) / f"{script.stem}.log"
            out = run_forked(script, ["--quick"], log, 300)
            failed += out["rc"] != 0
            print(f"{script.name:28s} rc {out['rc']:>3}  {out['seconds']:6.1f} s", flush=True)
            if out["rc"]:
                print("    " + "\n    ".join(log.read_text(errors="replace").splitlines()[-15:]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
