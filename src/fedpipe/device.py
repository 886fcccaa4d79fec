"""Where compute runs: the project's one ``device`` setting, and what it switches on CUDA.

Params (top level of ``params.yaml``, read by every training stage; :mod:`fedpipe.config.device`)::

    device: auto          # auto | cpu | cuda  (auto: CUDA when available, else the CPU)
    accel:
      bf16_autocast: true # bf16 autocast of the forward passes on CUDA (never on the CPU)
      compile: false      # torch.compile of the trained model's forward on CUDA (opt-in)

On the CPU nothing here changes a computation: no autocast, no fused optimizer, no compile, and the
CPU generators of the RNG streams are used as they are, so CPU results are bit for bit those of a
run without this module. On CUDA the inner loops avoid host work:

- random draws (diffusion timesteps and noise, sampling noise, feature-skew noise) come from a
  ``torch.Generator`` on the device (:func:`generator_on`), seeded from the caller's stream;
  nothing is drawn on the host and copied over per step. An epoch's batch order is the exception:
  drawn on the host from the caller's stream and copied once per epoch
  (:func:`fedpipe.data.skew.epoch_order`: a CUDA ``randperm`` costs far more host time);
- client data lives on the device (``ClientData.to``), so batches are indexed there;
- Adam / AdamW / SGD run fused (:func:`optimizer_options`);
- forward passes run under bf16 autocast (:func:`autocast`), the loss in float32;
- with ``accel.compile`` the trained model's forward is compiled once per model instance
  (:func:`compiled`); training goes through the compiled module, which shares the parameters, so
  state dicts keep their names.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable

import torch
from torch import nn

from fedpipe.errors import ConfigError
from fedpipe.rng import torch_seed

DEVICES = ("auto", "cpu", "cuda")
FUSED_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)


def cuda_available() -> bool:
    return torch.cuda.is_available()


def resolve_device(name: str, key: str = "device") -> torch.device:
    """``auto`` -> CUDA when available, else the CPU; ``cpu``; ``cuda`` (refused with a one-line
    :class:`~fedpipe.errors.ConfigError` naming ``key`` when no CUDA device is available)."""
    if name not in DEVICES:
        raise ConfigError(key, name, "one of " + ", ".join(DEVICES))
    if name == "cuda" and not cuda_available():
        raise ConfigError(key, name, "auto or cpu (no CUDA device is available on this machine)")
    if name == "auto":
        name = "cuda" if cuda_available() else "cpu"
    return torch.device(name)


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    return a.type == "cpu" or (a.index or 0) == (b.index or 0)


# -- random streams on the device --------------------------------------------------------------
_derived: weakref.WeakKeyDictionary[torch.Generator, torch.Generator] = weakref.WeakKeyDictionary()
# Where torch's Generator takes no weak reference (torch before 2.15: "cannot create weak reference
# to 'torch._C.Generator' object", found on the first CUDA run), the pair is held by id instead; the
# key generator is held with it, so its id cannot be reused by another while the entry lives (a
# small growth per generator a process sends to a device: a device generator is a seed and an offset).
_derived_by_id: dict[int, tuple[torch.Generator, torch.Generator]] = {}


def _cached(gen: torch.Generator) -> torch.Generator | None:
    try:
        return _derived.get(gen)
    except TypeError:  # no weak reference to gen
        entry = _derived_by_id.get(id(gen))
        return entry[1] if entry is not None else None


def _cache(gen: torch.Generator, derived: torch.Generator) -> None:
    try:
        _derived[gen] = derived
    except TypeError:
        _derived_by_id[id(gen)] = (gen, derived)


def derived_generator(gen: torch.Generator, device: str | torch.device) -> torch.Generator:
    """A generator on ``device`` seeded from ``gen``'s stream: ``torch_seed(gen.initial_seed(),
    "device-stream")`` (fedpipe.rng), so the same stream gives the same device draws whatever ran
    before. One per (``gen``, device): later calls continue the same device stream."""
    device = torch.device(device)
    cached = _cached(gen)
    if cached is not None and _same_device(cached.device, device):
        return cached
    g = torch.Generator(device=device)
    g.manual_seed(torch_seed(gen.initial_seed(), "device-stream"))
    _cache(gen, g)
    return g


def generator_on(gen: torch.Generator, device: str | torch.device) -> torch.Generator:
    """``gen`` itself when it lives on ``device`` (always so on the CPU: CPU runs draw exactly what
    they drew before), else its :func:`derived_generator` on ``device``."""
    device = torch.device(device)
    if _same_device(gen.device, device):
        return gen
    return derived_generator(gen, device)


# -- CUDA-only speed-ups -------------------------------------------------------------------------
def autocast_dtype(device: torch.device, enabled: bool = True) -> torch.dtype | None:
    """bf16 on CUDA when ``enabled``; None (no autocast) elsewhere."""
    return torch.bfloat16 if enabled and device.type == "cuda" else None


def autocast(device: torch.device, enabled: bool = True) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA only (CPU runs stay float32 and bit-reproducible)."""
    dtype = autocast_dtype(device, enabled)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def optimizer_options(params: Iterable[torch.Tensor], optimizer: type = torch.optim.Adam) -> dict:
    """Extra keyword arguments of ``optimizer`` for ``params``: ``fused=True`` when every parameter
    is on CUDA and the optimizer has a fused kernel (Adam, AdamW, SGD); nothing otherwise."""
    params = list(params)
    if (params and issubclass(optimizer, FUSED_OPTIMIZERS)
            and all(p.device.type == "cuda" for p in params)):
        return {"fused": True}
    return {}


def compiled(model: nn.Module, device: torch.device, enabled: bool) -> nn.Module:
    """``model`` itself, or on CUDA with ``enabled`` its ``torch.compile`` wrapper, built once per
    model instance (the wrapper shares ``model``'s parameters: training it trains ``model``)."""
    if not enabled or device.type != "cuda":
        return model
    wrapper = model.__dict__.get("_fedpipe_compiled")
    if wrapper is None:
        wrapper = torch.compile(model)
        # kept in the instance dict, not as a submodule: the state dict keeps its names
        model.__dict__["_fedpipe_compiled"] = wrapper
    return wrapper


def module_device(model: nn.Module) -> torch.device:
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")
