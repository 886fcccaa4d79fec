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


def write_json_folder(folder: str | os.PathLike, docs: Mapping[str, Any]) -> None:
    """``folder/<rel>.json`` for each ``rel`` of ``docs`` (``rel`` may hold ``/``), and no other
    ``*.json`` under ``folder``: a stale file goes, and a subfolder left empty with it. The folder
    exists afterwards, also when ``docs`` is empty."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.rglob("*.json"):
        if stale.relative_to(folder).with_suffix("").as_posix() not in docs:
            stale.unlink()
    for rel, doc in docs.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        write_json(folder / f"{rel}.json", doc)
    for sub in folder.iterdir():
        if sub.is_dir() and not any(sub.iterdir()):
            sub.rmdir()


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


def read_table(path: str | os.PathLike, stage: str) -> list[dict[str, float]]:
    """The rows of a numeric CSV that :func:`write_csv` wrote (a run's ``history.csv``), empty cells
    left out. A missing, empty, truncated (no final newline, a short row) or non-numeric file
    raises :class:`~fedpipe.errors.InputError` naming it and ``dvc repro <stage>``."""
    from fedpipe.errors import InputError

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(path, "missing", stage) from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(path, f"unreadable ({_first_line(e)})", stage) from None
    lines = text.split("\n")
    if not text.endswith("\n") or len(lines) < 3 or not lines[0]:
        raise InputError(path, "empty or truncated (no header and rows ending in a newline)", stage)
    header = lines[0].split(",")
    rows = []
    for i, line in enumerate(lines[1:-1], start=2):
        cells = line.split(",")
        try:
            if len(cells) != len(header):
                raise ValueError(f"{len(cells)} cells, the header has {len(header)}")
            rows.append({k: float(v) for k, v in zip(header, cells, strict=True) if v != ""})
        except ValueError as e:
            raise InputError(path, f"line {i} is not a row of numbers ({e}; corrupt?)",
                             stage) from None
    return rows


def write_csv(path: str | os.PathLike, header: list[str], rows: list[list[Any]]) -> None:
    lines = [",".join(header)] + [",".join(_csv_cell(v) for v in row) for row in rows]
    write_text(path, "\n".join(lines) + "\n")


def _csv_cell(v: Any) -> str:
    if isinstance(v, float):
        return repr(round(v, 8))
    return str(v)


def save_tensors(path: str | os.PathLike, tensors: Mapping[str, torch.Tensor],
                 metadata: Mapping[str, str] | None = None) -> None:
    """Save tensors as safetensors (contiguous CPU copies), atomically, with a content hash.

    ``metadata`` may hold at most one key, whose value is a JSON object: safetensors writes its
    metadata map in an unspecified order, so two keys could give different bytes (and DVC hashes)
    for identical content. The writer adds :data:`HASH_FIELD` to that object (under
    :data:`CONTENT_KEY` when there is no metadata): the SHA-256 of every tensor (name, dtype,
    shape, bytes) and of the object itself, which :func:`read_tensors` verifies, so that bytes
    overwritten in place (same size, header intact) are never read as data.
    """
    if metadata and len(metadata) > 1:
        raise ValueError("save_tensors: use a single metadata key (a JSON string) for "
                         "byte-reproducible files")
    clean: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for k, v in tensors.items():  # names sharing storage (a state that holds one tensor twice)
        v = v.detach().to("cpu").contiguous()  # are written as copies: safetensors refuses aliases
        ptr = v.untyped_storage().data_ptr() if v.numel() else -1
        clean[k] = v.clone() if ptr in seen else v
        seen.add(ptr)
    key, value = next(iter(metadata.items())) if metadata else (CONTENT_KEY, "{}")
    if key != SKIPPED_KEY:  # a skipped stage's placeholder holds no data
        obj = json.loads(value)
        if not isinstance(obj, dict) or HASH_FIELD in obj:
            raise ValueError(f"save_tensors: metadata {key!r} must be a JSON object without "
                             f"{HASH_FIELD!r}")
        body = json.dumps(obj, sort_keys=True)  # the hashed form: canonical, keys sorted
        # stored in the caller's key order (a checkpoint's history rows keep their column order)
        value = json.dumps({**obj, HASH_FIELD: content_hash(clean, body)})
    with atomic_path(path) as tmp:
        save_file(clean, str(tmp), metadata={key: value})


SKIPPED_KEY = "fedpipe_skipped"  # metadata key of a skipped stage's placeholder (pipeline.plan)
CONTENT_KEY = "fedpipe.content"  # metadata key of a file written without metadata of its own
HASH_FIELD = "content_sha256"  # the field of the metadata object that holds the content hash


def content_hash(tensors: Mapping[str, torch.Tensor], meta: str) -> str:
    """SHA-256 of the tensors (by sorted name: name, dtype, shape, then the raw bytes) and of the
    metadata text ``meta`` (the JSON object, keys sorted, without the hash)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(json.dumps([name, str(t.dtype), list(t.shape)]).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    h.update(meta.encode())
    return h.hexdigest()


def read_tensors(path: str | os.PathLike, stage: str | None = None, verify: bool = True
                 ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The tensors of a safetensors file and its metadata object (the JSON of its one metadata key,
    without the hash), checked: a missing, unreadable (truncated, garbage) file, or one whose
    content does not match the hash it was written with (bytes changed in place), raises
    :class:`~fedpipe.errors.InputError` naming the file and ``dvc repro <stage>``. ``verify=False``
    accepts a file without a hash (one the user made, e.g. PerAda's backbone by path) but still
    checks one that has it. A skipped stage's placeholder raises SkippedStageError."""
    from safetensors import safe_open

    from fedpipe.errors import InputError, SkippedStageError

    path = Path(path)
    if not path.is_file():
        raise InputError(path, "missing", stage)
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = f.metadata() or {}
            if SKIPPED_KEY in raw:
                raise SkippedStageError(
                    f"{path} was not built: its stage was skipped because the study does not use "
                    "it (data/plan/diffusion.json); add a method that needs it to the study, then "
                    "`dvc repro`")
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (no __iter__)
    except (SkippedStageError, InputError):
        raise
    except Exception as e:  # noqa: BLE001 (SafetensorError, OSError: the file is unreadable)
        raise InputError(path, f"not a readable safetensors file ({_first_line(e)}; truncated or "
                         "corrupt?)", stage) from None
    meta, problem = _checked_meta(raw, tensors)
    if problem is not None and (verify or problem != _NO_HASH):
        raise InputError(path, problem, stage)
    return tensors, meta


_NO_HASH = "has no content hash (not written by this pipeline, or by an older version of it)"


def _checked_meta(raw: Mapping[str, str], tensors: Mapping[str, torch.Tensor]
                  ) -> tuple[dict[str, Any], str | None]:
    """(the metadata object without its hash, what is wrong with the content: None if nothing)."""
    if len(raw) != 1:
        return {}, _NO_HASH
    (value,) = raw.values()
    try:
        obj = json.loads(value)
    except ValueError:
        return {}, "metadata is not JSON (corrupt?)"
    if not isinstance(obj, dict) or HASH_FIELD not in obj:
        return {}, _NO_HASH
    want = obj.pop(HASH_FIELD)
    if content_hash(tensors, json.dumps(obj, sort_keys=True)) != want:
        return obj, "content does not match its hash (bytes changed since it was written)"
    return obj, None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def load_tensors(path: str | os.PathLike, stage: str | None = None, verify: bool = True
                 ) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, checked by :func:`read_tensors`."""
    return read_tensors(path, stage, verify)[0]


def read_metadata(path: str | os.PathLike, key: str) -> Any:
    """The JSON stored under metadata ``key`` of a safetensors file, without the content hash (None
    if the key is absent). Reads the header only: nothing is verified (:func:`read_tensors` does)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        raw = (f.metadata() or {}).get(key)
    if raw is None:
        return None
    obj = json.loads(raw)
    if isinstance(obj, dict):
        obj.pop(HASH_FIELD, None)
    return obj


def read_json_input(path: str | os.PathLike, stage: str) -> Any:
    """A JSON file another stage wrote; missing, unreadable or not JSON: InputError (one line naming
    the file and ``dvc repro <stage>``)."""
    from fedpipe.errors import InputError

    try:
        return read_json(path)
    except FileNotFoundError:
        raise InputError(path, "missing", stage) from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(path, f"not readable JSON ({_first_line(e)}; truncated or corrupt?)",
                         stage) from None


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
        return f"not a readable safetensors file ({_first_line(e)}; truncated or corrupt?)"
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
