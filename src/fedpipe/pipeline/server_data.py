"""Server data (round protocol v2): the typed data a method's server step trains on.

A method declares what it needs in its config (``server_data``: ``none``, ``aux`` or ``distill``; see
:data:`fedpipe.fl.SERVER_DATA_KINDS`) and the pipeline provides it without naming methods: the
``server_data`` stage looks at the study's classification algorithms, and for each kind one of them
needs writes, for replicate r of ``study.seeds`` (the stage ``server_data@<r>``),
``data/server_data/seed_<r>/<kind>.safetensors`` from replicate r's auxiliary set the diffusion track
generated (``aux``: as generated, labelled when the warm-up was class-conditional; ``distill``: the
same images, labels dropped; ``holdout`` and ``public`` come from the dataset split every replicate
shares). The ``federate@<algorithm>-<r>`` stages depend on their replicate's folder, so a change of the
generation re-runs only the runs that read it: for a study whose methods need nothing the folder
holds just its manifest, which does not change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fedpipe.config import ConfigError
from fedpipe.io import check_input, load_tensors, md5_file, save_tensors, write_json
from fedpipe.pipeline.server_inputs import MANIFEST, SERVER_DATA_DIR


def write_server_data(kinds: dict[str, list[str]], aux_path: str | Path,
                      out_dir: str | Path = SERVER_DATA_DIR, holdout=None, public=None
                      ) -> dict[str, Any]:
    """Write each needed kind from the auxiliary set, ``holdout`` from the dataset's held-out split
    ``holdout`` and ``public`` from the split ``public`` (another dataset's training images), labels
    dropped; the manifest lists kinds and their users."""
    out = Path(out_dir)
    manifest: dict[str, Any] = {"kinds": {}}
    for kind, split, key, allowed in (
            ("holdout", holdout, "dataset.holdout_fraction", "> 0 (digits)"),
            ("public", public, "dataset.public_dataset", "a torchvision dataset in dataset.root")):
        if kind not in kinds:
            continue
        if split is None or len(split) == 0:
            raise ConfigError(key, None, f"{allowed}: {', '.join(kinds[kind])} distil on the "
                              f"{kind} server data")
        save_tensors(out / f"{kind}.safetensors",
                     {"images": split.x, "labels": torch.full_like(split.y, -1)})
        manifest["kinds"][kind] = {"algorithms": kinds[kind], "samples": len(split),
                                   "labelled": False, "source": key}
    kinds = {k: v for k, v in kinds.items() if k not in ("holdout", "public")}
    if kinds:
        check_input(aux_path, "generate", ("images", "labels", "client"))
        # the generate stage's file: images, labels (-1 = none), client
        aux = load_tensors(aux_path, "generate")
        for kind, users in sorted(kinds.items()):
            labels = aux["labels"] if kind == "aux" else torch.full_like(aux["labels"], -1)
            path = out / f"{kind}.safetensors"
            save_tensors(path, {"images": aux["images"], "labels": labels})
            manifest["kinds"][kind] = {"algorithms": users, "samples": len(labels),
                                       "labelled": bool((labels >= 0).all()),
                                       "source": str(aux_path), "source_md5": md5_file(aux_path)}
    for f in out.glob("*.safetensors") if out.is_dir() else []:
        if f.stem not in manifest["kinds"]:
            f.unlink()
    write_json(out / MANIFEST, manifest)
    return manifest


def public_split(params: dict[str, Any]):
    """The training split of ``dataset.public_dataset``, read from the dataset root (never
    downloaded); its image shape must be the study dataset's."""
    from fedpipe.config import dataset_config
    from fedpipe.config.dataset import public_dataset_config
    from fedpipe.data import load_dataset

    own = dataset_config(params.get("dataset"))
    name = own.public_dataset
    other = load_dataset(public_dataset_config(own))  # a stand-in when the study's data is one
    mine = load_dataset(own)
    if other.meta.shape != mine.meta.shape:
        raise ConfigError("dataset.public_dataset", name,
                          f"a dataset of the study's image shape {mine.meta.shape}")
    return other.train


