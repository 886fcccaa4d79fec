"""The inputs every training stage shares, kept apart from the algorithm registry so that the
diffusion stages (warm-up, generation) import neither the algorithms nor the round engine: a
replicate's seed argument and folder, the partition file, each client's data, and the fingerprint
that identifies resumable work."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from fedpipe.config.core import check
from fedpipe.data import ClientData, Dataset, Partition, client_data
from fedpipe.io import (  # noqa: F401  (re-exported: the stages' input checks)
    check_input,
    md5_file,
    safetensors_problem,
    set_aside,
)

PARTITION_DIR = "data/partition"
BACKBONE_DIR = "data/backbone"


def replicate_seed(value: int | str) -> int:
    """A per-replicate stage's seed argument (one of ``study.seeds``: ``partition@<seed>``, ...)."""
    if isinstance(value, str):
        check(value.isdigit(), "seed argument", value, "an integer >= 0 (one of study.seeds)")
        value = int(value)
    check(isinstance(value, int) and not isinstance(value, bool) and value >= 0, "seed argument",
          value, "an integer >= 0 (one of study.seeds)")
    return value


def replicate_dir(root: str | Path, seed: int) -> Path:
    """The folder of replicate ``seed`` (one of ``study.seeds``) of a per-replicate stage's outputs:
    ``<root>/seed_<seed>`` (``data/partition/seed_0``, ``data/warmup/seed_2``, ...). Each replicate
    of the whole experiment draws its partition, warm-up DDPMs, auxiliary set, server data and
    training streams from its own seed (docs/replicates.md)."""
    return Path(root) / f"seed_{seed}"


def partition_file(seed: int, root: str | Path = PARTITION_DIR) -> Path:
    """The ``partition@<seed>`` stage's partition file: ``<root>/seed_<seed>/partition.safetensors``."""
    return replicate_dir(root, seed) / "partition.safetensors"


def backbone_path(seed: int, root: str | Path = BACKBONE_DIR) -> Path:
    """The ``backbone`` stage's output for training seed ``seed`` (PerAda's ``backbone: fedavg``):
    ``<root>/seed_<seed>/model.safetensors``."""
    return replicate_dir(root, seed) / "model.safetensors"


PARTITION_KEYS = ("train_indices", "train_offsets", "test_indices", "test_offsets")


def load_partition(path: str | Path, seed: int | None = None) -> Partition:
    """The partition file at ``path``; ``seed``: its replicate (the error names `dvc repro
    partition@<seed>`)."""
    stage = "partition" if seed is None else f"partition@{seed}"
    check_input(path, stage, PARTITION_KEYS, "fedpipe.partition")
    return Partition.load(path, stage)


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
    <parts>`` (``data/checkpoints/federate/<algo>/seed_<s>`` by default; for a replicate's folder
    ``data/warmup/seed_<r>``: ``data/checkpoints/warmup/seed_<r>/<parts>``). Not a DVC output: every
    output of a training stage is then cached, so ``dvc exp apply`` restores it and DVC's run-cache
    restores an earlier params' result instead of recomputing it. Git-ignored like all of data/."""
    root = Path(out_root)
    if root.name.startswith("seed_") and root.parent.name:  # a replicate's folder (replicate_dir):
        root, parts = root.parent, (root.name, *parts)  # data/checkpoints/warmup/seed_<r>/...
    return root.parent / "checkpoints" / root.name / Path(*parts)
