"""Atomic file writes and content hashes.

Every output of a stage goes through this module: the content is written to a temporary file in the
destination folder and renamed into place (``os.replace`` is atomic on POSIX), so a killed stage never
leaves a half-written file behind and a file that existed before is replaced only by a complete one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

log = logging.getLogger(__name__)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it to ``path``, on error delete it.

    ``suffix`` keeps a file extension on the temporary name for writers that infer the format from it
    (matplotlib's ``savefig``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{suffix}", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp creates 0600; outputs get the usual mode
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Strict JSON: a non-finite float (which ``json`` would write as a bare ``NaN``, not JSON)
    is written as ``null``."""
    write_text(path, json.dumps(_finite_json(obj), indent=2, sort_keys=True, allow_nan=False)
               + "\n")


def _finite_json(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {k: _finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_json(v) for v in obj]
    return obj


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_csv(path: str | os.PathLike, header: list[str], rows: list[list[Any]]) -> None:
    lines = [",".join(header)] + [",".join(_csv_cell(v) for v in row) for row in rows]
    write_text(path, "\n".join(lines) + "\n")


def _csv_cell(v: Any) -> str:
    if isinstance(v, float):
        return repr(round(v, 8))
    return str(v)


def save_tensors(path: str | os.PathLike, tensors: Mapping[str, torch.Tensor],
                 metadata: Mapping[str, str] | None = None) -> None:
    """Save tensors as safetensors (contiguous CPU copies), atomically.

    ``metadata`` may hold at most one key: safetensors writes its metadata map in an unspecified
    order, so two keys could give different bytes (and DVC hashes) for identical content. Put a
    JSON string with sorted keys under a single key instead.
    """
    if metadata and len(metadata) > 1:
        raise ValueError("save_tensors: use a single metadata key (a JSON string) for "
                         "byte-reproducible files")
    clean = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(clean, str(tmp), metadata=dict(metadata) if metadata else None)


SKIPPED_KEY = "fedpipe_skipped"  # metadata key of a skipped stage's placeholder (pipeline.plan)


def load_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; a skipped stage's placeholder raises SkippedStageError."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if SKIPPED_KEY in meta:
            from fedpipe.errors import SkippedStageError

            raise SkippedStageError(
                f"{path} was not built: its stage was skipped because the study does not use it "
                "(data/plan/diffusion.json); add a method that needs it to the study, then `dvc repro`")
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)


def read_metadata(path: str | os.PathLike, key: str) -> Any:
    """The JSON stored under metadata ``key`` of a safetensors file (None if the key is absent)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        raw = (f.metadata() or {}).get(key)
    return None if raw is None else json.loads(raw)


def save_figure(path: str | os.PathLike, fig: Any, dpi: int = 120) -> None:
    """Save a matplotlib figure as PNG, atomically, and close it."""
    import matplotlib.pyplot as plt

    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format="png")
    plt.close(fig)


def md5_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """MD5 of a file's bytes: the same hash DVC records for a file in dvc.lock."""
    h = hashlib.md5()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def set_aside(path: str | Path, problem: str, into: str | Path | None = None) -> Path:
    """Rename a corrupt persisted file or folder out of the way (``<name>.corrupt-<time>``, in
    ``into`` or beside it), with a log line, so that its stage starts that work afresh."""
    path = Path(path)
    where = Path(into) if into is not None else path.parent
    where.mkdir(parents=True, exist_ok=True)
    dest = where / f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    os.replace(path, dest)
    log.warning("set aside %s (%s) as %s; starting that work afresh", path, problem, dest)
    return dest


def safetensors_problem(path: str | os.PathLike, keys: tuple[str, ...] = (), metadata: str | None = None
                        ) -> str | None:
    """What is wrong with the safetensors file ``path`` (None if nothing): missing, unreadable
    (truncated, garbage: safetensors checks the header and that the data covers it), without the
    tensors ``keys`` or the metadata key ``metadata``. Reads the header only."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        return "missing"
    try:
        with safe_open(str(path), framework="pt") as f:
            names, meta = set(f.keys()), f.metadata() or {}
    except Exception as e:  # noqa: BLE001 (SafetensorError, OSError: the file is unreadable)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return f"not a readable safetensors file ({first}; truncated or corrupt?)"
    if SKIPPED_KEY in meta:  # a skipped stage's placeholder: its own one-line error
        load_tensors(path)  # raises SkippedStageError
    lacking = [k for k in keys if k not in names]
    if lacking:
        return f"has no tensor {lacking[0]!r} (not the file this stage reads)"
    if metadata is not None and metadata not in meta:
        return f"has no {metadata!r} metadata (not the file this stage reads)"
    return None


def check_input(path: str | os.PathLike, stage: str, keys: tuple[str, ...] = (),
                metadata: str | None = None) -> None:
    """Raise :class:`InputError` (one line: the file, the problem, ``dvc repro <stage>``) unless
    ``path`` is a readable safetensors file with ``keys``; stages call it before any compute."""
    problem = safetensors_problem(path, keys, metadata)
    if problem is not None:
        from fedpipe.errors import InputError

        raise InputError(path, problem, stage)
