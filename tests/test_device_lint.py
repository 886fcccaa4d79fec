"""The device rule, read in the code: in ``algorithms/`` and ``fl/`` (where tensors are made during
rounds) every ``torch.<factory>(...)`` call names its device (``device=...``; ``"cpu"`` where the
CPU is meant), so a reader sees where each tensor lives, and a new method that forgets fails here
as well as under the run-time harness (tests/test_device_clean.py, docs/device.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "fedpipe"
CHECKED = ("algorithms", "fl")
FACTORIES = {
    "zeros", "ones", "empty", "full", "arange", "range", "rand", "randn", "randint", "randperm",
    "tensor", "as_tensor", "asarray", "eye", "linspace", "logspace", "normal", "empty_strided",
    "scalar_tensor", "tril_indices", "triu_indices", "Generator",
}


def offenders(source: str, filename: str) -> list[str]:
    """``file:line torch.<factory>`` for each factory call of ``source`` without ``device=``."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                and node.func.attr in FACTORIES
                and not any(k.arg == "device" for k in node.keywords)):
            out.append(f"{filename}:{node.lineno} torch.{node.func.attr}")
    return out


def test_the_lint_finds_a_factory_without_device():
    code = ("import torch\n"
            "a = torch.zeros(3, device=x.device)\n"
            "b = torch.randn(2, generator=g)\n"
            "c = torch.Generator()\n"
            "d = x.new_zeros(3)\n")
    assert offenders(code, "m.py") == ["m.py:3 torch.randn", "m.py:4 torch.Generator"]


def package_offenders(package: str, lint) -> list[str]:
    """What ``lint(source, filename)`` reports over every file of ``src/fedpipe/<package>``."""
    files = sorted((SRC / package).rglob("*.py"))
    assert files
    return [o for f in files for o in lint(f.read_text(), str(f.relative_to(SRC.parents[1])))]


@pytest.mark.parametrize("package", CHECKED)
def test_every_factory_names_its_device(package):
    found = package_offenders(package, offenders)
    assert not found, "torch factories without device= (docs/device.md):\n" + "\n".join(found)


def numpy_offenders(source: str, filename: str) -> list[str]:
    """``file:line .numpy()`` for each ``.numpy()`` call whose receiver was not brought to the CPU
    first (``x.cpu().numpy()``, ``x.detach().cpu().double().numpy()``): on a GPU run ``x`` may live
    there, and ``.numpy()`` of a CUDA tensor raises (the first CUDA run found two, in CLUSTER2's
    client selection and Equitable-FL's clustering)."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "numpy" and not node.args):
            continue
        chain, on_cpu = node.func.value, False
        while isinstance(chain, ast.Call | ast.Attribute | ast.Subscript):
            if isinstance(chain, ast.Call) and isinstance(chain.func, ast.Attribute) \
                    and chain.func.attr == "cpu":
                on_cpu = True
                break
            chain = chain.func if isinstance(chain, ast.Call) else chain.value
        if not on_cpu:
            out.append(f"{filename}:{node.lineno} .numpy()")
    return out


def test_the_lint_finds_numpy_of_a_tensor_not_on_the_cpu():
    code = ("a = x.double().numpy()\n"
            "b = x.detach().cpu().double().numpy()\n"
            "c = d['k'].cpu().numpy()\n"
            "e = np.random.default_rng(0).numpy()\n")
    assert numpy_offenders(code, "m.py") == ["m.py:1 .numpy()", "m.py:4 .numpy()"]


@pytest.mark.parametrize("package", CHECKED)
def test_every_numpy_call_brings_its_tensor_to_the_cpu(package):
    found = package_offenders(package, numpy_offenders)
    assert not found, ".numpy() of a tensor that may be on the GPU (docs/device.md):\n" + "\n".join(found)
