"""Every benchmark runs: each script of benchmarks/ (but the ``_*.py`` helpers) with ``--quick``, a
tiny size that takes seconds, exits 0 and prints the line that only a finished run prints. A signature
change in the library breaks this test, not a user's first run of a benchmark; a new benchmark
without ``--quick`` (or without its line in :data:`EXPECTED`) fails it.

Each script runs in a process of its own, forked from a server that imported torch and the pipeline's
modules once (benchmarks/_quick.py: a benchmark's imports cost more than its quick run); where fork is
not available, as ``python benchmarks/<script>.py --quick``.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))
TIMEOUT = 120  # seconds one quick run may take (they take 0.5-15 s, stage_overhead's dvc repro of a
# 3-stage fedpipe study 30-60 s): a script that ignores --quick

N = r"\d+\.\d+"  # a number as the benchmarks print them
EXPECTED = {  # per benchmark, a line (regular expression, searched line by line) of its result
    "batched": rf"^speedup {N}$",
    "creff_server": rf"^re-training: {N} -> {N} CPU s/round \(x{N}\), bit for bit$",
    "engine_overhead": rf"^verdict: (met|missed) \(ratio {N} (<=|>) target 1\.10",
    "equitable_cluster_cost": rf"^  server clustering \+ equitable average: +{N} ms +\({N}% of the client",
    "evaluate_cost": rf"^ +total: reference {N} s, stage {N} s \(CPU\), ratio {N} \(1 thread",
    "fednh_cost": rf"^paper \(64 ch, 384/192\): FedAvg {N} s/round, FedNH {N} s/round \(CPU\), "
                  rf"ratio {N}; prototype step",
    "fedptr_cost": rf"^  FedPTR-S one-shot: 1 MTT updates, total {N} s vs FedAvg {N} s: x{N}$",
    "fid_noise": rf"^ +8 +{N} +{N} +{N}%  ",  # the 8-sample row of the table
    "lock_size": rf"^lock load\+dump at N=10: params listed / fedpipe = x{N}$",
    "parallel_threads": rf"^speedup {N}$",
    "perada_cost": rf"^smoke scale \(2 clients .* KD / client work = {N}$",
    "pipeline_stages": rf"^ +{N} s +total \(2 stages, device \w+\)$",
    "quicktest_noise": rf"^false-stop rate {N}$",
    "ray_overhead": rf"^\[quick\] Ray .* serial {N} s/round$",
    "sampling": rf"^time ratio ddpm/ddim = {N} \(step ratio 5\.00\)$",
    "stage_overhead": rf"^fedpipe outside the work vs its floor at N=3: x{N} \(target <= 1\.50: "
                      r"(met|missed)\)$",
    "unet_step": rf"^speedup {N}$",
    "vs_flower": rf"^fedpipe \(serial executor\): {N} s/round, final accuracy {N}$",
}

ENV = {**os.environ, "FEDPIPE_THREADS": "1", "OMP_NUM_THREADS": "1", "FEDPIPE_TRACKING": "off",
       "FEDPIPE_WORKERS": "1", "DVC_NO_ANALYTICS": "1", "MPLBACKEND": "Agg"}


class ForkServer:
    """benchmarks/_quick.py --serve: one request and one answer per line."""

    def __init__(self, log_dir: Path):
        self.err = open(log_dir / "server.err", "w+")  # noqa: SIM115  (closed in close())
        self.proc = subprocess.Popen([sys.executable, str(BENCH / "_quick.py"), "--serve"], cwd=REPO,
                                     env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, text=True)
        self.answer()  # {"ready": true} once the preloading is done

    def answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.err.seek(0)
            raise RuntimeError(f"the benchmark server stopped:\n{self.err.read()[-3000:]}")
        return json.loads(line)

    def run(self, script: Path, log: Path) -> int:
        self.proc.stdin.write(json.dumps({"script": str(script), "args": ["--quick"],
                                          "log": str(log), "timeout": TIMEOUT}) + "\n")
        self.proc.stdin.flush()
        out = self.answer()
        assert not out["timed_out"], f"{script.name} --quick ran over {TIMEOUT} s"
        return out["rc"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.err.close()


def run_subprocess(script: Path, log: Path) -> int:
    with open(log, "w") as f:
        return subprocess.run([sys.executable, str(script), "--quick"], cwd=REPO, env=ENV, stdout=f,
                              stderr=subprocess.STDOUT, timeout=TIMEOUT).returncode


@pytest.fixture(scope="module")
def run_quick(tmp_path_factory):
    """``run_quick(script, log) -> exit status`` of ``script --quick``, its output in ``log``."""
    if not hasattr(os, "fork") or sys.platform != "linux":
        yield run_subprocess
        return
    server = ForkServer(tmp_path_factory.mktemp("bench-server"))
    try:
        yield server.run
    finally:
        server.close()


def test_the_benchmarks_are_found():
    names = {p.stem for p in SCRIPTS}
    assert {"engine_overhead", "sampling", "stage_overhead"} <= names  # `make bench` runs the first
    assert not [p for p in SCRIPTS if p.name.startswith("test_")]


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_benchmark_runs_quick(script, run_quick, tmp_path):
    assert script.stem in EXPECTED, (f"benchmarks/{script.name} is new: give it a --quick flag (a "
                                     "run of seconds) and its result line in EXPECTED here")
    log = tmp_path / f"{script.stem}.log"
    rc = run_quick(script, log)
    output = log.read_text(errors="replace")
    assert rc == 0, f"{script.name} --quick exited {rc}:\n{output[-4000:]}"
    assert re.search(EXPECTED[script.stem], output, re.MULTILINE), \
        f"{script.name} --quick printed no line matching {EXPECTED[script.stem]!r}:\n{output[-4000:]}"
