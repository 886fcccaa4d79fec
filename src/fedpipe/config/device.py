"""The compute device, set once for every track: top-level ``device`` (auto | cpu | cuda) and
``accel`` (what CUDA switches on; see :mod:`fedpipe.device`).

Every stage that trains, samples or scores (federate, warm-up, generate, federate_ddpm,
feature_extractor, aux_quality) reads both, so that ``-S device=cuda`` moves the whole pipeline.
``cuda`` on a machine without CUDA is refused with one line when the config is built, before any
compute. The old per-section keys ``diffusion.device`` and ``fid.device`` are refused with a line
naming the top-level key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedpipe.config.core import ConfigError, build, section

DEVICES = ("auto", "cpu", "cuda")
SECTIONS = ("device", "accel")  # the params a device-reading stage declares


@dataclass(frozen=True)
class AccelConfig:
    """CUDA-only speed-ups (no effect on the CPU).

    - ``bf16_autocast``: forward passes under bf16 autocast (the loss in float32); default on.
    - ``compile``: ``torch.compile`` the trained model's forward (once per model instance); opt-in,
      it pays for long runs of one model (warm-up, federated DDPM), not for a few steps.
    """

    bf16_autocast: bool = True
    compile: bool = False


@dataclass(frozen=True)
class DeviceConfig:
    """``name`` as given (``auto``, ``cpu``, ``cuda``), ``resolved`` (``cpu`` or ``cuda``: where
    the stage computes; recorded with its results) and the ``accel`` switches."""

    name: str = "auto"
    resolved: str = "cpu"
    accel: AccelConfig = AccelConfig()

    @property
    def torch(self):
        import torch

        return torch.device(self.resolved)


def legacy_device_key(data: Any, prefix: str) -> None:
    """Refuse a section's own ``device`` key (before this setting was one for every track)."""
    if isinstance(data, dict) and "device" in data:
        raise ConfigError(f"{prefix}.device", data["device"],
                          "no such key: set the top-level `device` (auto | cpu | cuda), which "
                          "every stage reads")


def device_config(params: dict[str, Any]) -> DeviceConfig:
    """The validated ``device`` and ``accel`` of ``params``; ``cuda`` without a CUDA device raises
    :class:`ConfigError` (one line, before any compute)."""
    name = params.get("device", "auto")
    if not isinstance(name, str) or name not in DEVICES:
        raise ConfigError("device", name, "one of " + ", ".join(DEVICES))
    accel = build(AccelConfig, section(params, "accel", ""), "accel")
    from fedpipe.device import resolve_device  # imports torch: only once a stage validates

    return DeviceConfig(name, resolve_device(name, "device").type, accel)


def device_params(params: dict[str, Any], cfg: DeviceConfig) -> dict[str, Any]:
    """What a device-reading stage records in its ``params_read`` (MLflow params, resume
    fingerprints): the device it computes on (``auto`` resolved, so a checkpoint written on one
    device never resumes on another) and ``accel`` as given."""
    return {"device": cfg.resolved, "accel": params.get("accel", {})}
