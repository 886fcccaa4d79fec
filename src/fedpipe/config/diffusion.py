"""Diffusion-track params: sections ``diffusion`` (the DDPM), ``warmup`` (local DDPMs), ``generate``
(the auxiliary set) and ``fid`` (the FID feature extractor and sample counts).

Paper values (FedDDPM, arXiv 2503.06426, Section VI-A) are named in the docstrings; where the paper
is silent the default is an inferred one and is marked so (docs/papers/fedddpm.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedpipe.config.core import ConfigError, build, check, one_of
from fedpipe.config.device import legacy_device_key
from fedpipe.config.fl import ModelConfig, check_optimization, model_config
from fedpipe.config.models import check_model, dry_build

UNET_PRESETS = ("digits_small", "mnist_paper", "cifar_paper")
SAMPLERS = ("ddpm", "ddim")
EXTRACTORS = ("classifier", "inception")


@dataclass(frozen=True)
class DiffusionConfig:
    """The DDPM noise predictor and its noise schedule.

    - ``unet``: a preset of ``fedpipe.models.unet`` (``mnist_paper``: 3 levels 128/128/256, one res
      block each; ``cifar_paper``: Ho et al.'s CIFAR-10 net; ``digits_small``: a CPU-sized net for 8x8
      digits); ``unet_kwargs`` override single ``UNet2DModel`` arguments.
    - ``num_train_timesteps`` T: paper 500 (MNIST) and 1000 (CIFAR); linear betas ``beta_start`` to
      ``beta_end`` (1e-4 to 0.02, Ho et al.; inferred for the paper), fixed variance.
    - ``conditional``: a class embedding (off in the paper); with it on, generated sets are labelled.
    - ``ema_decay``: EMA of weights during warm-up (null = off, the default).

    The device is the top-level ``device`` (:mod:`fedpipe.config.device`), as for every track.
    """

    unet: str = "digits_small"
    unet_kwargs: dict = field(default_factory=dict)
    num_train_timesteps: int = 1000
    beta_start: float = 1e-4
    beta_end: float = 0.02
    conditional: bool = False
    ema_decay: float | None = None

    def validate(self, p: str) -> None:
        one_of(f"{p}.unet", self.unet, UNET_PRESETS)
        check(self.num_train_timesteps >= 2, f"{p}.num_train_timesteps", self.num_train_timesteps,
              "an integer >= 2")
        check(0 < self.beta_start < 1, f"{p}.beta_start", self.beta_start, "a number in (0, 1)")
        check(self.beta_start < self.beta_end < 1, f"{p}.beta_end", self.beta_end,
              f"a number in ({p}.beta_start = {self.beta_start}, 1)")
        if self.ema_decay is not None:
            check(0 < self.ema_decay < 1, f"{p}.ema_decay", self.ema_decay, "null or a number in (0, 1)")


@dataclass(frozen=True)
class WarmupConfig:
    """Each client trains its own DDPM on its local data before FL (FedDDPM Sec. VI-A).

    ``epochs``: paper 200 (MNIST), 400 (CIFAR-10), 600 (CIFAR-100). Optimizer, lr and batch size are not
    given for the warm-up; inferred: the client settings (Adam, 2e-4, B = 128 / 64).
    """

    epochs: int = 200
    batch_size: int = 128
    optimizer: str = "adam"
    lr: float = 2e-4
    weight_decay: float = 0.0
    grad_clip: float | None = None
    steps: int | None = None
    """A cap on each client's warm-up steps (null: ``epochs`` whole). Not the paper's: for cost
    estimates (``fedpipe.estimate``'s slice) and quick trials; a client stops at
    ``min(steps, epochs x ceil(m_i / batch_size))``."""

    def validate(self, p: str) -> None:
        check_optimization(self, p)


@dataclass(frozen=True)
class GenerateConfig:
    """The auxiliary set: |A_i| = ratio * m_i samples from client i's warm-up model (paper: 0.1;
    largest-remainder rounding so that the total is round(ratio * m) exactly).

    ``sampler``: ``ddpm`` = ancestral sampling over all T steps (the paper's); ``ddim`` = DDIM with
    ``ddim_steps`` steps (a documented deviation, much cheaper).
    """

    ratio: float = 0.1
    sampler: str = "ddpm"
    ddim_steps: int = 50
    batch_size: int = 256

    def validate(self, p: str) -> None:
        check(0 < self.ratio <= 10, f"{p}.ratio", self.ratio, "a number in (0, 10]")
        one_of(f"{p}.sampler", self.sampler, SAMPLERS)
        check(self.ddim_steps >= 1, f"{p}.ddim_steps", self.ddim_steps, "an integer >= 1")
        check(self.batch_size >= 1, f"{p}.batch_size", self.batch_size, "an integer >= 1")


@dataclass(frozen=True)
class FIDConfig:
    """FID (``fedpipe.metrics.fid``).

    - ``extractor``: ``classifier`` (default, offline) = penultimate features of ``classifier``
      trained on the real training set by the ``feature_extractor`` stage; ``inception`` = the
      standard 2048-d InceptionV3 FID, which needs ``inception_weights``, a local copy of
      FID Inception weights (pytorch-fid's ``pt_inception-2015-12-05-6726825d.pth``; torch-fidelity's
      ``weights-inception-2015-12-05-6726825d.pth`` has the same layout).
    - ``num_samples``: generated samples per FID of a model (logged next to every score).
    - ``classifier_epochs`` / ``classifier_lr`` / ``classifier_batch_size``: its training (Adam).
    - ``curve_samples``: generated samples per point of a federated DDPM's FID-per-round curve
      (every ``diffusion_fl.eval_every`` rounds).
    - ``sampler`` / ``ddim_steps``: how models are sampled for FID (``ddpm``: all T steps, the paper's).
    - ``curve_sampler``: how they are sampled for the FID-per-round curve (default ``ddim`` with
      ``ddim_steps``: T / ddim_steps times cheaper, so the curve costs about 4% of the federated run
      instead of half of it; the final FID and FedDDPM+'s QuickTest keep ``sampler``). Not from the
      paper, which draws no per-round curve; ``ddpm`` restores the sampler of the final FID.

    Features are computed on the top-level ``device`` (:mod:`fedpipe.config.device`).
    """

    extractor: str = "classifier"
    inception_weights: str | None = None
    num_samples: int = 1000
    batch_size: int = 256
    classifier: ModelConfig = field(default_factory=lambda: ModelConfig("lenet", {}))
    classifier_epochs: int = 30
    classifier_lr: float = 1e-3
    classifier_batch_size: int = 64
    curve_samples: int = 200
    sampler: str = "ddpm"
    ddim_steps: int = 50
    curve_sampler: str = "ddim"

    def validate(self, p: str) -> None:
        one_of(f"{p}.extractor", self.extractor, EXTRACTORS)
        if self.extractor == "inception":
            check(bool(self.inception_weights), f"{p}.inception_weights", self.inception_weights,
                  "a local path to the FID Inception weights (pt_inception-2015-12-05-6726825d.pth)")
            check(Path(self.inception_weights).is_file(), f"{p}.inception_weights",
                  self.inception_weights, "an existing file (torch-fidelity's InceptionV3 weights; "
                  "it cannot be downloaded by the pipeline)")
        check(self.num_samples >= 2, f"{p}.num_samples", self.num_samples, "an integer >= 2")
        check(self.batch_size >= 1, f"{p}.batch_size", self.batch_size, "an integer >= 1")
        check(self.classifier_epochs >= 1, f"{p}.classifier_epochs", self.classifier_epochs,
              "an integer >= 1")
        check(self.classifier_lr > 0, f"{p}.classifier_lr", self.classifier_lr, "a number > 0")
        check(self.classifier_batch_size >= 1, f"{p}.classifier_batch_size",
              self.classifier_batch_size, "an integer >= 1")
        check(self.curve_samples >= 2, f"{p}.curve_samples", self.curve_samples, "an integer >= 2")
        one_of(f"{p}.sampler", self.sampler, SAMPLERS)
        one_of(f"{p}.curve_sampler", self.curve_sampler, SAMPLERS)
        check(self.ddim_steps >= 1, f"{p}.ddim_steps", self.ddim_steps, "an integer >= 1")


def diffusion_config(data: dict[str, Any] | None, prefix: str = "diffusion") -> DiffusionConfig:
    legacy_device_key(data, prefix)
    return build(DiffusionConfig, data, prefix)


def warmup_config(data: dict[str, Any] | None, prefix: str = "warmup") -> WarmupConfig:
    return build(WarmupConfig, data, prefix)


def generate_config(data: dict[str, Any] | None, prefix: str = "generate") -> GenerateConfig:
    return build(GenerateConfig, data, prefix)


def fid_config(data: dict[str, Any] | None, prefix: str = "fid") -> FIDConfig:
    if data is not None and not isinstance(data, dict):
        raise ConfigError(prefix, data, "a mapping of FID settings")
    legacy_device_key(data, prefix)
    data = dict(data or {})
    if "classifier" in data and not isinstance(data["classifier"], dict):
        raise ConfigError(f"{prefix}.classifier", data["classifier"],
                          "a mapping with a model name and kwargs")
    classifier = model_config(data.pop("classifier", {"name": "lenet"}), f"{prefix}.classifier")
    cfg = build(FIDConfig, data, prefix)
    return FIDConfig(**{**cfg.__dict__, "classifier": classifier})


def check_diffusion_models(ds: Any, diff: DiffusionConfig, fid: FIDConfig) -> None:
    """The noise predictor (``diffusion.unet`` with ``unet_kwargs``) and the FID classifier
    (``fid.classifier``) build for the data's image shape, known without loading it (see
    :mod:`fedpipe.config.models`; imports the models, so the stages that may be skipped call it
    once they know they run, before any data loads)."""
    from fedpipe.models.unet import build_unet

    shape, classes = ds.in_shape(), ds.num_classes()
    dry_build("diffusion.unet_kwargs", diff.unet_kwargs,
              f"UNet preset {diff.unet} for {shape} images",
              lambda kw: build_unet(diff.unet, shape, classes if diff.conditional else None, **kw))
    check_model(fid.classifier, "fid.classifier", shape, classes)


def check_diffusion_track(ds: Any, diff: DiffusionConfig, fid: FIDConfig,
                          generate: GenerateConfig | None = None) -> None:
    """Cheap cross-checks of the diffusion-track sections with the dataset, without loading it: a
    conditional DDPM needs classes; a DDIM sampler has at most T steps."""
    if diff.conditional:
        check(ds.num_classes() >= 2, "diffusion.conditional", True,
              "false for a dataset with one class")
    t = diff.num_train_timesteps
    for name, cfg in (("generate", generate), ("fid", fid)):
        if cfg is not None and cfg.sampler == "ddim":  # the ddpm sampler ignores ddim_steps
            check(cfg.ddim_steps <= t, f"{name}.ddim_steps", cfg.ddim_steps,
                  f"an integer in [1, diffusion.num_train_timesteps = {t}] with {name}.sampler ddim")
