"""Client feature skew, applied by the data layer when a client's batches are drawn.

- ``rotation``: the client's images are rotated by its angle (degrees, torchvision's ``rotate``,
  bilinear, zero fill); deterministic.
- ``noise``: Gaussian noise of the client's std is added to each batch, drawn from the generator the
  caller passes (a seeded stream), then clipped to [0, 1].
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from fedpipe.data.datasets import Split
from fedpipe.data.partition import Partition
from fedpipe.device import generator_on


def apply_feature_skew(x: torch.Tensor, kind: str, value: float,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """Apply one client's skew to a batch ``x`` (N, C, H, W)."""
    if kind == "none" or value == 0:
        return x
    if kind == "rotation":
        if value % 90 == 0:  # exact for right angles
            return torch.rot90(x, k=int(value // 90) % 4, dims=(-2, -1))
        from torchvision.transforms.v2 import InterpolationMode  # on first use (a second of imports)
        from torchvision.transforms.v2 import functional as TF

        return TF.rotate(x, angle=float(value), interpolation=InterpolationMode.BILINEAR)
    if kind == "noise":
        if generator is None:
            raise ValueError("noise skew needs a seeded generator")
        g = generator_on(generator, x.device)  # ``generator`` itself on the CPU
        noise = torch.randn(x.shape, generator=g, dtype=x.dtype, device=x.device)
        return (x + value * noise).clamp_(0.0, 1.0)
    raise ValueError(f"unknown feature skew {kind!r}")


def epoch_order(n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """One epoch's shuffle of ``n`` samples, drawn from ``generator`` itself (on its own device:
    the CPU for the project's streams) and moved to ``device`` once per epoch. On the CPU this is
    the draw it always was. On CUDA it replaces a ``randperm`` on the derived device generator: a
    CUDA ``randperm`` launches a radix sort and cost about 85 us of host time per call on an H200,
    the largest item of a batched round of 100 clients (docs/device.md, "On a GPU"), where the host
    draw of a client's few hundred indices costs a few us plus one small copy."""
    return torch.randperm(n, generator=generator, device=generator.device).to(device)


@dataclass(frozen=True)
class ClientData:
    """One client's local data (train or local test) as in-memory tensors plus its feature skew."""

    x: torch.Tensor
    y: torch.Tensor
    skew: tuple[str, float] = ("none", 0.0)

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def batch(self, idx: torch.Tensor, generator: torch.Generator | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        return apply_feature_skew(self.x[idx], *self.skew, generator=generator), self.y[idx]

    def to(self, device: str | torch.device) -> ClientData:
        """This client's data on ``device`` (itself when it is there already)."""
        x, y = self.x.to(device), self.y.to(device)
        return self if x is self.x and y is self.y else ClientData(x, y, self.skew)

    def batches(self, batch_size: int, generator: torch.Generator, shuffle: bool = True
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch of batches (shuffled with ``generator``; last batch may be smaller): the order
        is :func:`epoch_order`, on the data's device, so batches never cross devices."""
        n = len(self)
        device = self.x.device
        if shuffle:
            order = epoch_order(n, generator, device)
        else:
            order = torch.arange(n, device=device)
        for start in range(0, n, batch_size):
            yield self.batch(order[start:start + batch_size], generator)


def client_data(split: Split, partition: Partition, client_id: int, which: str = "train"
                ) -> ClientData:
    """Client ``client_id``'s train data or local test data (``which='test'``)."""
    idx = {"train": partition.train, "test": partition.test}[which][client_id]
    t = torch.from_numpy(idx)
    return ClientData(split.x[t], split.y[t], partition.feature_skew(client_id))
