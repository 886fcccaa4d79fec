"""The inputs every training stage shares, kept apart from the algorithm registry so that the
diffusion stages (warm-up, generation) import neither the algorithms nor the round engine: the
partition file, each client's data, and the fingerprint that identifies resumable work."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from fedpipe.data import ClientData, Dataset, Partition, client_data
from fedpipe.errors import InputError
from fedpipe.io import SKIPPED_KEY, load_tensors, md5_file, set_aside  # noqa: F401  (set_aside re-exported)

PARTITION_PATH = "data/partition/partition.safetensors"
PARTITION_KEYS = ("train_indices", "train_offsets", "test_indices", "test_offsets")


def safetensors_problem(path: str | Path, keys: tuple[str, ...] = (), metadata: str | None = None
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


def check_input(path: str | Path, stage: str, keys: tuple[str, ...] = (),
                metadata: str | None = None) -> None:
    """Raise :class:`InputError` (one line: the file, the problem, ``dvc repro <stage>``) unless
    ``path`` is a readable safetensors file with ``keys``; stages call it before any compute."""
    problem = safetensors_problem(path, keys, metadata)
    if problem is not None:
        raise InputError(path, problem, stage)


def load_partition(path: str | Path = PARTITION_PATH) -> Partition:
    check_input(path, "partition", PARTITION_KEYS, "fedpipe.partition")
    return Partition.load(path)


def clients_of(ds: Dataset, part: Partition, which: str = "train") -> list[ClientData]:
    split = ds.train if which == "train" else ds.test
    return [client_data(split, part, i, which) for i in range(part.num_clients)]


def code_version() -> str:
    """A hash of fedpipe's own source files. Part of every resume fingerprint: when DVC re-runs a
    stage because the code changed, an old checkpoint must not stand in for the new result."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def fingerprint_of(params: dict, *files: str | Path) -> str:
    """Identifies partial work: params, the contents of input files and the code version (a
    checkpoint resumes only on a match)."""
    blob = json.dumps({"params": params, "files": [md5_file(f) for f in files],
                       "code": code_version()}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def checkpoint_dir(out_root: str | Path, *parts: str) -> Path:
    """Where a stage keeps its resume state: ``<out_root's parent>/checkpoints/<out_root's name>/
    <parts>`` (``data/checkpoints/federate/<algo>/seed_<s>`` by default). Not a DVC output: every
    output of a training stage is then cached, so ``dvc exp apply`` restores it and DVC's run-cache
    restores an earlier params' result instead of recomputing it. Git-ignored like all of data/."""
    root = Path(out_root)
    return root.parent / "checkpoints" / root.name / Path(*parts)
