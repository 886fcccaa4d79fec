"""Shared set-up of the diffusion-track stages (``feature_extractor``, ``warmup@<seed>``,
``generate@<seed>``, ``aux_quality@<seed>``): their view of params, the DDPM task, the noise
predictor, and the paths of the stage outputs.

A stage validates its view and learns whether it is skipped before it builds any model, so the model
and task modules (diffusers) are imported by the functions that build them, not by this module.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fedpipe.config.core import check_sections, read_seed
from fedpipe.config.dataset import dataset_config
from fedpipe.config.device import (
    AccelConfig,
    DeviceConfig,
    device_config,
    device_params,
)
from fedpipe.config.diffusion import (
    DiffusionConfig,
    FIDConfig,
    GenerateConfig,
    WarmupConfig,
    check_diffusion_track,
    diffusion_config,
    fid_config,
    generate_config,
    warmup_config,
)
from fedpipe.pipeline.inputs import (
    replicate_dir,
    replicate_seed,
)
from fedpipe.rng import torch_seed

if TYPE_CHECKING:
    from fedpipe.data import DatasetMeta
    from fedpipe.models.unet import NoisePredictor
    from fedpipe.tasks.diffusion import DiffusionTask

FID_DIR = Path("data/fid")  # shared by every replicate (from the root ``seed``)
# per replicate r of ``study.seeds``: <root>/seed_<r> (fedpipe.pipeline.inputs.replicate_dir)
WARMUP_DIR = Path("data/warmup")
GENERATE_DIR = Path("data/generate")
AUX_QUALITY_DIR = Path("data/aux_quality")
AUX_NAME = "aux.safetensors"


@dataclass(frozen=True)
class DiffusionStageConfig:
    """What the diffusion-track stages read. Each stage declares in dvc.yaml only the sections it uses
    (``params_read``), so that changing an FL algorithm never re-runs warm-up or generation."""

    seed: int
    """The replicate's seed (per-replicate stages) or the root seed (``feature_extractor``)."""
    dataset: Any
    diffusion: DiffusionConfig
    warmup: WarmupConfig
    generate: GenerateConfig
    fid: FIDConfig
    params_read: dict
    device: DeviceConfig = DeviceConfig()


STAGE_SECTIONS = {  # each also reads the top-level device and accel
    "feature_extractor": ("seed", "dataset", "fid"),
    "warmup": ("seed", "dataset", "diffusion", "warmup"),
    "generate": ("seed", "dataset", "diffusion", "warmup", "generate"),
    "aux_quality": ("seed", "dataset", "diffusion", "generate", "fid"),
}


def diffusion_stage_config(params: dict[str, Any], stage: str, seed: int | str | None = None
                           ) -> DiffusionStageConfig:
    """Validate all diffusion-track sections (before any data is loaded); record those ``stage``
    reads. ``seed``: the replicate of a per-replicate stage (``warmup@<seed>``, ``generate@<seed>``,
    ``aux_quality@<seed>``), recorded as the ``seed`` it read; None: the root ``seed`` (the shared
    ``feature_extractor``, or a script run by hand)."""
    check_sections(params)
    root = read_seed(params)
    seed = root if seed is None else replicate_seed(seed)
    ds = dataset_config(params.get("dataset"))
    diff = diffusion_config(params.get("diffusion"))
    cfg = DiffusionStageConfig(
        seed=seed, dataset=ds, diffusion=diff, warmup=warmup_config(params.get("warmup")),
        generate=generate_config(params.get("generate")), fid=fid_config(params.get("fid")),
        params_read={k: seed if k == "seed" else params.get(k) for k in STAGE_SECTIONS[stage]})
    check_diffusion_track(ds, diff, cfg.fid, cfg.generate)
    device = device_config(params)  # last: the cheap checks name their keys first
    cfg = replace(cfg, device=device, params_read={**cfg.params_read,
                                                   **device_params(params, device)})
    return cfg


def aux_file(seed: int, root: str | Path = GENERATE_DIR) -> Path:
    """The auxiliary set of replicate ``seed`` (the ``generate@<seed>`` stage's output)."""
    return replicate_dir(root, seed) / AUX_NAME


def make_task(cfg: DiffusionConfig, accel: AccelConfig | None = None) -> DiffusionTask:
    """The DDPM task of ``cfg``, with the CUDA switches of ``accel`` (top-level ``accel``)."""
    from fedpipe.tasks.diffusion import DiffusionTask

    accel = accel or AccelConfig()
    return DiffusionTask(num_train_timesteps=cfg.num_train_timesteps, beta_start=cfg.beta_start,
                         beta_end=cfg.beta_end, conditional=cfg.conditional,
                         bf16_autocast=accel.bf16_autocast, compile=accel.compile)


def make_unet(cfg: DiffusionConfig, meta: DatasetMeta, seed: int, purpose: str, *keys: int
              ) -> NoisePredictor:
    """A fresh noise predictor with weights drawn from the stream ``(seed, purpose, *keys)``.

    torch's initialisers draw from the global RNG; ``fork_rng`` confines the seeding to this call.
    """
    from fedpipe.models.unet import build_unet

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(torch_seed(seed, purpose, *keys))
        return build_unet(cfg.unet, meta.shape, meta.num_classes if cfg.conditional else None,
                          **cfg.unet_kwargs)


def params_fingerprint(params: dict, *files: str | Path) -> str:
    """A short hash of params, input-file contents and the code version: identifies resumable
    partial work (see :func:`fedpipe.pipeline.common.fingerprint_of`)."""
    from fedpipe.pipeline.inputs import fingerprint_of

    return fingerprint_of(params, *files)


def client_path(models_dir: str | Path, client_id: int) -> Path:
    return Path(models_dir) / f"client_{client_id:03d}.safetensors"
