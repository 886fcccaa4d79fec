"""Shared set-up of the diffusion-track stages: the DDPM task, the noise predictor, and the
paths of the stage outputs."""

from __future__ import annotations

from pathlib import Path

import torch

from fedpipe.config.device import AccelConfig
from fedpipe.config.diffusion import DiffusionConfig
from fedpipe.data import DatasetMeta
from fedpipe.models.unet import NoisePredictor, build_unet
from fedpipe.pipeline.inputs import replicate_dir
from fedpipe.rng import torch_seed
from fedpipe.tasks.diffusion import DiffusionTask

FID_DIR = Path("data/fid")  # shared by every replicate (from the root ``seed``)
# per replicate r of ``study.seeds``: <root>/seed_<r> (fedpipe.pipeline.inputs.replicate_dir)
WARMUP_DIR = Path("data/warmup")
GENERATE_DIR = Path("data/generate")
AUX_QUALITY_DIR = Path("data/aux_quality")
AUX_NAME = "aux.safetensors"


def aux_file(seed: int, root: str | Path = GENERATE_DIR) -> Path:
    """The auxiliary set of replicate ``seed`` (the ``generate@<seed>`` stage's output)."""
    return replicate_dir(root, seed) / AUX_NAME


def make_task(cfg: DiffusionConfig, accel: AccelConfig | None = None) -> DiffusionTask:
    """The DDPM task of ``cfg``, with the CUDA switches of ``accel`` (top-level ``accel``)."""
    accel = accel or AccelConfig()
    return DiffusionTask(num_train_timesteps=cfg.num_train_timesteps, beta_start=cfg.beta_start,
                         beta_end=cfg.beta_end, conditional=cfg.conditional,
                         bf16_autocast=accel.bf16_autocast, compile=accel.compile)


def make_unet(cfg: DiffusionConfig, meta: DatasetMeta, seed: int, purpose: str, *keys: int
              ) -> NoisePredictor:
    """A fresh noise predictor with weights drawn from the stream ``(seed, purpose, *keys)``.

    torch's initialisers draw from the global RNG; ``fork_rng`` confines the seeding to this call.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(torch_seed(seed, purpose, *keys))
        return build_unet(cfg.unet, meta.shape, meta.num_classes if cfg.conditional else None,
                          **cfg.unet_kwargs)


def params_fingerprint(params: dict, *files: str | Path) -> str:
    """A short hash of params, input-file contents and the code version: identifies resumable
    partial work (see :func:`fedpipe.pipeline.common.fingerprint_of`)."""
    from fedpipe.pipeline.inputs import fingerprint_of

    return fingerprint_of(params, *files)
