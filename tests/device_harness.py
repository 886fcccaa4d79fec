"""A CPU-side check that fedpipe makes every tensor on an explicit device (docs/device.md).

:class:`DeviceHarness` is a ``torch.overrides.TorchFunctionMode``: while it is active, every torch
function call passes through it, and it fails the run, at the line that made the tensor, when

1. a *factory* (``torch.zeros``, ``torch.randn``, ``torch.tensor``, ... :data:`FACTORIES`) is called
   from fedpipe's own code (the calling frame's file is under the ``fedpipe`` package) without a
   ``device=`` argument (or with ``device=None``): on a GPU run such a tensor lands on the CPU
   while the data it meets is on the GPU; or
2. an op called, at some depth, from fedpipe's code gets tensor inputs on two devices (0-dim CPU
   tensors excepted, as torch allows them; the ops whose job is to move data between devices,
   :data:`TRANSFERS`, excepted too: ``Module.to`` compares the old and the new parameter across
   devices, and ``copy_`` / ``to`` take one on each side by design). The first CUDA run found that
   check 2 without the exceptions fails every ``model.to("cuda")``.

Why this and not the alternatives:

- ``torch.set_default_device`` to a device that cannot mix (``meta``) also moves the tensors that
  torch itself makes (optimizer step counters, module init), so it fails in torch, not in fedpipe,
  and the failure comes where the tensor is *used*, not where it was made;
- ``FakeTensorMode`` models CUDA tensors without a GPU but has no values: a federated run branches
  on values (``.item()``, ``tolist()``, numpy), so whole runs cannot go through it;
- the mode sees the exact calling frame of each factory, so it names fedpipe's line and only
  fedpipe's, and the run's values (hence the bit-identity check) are untouched.

What it cannot catch (on a machine with one device, everything real is on the CPU):

- a tensor made with an explicit but wrong device (``device="cpu"`` where the run's device was
  meant); the lint (tests/test_device_lint.py) makes every such choice visible in the code;
- check 2 only fires with two real devices, i.e. on a GPU machine;
- ``torch.from_numpy`` (no device argument: always the CPU, moved with ``.to`` by the caller),
  ``torch.Generator(...)`` (a class, not a torch function; the lint covers it), modules built
  inside fedpipe (``nn.Linear`` makes its parameters in torch's frames), and tensors made by
  fedpipe code that runs outside the mode (other processes: the Ray executor).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

import fedpipe

PACKAGE = str(Path(fedpipe.__file__).resolve().parent)

FACTORIES = {
    torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.range, torch.rand,
    torch.randn, torch.randint, torch.randperm, torch.tensor, torch.as_tensor, torch.eye,
    torch.linspace, torch.logspace, torch.normal, torch.empty_strided, torch.scalar_tensor,
    torch.tril_indices, torch.triu_indices, torch.asarray,
}


# ops that take tensors on two devices by design (data moved, or compared before a move)
TRANSFERS = {torch._has_compatible_shallow_copy_type, torch.Tensor.copy_, torch.Tensor.to,
             torch.Tensor.data.__set__, torch.Tensor.set_}


class DeviceFault(AssertionError):
    """A tensor made without a device, or an op mixing devices, in fedpipe's code."""


def _fedpipe_site(frame) -> str | None:
    """``file:line`` of the first frame from the caller outwards, if it is fedpipe's own code."""
    if frame is None:
        return None
    name = frame.f_code.co_filename
    if name.startswith(PACKAGE):
        return f"{Path(name).relative_to(Path(PACKAGE).parent.parent)}:{frame.f_lineno}"
    return None


def _tensors(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, list | tuple):
            yield from (t for t in a if isinstance(t, torch.Tensor))


class DeviceHarness(TorchFunctionMode):
    """Use as a context manager around a run; see the module docstring. ``sites`` records each
    fedpipe line that made a tensor with a device. ``strict=False`` collects the faults in
    ``faults`` instead of raising (to survey code that has many)."""

    def __init__(self, strict: bool = True) -> None:
        super().__init__()
        self.strict = strict
        self.sites: set[str] = set()
        self.faults: set[str] = set()

    def fault(self, message: str) -> None:
        if self.strict:
            raise DeviceFault(message)
        self.faults.add(message)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES:
            site = _fedpipe_site(sys._getframe(1))
            if site is not None:
                if kwargs.get("device") is None:
                    self.fault(f"{site}: torch.{func.__name__}(...) without device= "
                               "(on a GPU run this tensor would be on the CPU)")
                else:
                    self.sites.add(site)
        elif func not in TRANSFERS:
            devices = {t.device for t in _tensors(args, kwargs)
                       if t.dim() > 0 or t.device.type != "cpu"}
            if len(devices) > 1:
                frame, site = sys._getframe(1), None
                while frame is not None and site is None:
                    site, frame = _fedpipe_site(frame), frame.f_back
                if site is not None:  # torch's or the test's own code: not fedpipe's to answer for
                    self.fault(f"{site}: {getattr(func, '__name__', func)} mixes devices "
                               f"{sorted(map(str, devices))}")
        return func(*args, **kwargs)
