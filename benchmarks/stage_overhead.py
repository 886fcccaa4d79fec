"""What a stage costs outside its work: DVC's bookkeeping per stage as the pipeline grows, and the
start-up of the Python process a stage runs in, in one invocation.

(a) DVC. For each N of ``--stages`` a temporary repository (``git init``, ``dvc init``) gets N
independent stages, each copying its own small input file to its own output with
``python -c "import shutil; shutil.copy(...)"`` (one dep, one out: the least a stage can be). Timed:

- ``repro``: ``dvc repro`` of the N stages from nothing, wall seconds per stage;
- ``cmds``: the same N commands run one after another without DVC (each through a shell, as DVC
  runs them), wall seconds per stage: the work;
- ``outside``: (repro - cmds) / N, what DVC adds per stage around the work (reading dvc.yaml, the
  graph, hashing deps and outs, the cache, dvc.lock), its own start-up (about a second) spread over
  the N stages;
- ``checked``: ``dvc repro`` again with everything up to date (no command runs), wall seconds per
  stage.

(b) Process start-up: ``python -c pass`` and ``python -c "import torch"``, wall seconds (median of
``--repeats``).

(c) A fedpipe stage's start-up: a fresh ``python`` executing only the module-level imports of
``stages/plan.py`` (the lightest stage) and of ``stages/federate.py`` (the training stage), wall
seconds (median of ``--repeats``): what every stage process pays before it reads params. The
stage's lazy imports (inside its ``main``) and its tracking are not in it.

The last line is ``DVC outside the work: N=<max> vs N=<min>: xR per stage``: how DVC's per-stage cost
grows with the number of stages (1.00: it does not).

    python benchmarks/stage_overhead.py [--stages 10 100 300] [--repeats 3]

Uses the dvc beside this interpreter (the project's virtual environment), else the one on PATH;
``DVC_NO_ANALYTICS=1``. ``--quick``: N = 3 and 6, one repeat, (b) without the torch row and (c) for
stages/plan.py only (DVC's own start-up is most of it, so its ratio means little there).
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
STAGE_SCRIPTS = ("stages/plan.py", "stages/federate.py")


def dvc_executable() -> str | None:
    beside = Path(sys.executable).parent / "dvc"
    return str(beside) if beside.is_file() else shutil.which("dvc")


def environment() -> dict[str, str]:
    """``python`` in a stage's cmd is this interpreter; no analytics, no git identity needed."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "DVC_NO_ANALYTICS": "1", "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost",
            "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@localhost"}


def wall(cmd: list[str] | str, cwd: Path | None = None, env: dict | None = None,
         shell: bool = False) -> float:
    """Wall seconds of one command (which must succeed)."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, shell=shell, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"error: {cmd!r} failed ({proc.returncode}):\n{proc.stdout[-2000:]}"
                         f"{proc.stderr[-2000:]}")
    return seconds


def stage_cmd(i: int) -> str:
    return f"python -c \"import shutil; shutil.copy('in/{i}.txt', 'out/{i}.txt')\""


def dvc_row(dvc: str, n: int, env: dict) -> dict[str, float]:
    """(a) for N = ``n``: seconds per stage of each column."""
    with tempfile.TemporaryDirectory(prefix="fedpipe-stage-overhead-") as tmp:
        root = Path(tmp)
        wall(["git", "init", "-q"], root, env)
        wall([dvc, "init", "-q"], root, env)
        (root / "in").mkdir()
        (root / "out").mkdir()
        for i in range(n):
            (root / "in" / f"{i}.txt").write_text(f"{i}\n")
        stages = {f"s{i}": {"cmd": stage_cmd(i), "deps": [f"in/{i}.txt"], "outs": [f"out/{i}.txt"]}
                  for i in range(n)}
        (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
        repro = wall([dvc, "repro", "-q"], root, env)
        produced = sum((root / "out" / f"{i}.txt").is_file() for i in range(n))
        if produced != n:
            raise SystemExit(f"error: dvc repro made {produced} of {n} outputs")
        checked = wall([dvc, "repro", "-q"], root, env)
        cmds = sum(wall(stage_cmd(i), root, env, shell=True) for i in range(n))
    return {"repro": repro / n, "cmds": cmds / n, "outside": (repro - cmds) / n,
            "checked": checked / n}


def module_imports(script: Path) -> str:
    """The module-level import statements of ``script``, as source."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    return "\n".join(ast.unparse(node) for node in tree.body
                     if isinstance(node, ast.Import | ast.ImportFrom))


def startup(code: str, repeats: int, env: dict) -> float:
    """Median wall seconds of ``python -c code`` (run from the repository root)."""
    return statistics.median(wall([sys.executable, "-c", code], REPO, env) for _ in range(repeats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, nargs="+", default=[10, 100, 300],
                    help="pipeline sizes N for (a)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each start-up in (b), (c)")
    ap.add_argument("--quick", action="store_true", help="N = 3 and 6, one repeat")
    args = ap.parse_args()
    scripts = STAGE_SCRIPTS
    if args.quick:
        args.stages, args.repeats, scripts = [3, 6], 1, STAGE_SCRIPTS[:1]
    env = environment()
    dvc = dvc_executable()
    version = subprocess.run([dvc, "--version"], capture_output=True, text=True, env=env
                             ).stdout.strip() if dvc else None
    print(f"machine: {os.cpu_count()} CPUs; python {sys.version.split()[0]}; dvc {version}")
    print("(a) DVC, N independent stages of one small dep and out each "
          "(`python -c` copying the dep to the out), seconds per stage (wall):")
    print("    repro:   `dvc repro` from nothing; cmds: the N commands alone, no DVC (the work);")
    print("    outside: (repro - cmds) / N, DVC around the work (its start-up spread over N); checked: "
          "`dvc repro` again, all up to date")
    rows: dict[int, dict[str, float]] = {}
    if dvc is None:
        print("    skipped: no dvc beside this interpreter nor on PATH (pip install dvc)")
    else:
        print(f"    {'N':>5} {'repro':>8} {'cmds':>8} {'outside':>8} {'checked':>8}")
        for n in args.stages:
            rows[n] = row = dvc_row(dvc, n, env)
            print(f"    {n:>5} {row['repro']:>8.3f} {row['cmds']:>8.3f} {row['outside']:>8.3f} "
                  f"{row['checked']:>8.3f}", flush=True)
    print(f"(b) process start-up, wall seconds (median of {args.repeats}):")
    print(f"    python -c pass                      {startup('pass', args.repeats, env):8.3f}")
    if args.quick:
        print("    python -c 'import torch'            skipped (--quick)")
    else:
        print(f"    python -c 'import torch'            {startup('import torch', args.repeats, env):8.3f}",
              flush=True)
    print(f"(c) a fedpipe stage's module-level imports in a fresh python, wall seconds (median of "
          f"{args.repeats}):")
    for script in scripts:
        code = module_imports(REPO / script)
        print(f"    {script + ' imports':35s} {startup(code, args.repeats, env):8.3f}", flush=True)
    for script in STAGE_SCRIPTS[len(scripts):]:
        print(f"    {script + ' imports':35s} skipped (--quick)")
    if len(rows) >= 2:
        lo, hi = min(rows), max(rows)
        print(f"DVC outside the work: N={hi} vs N={lo}: "
              f"x{rows[hi]['outside'] / rows[lo]['outside']:.2f} per stage")


if __name__ == "__main__":
    main()
