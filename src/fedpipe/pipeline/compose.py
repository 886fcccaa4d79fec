"""Compose ``params.yaml`` from ``conf/`` with Hydra, exactly as ``dvc exp run`` does.

``python -m fedpipe.pipeline.compose [override ...]`` (``make params``) regenerates the committed
default ``params.yaml`` after an edit under ``conf/``; it uses DVC's own composition function so the
file is byte-identical to what ``dvc exp run`` would write. The composed params are checked before
they replace the file (:func:`check_composed`, the plan stage's checks): names that are not registry
names never reach ``params.yaml``, whose values DVC substitutes into stage names and paths. The tool
sits with the stages' library side, above the registries it checks against (:mod:`fedpipe.config`
holds the config sections only).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any


def check_composed(params: dict[str, Any]) -> None:
    """The params file's sections are known ones, and the study holds registry names only: its
    algorithms, the ``algorithms`` sections' settings, its corruptions (ConfigError otherwise;
    :func:`fedpipe.pipeline.plan.check_study`)."""
    from fedpipe.config.core import check_sections
    from fedpipe.pipeline.plan import check_study

    check_sections(params)
    check_study(params)


def compose_params(root: str | Path = ".", overrides: list[str] | None = None,
                   output: str = "params.yaml") -> Path:
    from dvc.utils.hydra import compose_and_dump

    from fedpipe.config.core import load_params

    root = Path(root).resolve()
    out = root / output
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp.yaml", dir=out.parent)
    os.close(fd)
    try:
        compose_and_dump(Path(tmp), str(root / "conf"), None, "config",
                         str(root), list(overrides or []))  # DVC's plugins_path: hydra_plugins/
        check_composed(load_params(tmp))
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return out


if __name__ == "__main__":
    from fedpipe.cli import run_stage

    run_stage(lambda: print(compose_params(".", sys.argv[1:])))
