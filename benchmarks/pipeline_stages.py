"""The study in ``params.yaml`` stage by stage, each stage timed: end-to-end wall time of the
pipeline's own work, without DVC (for a machine where DVC is not installed, such as a lent GPU
machine, and to time the stages apart from DVC's bookkeeping).

The stage order is DVC's (dependencies first), read from an order file that
``--write-order`` makes where DVC is installed; each stage runs as DVC runs it: its ``cmd``'s
script in a fresh ``python`` with ``DVC_STAGE=<stage>`` in the environment (matrix stages read
their seed and algorithm from it). The device is the study's ``device`` setting (``auto``: CUDA
when available). Tracking is off (``FEDPIPE_TRACKING=off``) unless ``--tracking``.

    python benchmarks/pipeline_stages.py --write-order data/bench/stages.txt     # where DVC is
    python benchmarks/pipeline_stages.py --order data/bench/stages.txt --out times.json

Prints one line per stage (seconds) and the total; ``--out`` writes them as JSON with the device.

``--quick`` (where DVC is installed): writes the order of this repository's dvc.yaml into a temporary
directory, checks that every stage's ``cmd`` is one the runner can run (``python <script>``, the
script present), then runs two no-op stages (``python -c pass``) through the runner there; it
checks that the benchmark runs, not the study.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def write_order(path: Path, root: Path = Path(".")) -> None:
    import networkx as nx
    from dvc.repo import Repo

    graph = Repo(str(root)).index.graph
    lines = [f"{s.addressing}|{s.cmd}" for s in reversed(list(nx.topological_sort(graph)))]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} stages -> {path}")


def run(order: Path, out: Path | None, tracking: bool, stop: str | None) -> int:
    """Run the stages of ``order`` in turn; ``out`` is rewritten after every stage (a run stopped by
    Ctrl-C or a time limit keeps the stages it finished, the stage it stopped in marked so); each
    stage's output goes to ``<out>.logs/<stage>.log`` (else it is kept only for a failure)."""
    import torch

    env = {**os.environ}
    if not tracking:
        env["FEDPIPE_TRACKING"] = "off"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    times: dict[str, float] = {}
    rc, start, running = 0, time.perf_counter(), None
    logs = out.with_suffix(".logs") if out else None
    if logs:
        logs.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        if out:
            out.write_text(json.dumps({"device": device, "total_s": round(time.perf_counter() - start, 2),
                                       "stages": times, "rc": rc, "stopped_in": running},
                                      indent=1) + "\n")

    try:
        for line in order.read_text().splitlines():
            stage, cmd = line.split("|", 1)
            argv = cmd.split()
            if argv[0] == "python":
                argv[0] = sys.executable
            running, t0 = stage, time.perf_counter()
            proc = subprocess.run(argv, env={**env, "DVC_STAGE": stage}, capture_output=True, text=True)
            running = None
            times[stage] = round(time.perf_counter() - t0, 2)
            if logs:
                (logs / f"{stage}.log").write_text(proc.stdout + proc.stderr)
            print(f"{times[stage]:8.2f} s  {stage}", flush=True)
            if proc.returncode:
                print(f"stage {stage} failed ({proc.returncode}):\n{proc.stderr[-3000:]}", flush=True)
                rc = proc.returncode
                break
            write()
            if stage == stop:
                break
    except KeyboardInterrupt:
        rc = 130
        print(f"interrupted in stage {running}", flush=True)
    write()
    print(f"{time.perf_counter() - start:8.2f} s  total ({len(times)} stages, device {device})")
    return rc


def quick() -> int:
    """Write the order of this repository's stages, check each command, run two no-op stages."""
    import tempfile

    repo = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="fedpipe-bench-") as tmp:
        order = Path(tmp) / "stages.txt"
        write_order(order, repo)
        bad = []
        for line in order.read_text().splitlines():
            stage, cmd = line.split("|", 1)
            argv = cmd.split()
            if len(argv) != 2 or argv[0] != "python" or not (repo / argv[1]).is_file():
                bad.append(f"{stage}: {cmd}")
        if bad:
            print("error: the runner runs `python <script>` commands only; not these:\n  "
                  + "\n  ".join(bad), file=sys.stderr)
            return 1
        print("[quick] every stage's cmd is `python <script>`, the script present; two no-op "
              "stages run through the runner", flush=True)
        noop = Path(tmp) / "noop.txt"
        noop.write_text("noop_a|python -c pass\nnoop_b|python -c pass\n")
        cwd = Path.cwd()
        os.chdir(tmp)
        try:
            return run(noop, Path(tmp) / "times.json", False, None)
        finally:
            os.chdir(cwd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-order", type=Path, help="write DVC's stage order here and stop")
    ap.add_argument("--order", type=Path, default=Path("data/bench/stages.txt"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--tracking", action="store_true", help="log to MLflow as the stages do")
    ap.add_argument("--stop-after", help="the last stage to run")
    ap.add_argument("--quick", action="store_true",
                    help="this repository's stage order checked, two no-op stages run")
    args = ap.parse_args()
    if args.quick:
        return quick()
    if args.write_order:
        write_order(args.write_order)
        return 0
    if not args.order.is_file():
        print(f"error: --order={args.order}; allowed: a stage-order file (make one where DVC is "
              f"installed: --write-order {args.order})", file=sys.stderr)
        return 2
    stages = [line.split("|", 1)[0] for line in args.order.read_text().splitlines()]
    if args.stop_after is not None and args.stop_after not in stages:
        print(f"error: --stop-after={args.stop_after}; allowed: one of {', '.join(stages)}",
              file=sys.stderr)
        return 2
    return run(args.order, args.out, args.tracking, args.stop_after)


if __name__ == "__main__":
    sys.exit(main())
