"""Stage start-up: every stage is its own process, so what a classification stage imports is paid
once per algorithm and seed. The heavy libraries it does not use stay unimported."""

import subprocess
import sys

import pytest

HEAVY = ("diffusers", "torchvision", "sklearn", "torchmetrics")


@pytest.mark.parametrize("module", ["fedpipe.pipeline.federate", "fedpipe.pipeline.evaluate"])
def test_classification_stage_modules_import_no_heavy_library(module):
    code = (f"import sys, {module}; "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()} at start-up"
