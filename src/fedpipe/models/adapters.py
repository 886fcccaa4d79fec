"""Residual adapters on a frozen ResNet backbone (PerAda, Xie et al., CVPR 2024; §4, footnote 1;
docs/papers/perada.md), and a small ResNet for CPU smoke studies.

PerAda follows Pillutla et al. 2022 (FL_partial_personalization), who take Rebuffi et al.'s (2017)
residual adapter in series form:

    AdapterBlock(x) = x + Conv1x1( Dropout_p( BN(x) ) )      (no conv bias, p = 0.3)

with the 1x1 conv initialised N(0, 1e-4^2), so an adapter starts at (almost) the identity. In every
torchvision ``BasicBlock`` one adapter follows conv1 and one follows conv2, each before its BN:

    out = relu(bn1(adapter1(conv1(x)))); out = bn2(adapter2(conv2(out))); out = relu(out + shortcut(x))

No adapter sits on the stem conv or the downsample convs. What PerAda trains, regularises, uploads
and distils (its "adapter"; the official code's ``update_layer_name``) is :func:`adapter_keys`:

1. every adapter module (1x1 conv + its BN);
2. the BN layers called ``bn1`` / ``bn2``: the stem BN and each block's two BNs (not the downsample
   BNs);
3. the prediction head.

Everything else is frozen (``requires_grad=False``). On torchvision's ImageNet ResNet-18 with 10
classes this is 1,413,258 trainable parameters, 12.64% of the 11,181,642 of the model without adapters
(the paper's Table 1; ``tests/test_perada.py`` counts them). The project's ``resnet18`` is
CIFAR-style by default (3x3 stem, no max-pool, 11,173,962 parameters); ``stem="imagenet"`` gives the
paper's backbone. Adapters do not change with the stem, so the trainable count is the same.

Buffers of the adapter set (BN running statistics) travel with it, as in the official code.

``ResNet8`` (deviation, for the CPU smoke study only): a three-stage ResNet of one torchvision
``BasicBlock`` per stage (widths 8/16/32 by default) on which the same adapters sit; its trainable
share is much larger than ResNet-18's (the report shows the measured one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fedpipe.models.classifiers import Classifier, Shape

ADAPTER_DROPOUT = 0.3
ADAPTER_INIT_STD = 1e-4


class AdapterBlock(nn.Module):
    """``x + conv1x1(dropout(bn(x)))``: Rebuffi et al.'s residual adapter, series form (PerAda's code)."""

    def __init__(self, planes: int, dropout: float = ADAPTER_DROPOUT,
                 init_std: float = ADAPTER_INIT_STD) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(planes)
        self.dropout = nn.Dropout(dropout)
        self.conv = nn.Conv2d(planes, planes, kernel_size=1, bias=False)
        nn.init.normal_(self.conv.weight, std=init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(self.dropout(self.bn(x)))


def _basic_block() -> type[nn.Module]:
    """torchvision's ``BasicBlock``, imported on first use: importing torchvision costs about
    1.8 s, which every classification stage would pay at start-up otherwise."""
    from torchvision.models.resnet import BasicBlock

    return BasicBlock


def _adapted_block_class() -> type[nn.Module]:
    BasicBlock = _basic_block()

    class AdaptedBasicBlock(BasicBlock):
        """torchvision's ``BasicBlock`` with ``adapter1`` after conv1 and ``adapter2`` after conv2.
        Instances are made by :func:`add_adapters` (it re-classes existing blocks, so the
        backbone's parameter names stay as they are)."""

        adapter1: AdapterBlock
        adapter2: AdapterBlock

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.adapter1(self.conv1(x))))
            out = self.bn2(self.adapter2(self.conv2(out)))
            return self.relu(out + identity)

    # picklable by name, as if defined at module level
    AdaptedBasicBlock.__module__, AdaptedBasicBlock.__qualname__ = __name__, "AdaptedBasicBlock"
    return AdaptedBasicBlock


def __getattr__(name: str) -> Any:
    """``AdaptedBasicBlock`` is made on first access (it subclasses torchvision's ``BasicBlock``)."""
    if name == "AdaptedBasicBlock":
        if name not in globals():
            globals()[name] = _adapted_block_class()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def add_adapters(model: nn.Module, dropout: float = ADAPTER_DROPOUT,
                 init_std: float = ADAPTER_INIT_STD) -> nn.Module:
    """Put two adapters in every ``BasicBlock`` of ``model`` (in place; returns ``model``).
    Adapter weights draw from torch's global RNG (call it inside the caller's seeded fork, as
    ``make_model`` does). A model without BasicBlocks is an error."""
    BasicBlock, AdaptedBasicBlock = _basic_block(), __getattr__("AdaptedBasicBlock")
    blocks = [m for m in model.modules() if isinstance(m, BasicBlock)]
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no torchvision BasicBlock to put adapters in "
                         "(adapters need a ResNet: resnet18 or resnet8)")
    for b in blocks:
        if isinstance(b, AdaptedBasicBlock):
            continue
        b.__class__ = AdaptedBasicBlock
        b.adapter1 = AdapterBlock(b.conv1.out_channels, dropout, init_std)
        b.adapter2 = AdapterBlock(b.conv2.out_channels, dropout, init_std)
    return model


def adapter_modules(model: nn.Module) -> list[str]:
    """Names of the modules of PerAda's adapter set: adapters, the BNs named bn1/bn2 (stem and
    blocks; not the downsample BNs) and the head (``head`` of a Classifier, ``fc`` of a torchvision
    ResNet)."""
    out = []
    for name, m in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(m, AdapterBlock) or (isinstance(m, nn.BatchNorm2d) and leaf in ("bn1", "bn2")):
            out.append(name)
        elif name in ("head", "fc") and isinstance(m, nn.Linear):
            out.append(name)
    return out


def adapter_keys(model: nn.Module) -> set[str]:
    """State-dict names of the adapter set (parameters and BN buffers)."""
    prefixes = adapter_modules(model)
    return {k for k in model.state_dict() for p in prefixes if k.startswith(p + ".")}


def freeze_backbone(model: nn.Module) -> nn.Module:
    """``requires_grad`` on the adapter set's parameters only (in place; returns ``model``)."""
    keys = adapter_keys(model)
    for n, p in model.named_parameters():
        p.requires_grad_(n in keys)
    return model


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def load_backbone(model: nn.Module, weights: dict[str, torch.Tensor],
                  skip: Sequence[str] = ("head.", "fc.")) -> list[str]:
    """Copy the backbone entries of ``weights`` into ``model`` (in place): every entry whose name
    the model has with the same shape, except the head (PerAda's head is freshly initialised,
    as in its official code) and the adapters (a backbone file has none). BN running statistics are copied too
    (a deliberate choice, docs/papers/perada.md: the official code copies parameters only; buffers are
    re-estimated in train mode either way). torchvision names (``layer1.0.conv1.weight``) map to a
    Classifier's (``body.layer1.0.conv1.weight``). Returns the names copied; a file that matches no
    backbone entry is an error."""
    own = model.state_dict()
    copied = []
    with torch.no_grad():
        for k, v in weights.items():
            if k.startswith(tuple(skip)) or ".adapter" in k:
                continue
            if k not in own and f"body.{k}" in own:  # a torchvision state dict in a Classifier
                k = f"body.{k}"
            if k not in own:
                continue
            if own[k].shape != v.shape:
                raise ValueError(f"backbone entry {k} has shape {tuple(v.shape)}; "
                                 f"the model's is {tuple(own[k].shape)}")
            own[k].copy_(v)
            copied.append(k)
    if not copied:
        raise ValueError("the backbone weights share no entry with the model "
                         f"(first names: {sorted(weights)[:3]})")
    return copied


class _ResNetBody(nn.Module):
    """Stem conv3x3 -> BN -> ReLU, then one ``BasicBlock`` per width (stride 2 after the first),
    global average pool, flatten. Names follow torchvision (conv1, bn1, layer1, ...)."""

    def __init__(self, channels: int, widths: Sequence[int]) -> None:
        super().__init__()
        BasicBlock = _basic_block()
        self.conv1 = nn.Conv2d(channels, widths[0], 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        layers, inplanes = [], widths[0]
        for i, w in enumerate(widths):
            stride = 1 if i == 0 else 2
            down = None
            if stride != 1 or inplanes != w:
                down = nn.Sequential(nn.Conv2d(inplanes, w, 1, stride, bias=False),
                                     nn.BatchNorm2d(w))
            layers.append(nn.Sequential(BasicBlock(inplanes, w, stride, down)))
            inplanes = w
        for i, layer in enumerate(layers, start=1):
            self.add_module(f"layer{i}", layer)
        self.num_layers = len(layers)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        for m in self.modules():  # torchvision's ResNet initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        for i in range(1, self.num_layers + 1):
            x = getattr(self, f"layer{i}")(x)
        return self.pool(x)


class ResNet8(Classifier):
    """A small ResNet for CPU smoke studies (not from a paper): 3x3 stem, one torchvision
    ``BasicBlock`` per stage of ``widths`` (default 8/16/32, strides 1/2/2), average pool, linear
    head. PerAda's adapters fit it unchanged (a CPU stand-in of ours, docs/papers/perada.md)."""

    def __init__(self, in_shape: Shape, num_classes: int, *, widths: Sequence[int] = (8, 16, 32),
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 head_bias: bool = True) -> None:
        if len(widths) < 1 or min(widths) < 1:
            raise ValueError(f"resnet8 widths must be a non-empty list of positive ints, got {widths}")
        super().__init__(in_shape, num_classes, _ResNetBody(in_shape[0], list(widths)), mean, std,
                         head_bias)
