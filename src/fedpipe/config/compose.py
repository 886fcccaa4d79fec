"""Compose ``params.yaml`` from ``conf/`` with Hydra, exactly as ``dvc exp run`` does.

``python -m fedpipe.config.compose [override ...]`` (``make params``) regenerates the committed default
``params.yaml`` after an edit under ``conf/``; it uses DVC's own composition function so the file is
byte-identical to what ``dvc exp run`` would write.
"""

from __future__ import annotations

import sys
from pathlib import Path


def compose_params(root: str | Path = ".", overrides: list[str] | None = None,
                   output: str = "params.yaml") -> Path:
    from dvc.utils.hydra import compose_and_dump

    root = Path(root).resolve()
    out = root / output
    compose_and_dump(out, str(root / "conf"), None, "config", str(root / "hydra_plugins"),
                     list(overrides or []))
    return out


if __name__ == "__main__":
    print(compose_params(".", sys.argv[1:]))
