"""Every method's tiny run on CUDA (needs a GPU: skipped where ``torch.cuda.is_available()`` is
false, as on CI; run on a GPU machine with ``pytest tests/test_cuda.py``).

The CPU side of the same runs is tests/test_device_clean.py: there the harness proves that every
tensor fedpipe makes names its device, on a CPU-only machine. Here the same runs (same methods,
settings and data) run with the model, the client data and the server data on the GPU, still
under :class:`device_harness.DeviceHarness`, which on two real devices also fails any op that
mixes a CUDA tensor with a CPU one (the fault the CPU side cannot see). Each run must end with
every floating-point tensor of the server state and of every client state on the GPU and finite
(integer bookkeeping, such as FedPTR's last-MTT round, stays on the CPU by choice), and a second
run with the same seed must give the same digests (the device streams are seeded from the
project's RNG streams: same params, same result, on the GPU too).

CPU and GPU results are not compared number for number: on the GPU the random draws come from a
device generator seeded from the stream (``fedpipe.device.generator_on``), so batch order and
noise differ from the CPU's by design (docs/device.md).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

# cuBLAS's documented condition for repeatable results; set before the first CUDA matmul
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest
import torch
from device_harness import DeviceHarness
from test_device_clean import BATCHED, config, named_tensors, result_digests, run_method, run_track

from fedpipe.algorithms import ALGORITHMS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def check_on_gpu_and_finite(result) -> None:
    where = {"weights": result.state.weights, "extra": result.state.extra,
             "clients": {str(k): v for k, v in result.client_states.items()}}
    for part, obj in where.items():
        for path, t in named_tensors(obj, part):
            if t.is_floating_point():  # integer bookkeeping may stay on the CPU by choice
                assert t.device.type == "cuda", f"{path}: a {tuple(t.shape)} tensor on {t.device}"
                assert bool(torch.isfinite(t).all()), f"{path}: a non-finite {tuple(t.shape)} tensor"


@pytest.fixture(autouse=True)
def repeatable():
    """float32 matmuls as float32 (no TF32) and torch's deterministic kernels (a warning where an
    op has none), so that a repeat compares like with like: the second GPU run saw FedPTR's and
    PerAda's repeats differ inside the test session (not in a process of their own with cuBLAS's
    workspace setting; docs/device.md)."""
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
           torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old[:2]
    torch.use_deterministic_algorithms(old[2])
    torch.backends.cudnn.benchmark = old[3]


REPEAT = """
import dataclasses, json, os, sys
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch
from device_harness import DeviceHarness
from test_device_clean import config, result_digests, run_strategy
from fedpipe.algorithms import ALGORITHMS
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
torch.use_deterministic_algorithms(True, warn_only=True)
torch.backends.cudnn.benchmark = False
name, over = sys.argv[1], json.loads(sys.argv[2])
cfg = dataclasses.replace(config(name), **over)
runs = []
for _ in range(2):
    with DeviceHarness():
        runs.append(result_digests(run_strategy(ALGORITHMS[name], cfg, "serial", "cuda")))
print(json.dumps(runs))
"""


def repeat_settings(name: str) -> dict:
    """What the repeat check turns off: MTT's differentiable augmentation (FedPTR's ``dsa``), whose
    CUDA kernels do not repeat bit for bit and which torch's deterministic mode does not flag: on
    one H200 (2026-11-28) FedPTR's client states and FedPTR-S's synthetic set differed between two
    runs in one fresh process with ``dsa`` on, and repeated with it off (docs/device.md)."""
    cfg = config(name)
    return {"dsa": False} if getattr(cfg, "dsa", False) else {}


def repeat_in_own_process(name: str) -> list[dict[str, str]]:
    """Two runs of ``name`` on CUDA (:func:`repeat_settings` applied), one after the other, in a
    fresh Python process: their digests. In a process of its own, so that what earlier tests left
    in the pytest process (device-generator caches, kernels chosen, allocator state) stays out of
    the check: the check is that the method repeats."""
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(here), str(here.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", REPEAT, name, json.dumps(repeat_settings(name))],
                          capture_output=True, text=True,
                          env=env, cwd=here, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_method_runs_on_cuda(name):
    with DeviceHarness():
        first = run_method(name, device="cuda")
    assert first.rounds_done >= 1
    check_on_gpu_and_finite(first)
    a, b = repeat_in_own_process(name)
    assert a == b, f"{name}: two runs in one fresh process differ in {[k for k in a if a[k] != b[k]]}"
    if not repeat_settings(name) and a != result_digests(first):  # recorded, not failed
        print(f"{name}: the in-session run differs from a fresh process's in "
              f"{[k for k in a if a[k] != result_digests(first).get(k)]}")


@pytest.mark.parametrize("name", BATCHED)
def test_batched_executor_runs_on_cuda(name):
    with DeviceHarness():
        result = run_method(name, "batched", device="cuda")
    check_on_gpu_and_finite(result)


def test_diffusion_track_stages_run_on_cuda(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDPIPE_WORKERS", "1")
    with DeviceHarness():
        digests = run_track(tmp_path / "a", "cuda")
    fid = float(digests["fedddpm_fid"])
    assert math.isfinite(fid) and fid >= 0
    with DeviceHarness():
        assert run_track(tmp_path / "b", "cuda") == digests
