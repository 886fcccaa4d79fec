"""Set-up shared by the benchmarks that score trained diffusion models (``fid_noise.py``,
``quicktest_noise.py``; not a benchmark itself): loading models of the federate_ddpm stage with the
FID extractor of the feature_extractor stage, and the tiny stand-ins their ``--quick`` runs use.
"""

from __future__ import annotations

import argparse
import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedpipe.config import load_params
from fedpipe.data import load_dataset
from fedpipe.io import load_tensors
from fedpipe.pipeline.diffusion import FID_DIR, make_task, make_unet
from fedpipe.pipeline.federate_ddpm import DDPMTrainConfig, ddpm_train_config
from fedpipe.pipeline.fid_tools import FIDTools, load_fid_tools
from fedpipe.tasks.diffusion import DiffusionTask

DEFAULT_MODEL = Path("data/federate_ddpm/fedavg/seed_0/model.safetensors")


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The options naming the model and its inputs: ``--model``, ``--params``, ``--fid-dir``,
    ``--threads``."""
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--fid-dir", type=Path, default=FID_DIR)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")


@dataclass
class LoadedModels:
    """Trained models of one federate_ddpm run setting, ready to sample and score."""
    cfg: DDPMTrainConfig
    task: DiffusionTask
    tools: FIDTools
    models: list[torch.nn.Module]
    class_counts: np.ndarray
    device: torch.device


def run_of(model: Path) -> tuple[str, int]:
    """(algorithm, replicate) of a model path ``.../<algorithm>/seed_<n>/model.safetensors``
    (("fedavg", 0) when the path does not say)."""
    found = re.search(r"([^/]+)/seed_(\d+)/", model.as_posix())
    return (found.group(1), int(found.group(2))) if found else ("fedavg", 0)


def load_models(paths: Sequence[Path], params: Path, fid_dir: Path) -> LoadedModels:
    """The models at ``paths`` (the first one's directory names the algorithm and replicate whose
    federate_ddpm config is read from ``params``) with the FID tools of ``fid_dir``. A missing model
    is one line and exit 1, before anything loads."""
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"error: missing {path}; run `dvc repro federate_ddpm@fedavg-0` first")
    algorithm, run_seed = run_of(paths[0])
    cfg = ddpm_train_config(load_params(params), algorithm, run_seed)
    ds = load_dataset(cfg.dataset)
    device = cfg.device.torch
    task = make_task(cfg.diffusion, cfg.device.accel)

    def load(path: Path) -> torch.nn.Module:
        m = make_unet(cfg.diffusion, ds.meta, cfg.seed, "ddpm-global-init")
        m.load_state_dict(load_tensors(path))
        return m.to(device).eval()

    models = [load(p) for p in paths]
    tools = load_fid_tools(cfg.fid, ds.meta, cfg.seed, fid_dir, device)
    class_counts = np.bincount(ds.train.y.numpy(), minlength=ds.meta.num_classes)
    return LoadedModels(cfg, task, tools, models, class_counts, torch.device(device))


@contextlib.contextmanager
def tiny_models(paths: Sequence[Path], fid_dir: Path, purpose: str,
                layers: Sequence[dict[str, Any]] = ()) -> Iterator[dict[str, Any]]:
    """Inside: a temporary working directory (benchmarks/_quick.py's ``tiny_workdir`` with a CPU
    device and ``layers``) holding the FID extractor trained for one epoch at ``fid_dir`` and
    untrained UNets (T = 10) at ``paths``, the i-th initialised from the stream ``(seed, purpose,
    i)``. Yields the params."""
    from _quick import tiny_workdir

    from fedpipe.io import save_tensors
    from fedpipe.pipeline.diffusion import diffusion_stage_config
    from fedpipe.pipeline.feature_extractor import feature_extractor

    with tiny_workdir({"device": "cpu"}, *layers) as params:
        feature_extractor(diffusion_stage_config(params, "feature_extractor"), fid_dir,
                          progress=False)
        cfg = ddpm_train_config(params, run_of(paths[0])[0], 0)
        meta = load_dataset(cfg.dataset).meta
        for i, path in enumerate(paths):
            model = make_unet(cfg.diffusion, meta, cfg.seed, purpose, i)
            save_tensors(path, dict(sorted(model.state_dict().items())))
        yield params
