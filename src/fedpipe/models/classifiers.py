"""Classifier networks of the five papers, as plain `nn.Module`s.

Every model is a `Classifier`: ``forward(x) = head(features(x))`` with

- ``normalize``: ``(x - mean) / std`` with per-channel constants from the dataset metadata (a
  no-op by default). They are non-persistent buffers: constants of the build, not weights, so they
  stay out of ``state_dict()`` and out of every aggregation, control variate or checkpoint;
- ``body``: maps normalised images ``(N, C, H, W)`` to penultimate features ``(N, feature_dim)``
  (after the last non-linearity: Equitable-FL's activation vectors, FedNH's normalised features);
- ``head``: the final ``nn.Linear(feature_dim, num_classes)`` (FedNH's prototypes; the part kept
  private by FedPer/FedRep, frozen by FedBABU).

Parameter names are therefore ``body.*`` and ``head.*`` for every model, so body/head splits go by
name prefix. Inputs are float images in [0, 1]; every model accepts any (C, H, W) from 1x8x8
(sklearn digits) through 1x28x28 (MNIST) to 3x32x32 (CIFAR): flatten sizes come from a dummy
forward at construction (eval mode, ``no_grad``: no norm statistics move and no RNG is drawn).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from torch import nn

Shape = tuple[int, int, int]


class Normalize(nn.Module):
    """``(x - mean) / std`` per channel; ``mean``/``std`` of length 1 broadcast to every channel."""

    def __init__(self, channels: int, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None) -> None:
        super().__init__()
        self.identity = mean is None and std is None
        m = torch.as_tensor(mean if mean is not None else (0.0,), dtype=torch.float32, device="cpu").flatten()
        s = torch.as_tensor(std if std is not None else (1.0,), dtype=torch.float32, device="cpu").flatten()
        for name, t in (("mean", m), ("std", s)):
            if t.numel() not in (1, channels):
                raise ValueError(f"{name} has {t.numel()} values; expected 1 or {channels}")
        if (s <= 0).any():
            raise ValueError(f"std must be positive, got {s.tolist()}")
        self.register_buffer("mean", m.expand(channels).reshape(1, channels, 1, 1).clone(),
                             persistent=False)
        self.register_buffer("std", s.expand(channels).reshape(1, channels, 1, 1).clone(),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.identity else (x - self.mean) / self.std


def _feature_dim(body: nn.Module, in_shape: Shape) -> int:
    """Width of ``body``'s flat output on one dummy image (eval mode: BatchNorm stats stay put)."""
    was_training = body.training
    body.eval()
    try:
        with torch.no_grad():
            out = body(torch.zeros(1, *in_shape, device="cpu"))  # a model is built on the CPU
    except (RuntimeError, ValueError) as e:  # e.g. a kernel larger than the feature map
        raise ValueError(f"input shape {tuple(in_shape)} is too small for this model: {e}") from e
    finally:
        body.train(was_training)
    if out.dim() != 2 or out.shape[1] == 0:
        raise ValueError(f"input shape {tuple(in_shape)} gives body output {tuple(out.shape)}")
    return int(out.shape[1])


class Classifier(nn.Module):
    """``forward(x) = head(features(x))``, ``features(x) = body(normalize(x))``."""

    def __init__(self, in_shape: Shape, num_classes: int, body: nn.Module,
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 head_bias: bool = True) -> None:
        super().__init__()
        if len(in_shape) != 3:
            raise ValueError(f"in_shape must be (C, H, W), got {in_shape}")
        self.in_shape = tuple(int(s) for s in in_shape)
        self.num_classes = int(num_classes)
        self.normalize = Normalize(self.in_shape[0], mean, std)
        self.body = body
        self.feature_dim = _feature_dim(body, self.in_shape)
        self.head = nn.Linear(self.feature_dim, self.num_classes, bias=head_bias)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate features ``(N, feature_dim)``, after the last non-linearity."""
        return self.body(self.normalize(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _lenet_padding(in_shape: Shape, padding: int | None) -> int:
    """Two unpadded 5x5 convs with 2x2 pools need H, W >= 16; smaller inputs get padding 2."""
    if padding is not None:
        return padding
    return 0 if min(in_shape[1:]) >= 16 else 2


class MLP(Classifier):
    """Equitable-FL's MNIST "simple" model: Flatten -> Linear(in, 200) -> ReLU -> Linear(200, 200)
    -> ReLU -> Linear(200, C). ``feature_dim = hidden`` (200).

    Paper: Equitable-FL (§5.1, MNIST). ``hidden`` is the paper's 200.
    """

    def __init__(self, in_shape: Shape, num_classes: int, *, hidden: int = 200,
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 head_bias: bool = True) -> None:
        c, h, w = in_shape
        body = nn.Sequential(
            nn.Flatten(),
            nn.Linear(c * h * w, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
        )
        super().__init__(in_shape, num_classes, body, mean, std, head_bias)


class LeNet(Classifier):
    """Equitable-FL's CIFAR-10 CNN, the PyTorch-tutorial LeNet-5: Conv(C, 6, 5) -> ReLU -> MaxPool2
    -> Conv(6, 16, 5) -> ReLU -> MaxPool2 -> FC 120 -> ReLU -> FC 84 -> ReLU -> FC C.
    ``feature_dim = 84``.

    Paper: Equitable-FL (§5.1, CIFAR-10); it gives no FC widths: 120/84 are the PyTorch tutorial's
    (docs/papers/equitable_fl.md).
    Inferred here: inputs smaller than 16x16 (sklearn digits, 8x8) get ``padding=2`` in both convs
    ('same' convs, 8 -> 4 -> 2); ``padding=None`` picks 0 for >= 16x16 (CIFAR: the tutorial net,
    400 -> 120) and 2 below. MNIST 28x28 keeps padding 0 (flatten 16*4*4 = 256).
    """

    def __init__(self, in_shape: Shape, num_classes: int, *, padding: int | None = None,
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 head_bias: bool = True) -> None:
        p = _lenet_padding(in_shape, padding)
        convs = nn.Sequential(
            nn.Conv2d(in_shape[0], 6, 5, padding=p), nn.ReLU(), nn.MaxPool2d(2, 2),
            nn.Conv2d(6, 16, 5, padding=p), nn.ReLU(), nn.MaxPool2d(2, 2),
            nn.Flatten(),
        )
        flat = _feature_dim(convs, in_shape)
        body = nn.Sequential(convs, nn.Linear(flat, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU())
        super().__init__(in_shape, num_classes, body, mean, std, head_bias)


class CNNFedNH(Classifier):
    """FedNH's CIFAR CNN (``Conv2Cifar``, App. A.2 Listing 1; the same CNN as FedROD):
    Conv(C, 64, 5) -> ReLU -> MaxPool2 -> Conv(64, 64, 5) -> ReLU -> MaxPool2 -> Linear(1600, 384)
    -> ReLU -> Linear(384, 192) -> ReLU -> head Linear(192, C, bias=False). ``feature_dim = 192``.

    Paper: FedNH (Dai et al., AAAI 2023; App. A.2, Listing 1). ``channels=64``, ``hidden=(384, 192)`` and
    ``head_bias=False`` are the listing's values. Inferred here (the paper only uses 3x32x32): the
    same padding rule as `LeNet` for inputs below 16x16, and the flatten size from the input shape.
    """

    def __init__(self, in_shape: Shape, num_classes: int, *, channels: int = 64,
                 hidden: tuple[int, int] = (384, 192), padding: int | None = None,
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 head_bias: bool = False) -> None:
        p = _lenet_padding(in_shape, padding)
        convs = nn.Sequential(
            nn.Conv2d(in_shape[0], channels, 5, padding=p), nn.ReLU(), nn.MaxPool2d(2, 2),
            nn.Conv2d(channels, channels, 5, padding=p), nn.ReLU(), nn.MaxPool2d(2, 2),
            nn.Flatten(),
        )
        flat = _feature_dim(convs, in_shape)
        h1, h2 = hidden
        body = nn.Sequential(convs, nn.Linear(flat, h1), nn.ReLU(), nn.Linear(h1, h2), nn.ReLU())
        super().__init__(in_shape, num_classes, body, mean, std, head_bias)


class ConvNet(Classifier):
    """FedPTR's ConvNet, the dataset-distillation ConvNet of MTT (Cazenavette et al. 2022):
    ``depth`` blocks of Conv3x3(width) -> InstanceNorm -> ReLU -> AvgPool2x2, then Flatten and a
    linear head. ``feature_dim = width * h * w`` after ``depth`` halvings (2048 on 3x32x32 and,
    with MTT's padding 3, on 1x28x28; 128 on 1x8x8).

    Paper: FedPTR (§5.1: MTT's ConvNet), defaults ``width=128``, ``depth=3`` from MTT's
    ``get_default_convnet_setting``. InstanceNorm is MTT's ``GroupNorm(width, width, affine=True)``
    (buffer-free, which trajectory matching and FedAvg both prefer). As in MTT's ``_make_layers``,
    the first conv of a 1-channel input uses padding 3 (28x28 -> 32x32); ``first_padding``
    overrides it.
    """

    def __init__(self, in_shape: Shape, num_classes: int, *, width: int = 128, depth: int = 3,
                 first_padding: int | None = None, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, head_bias: bool = True) -> None:
        if first_padding is None:
            first_padding = 3 if in_shape[0] == 1 else 1
        layers: list[nn.Module] = []
        in_ch = in_shape[0]
        for d in range(depth):
            layers += [
                nn.Conv2d(in_ch, width, 3, padding=first_padding if d == 0 else 1),
                nn.GroupNorm(width, width, affine=True),
                nn.ReLU(),
                nn.AvgPool2d(2, 2),
            ]
            in_ch = width
        body = nn.Sequential(*layers, nn.Flatten())
        super().__init__(in_shape, num_classes, body, mean, std, head_bias)


class ResNet18(Classifier):
    """CIFAR-style ResNet-18 from torchvision's ``resnet18``: 3x3 stride-1 stem conv, no max-pool,
    stages [2, 2, 2, 2] of BasicBlocks (64/128/256/512), adaptive average pool;
    ``feature_dim = 512``.

    Papers: Equitable-FL (§5.1, variant unstated; CIFAR-style inferred, docs/papers/equitable_fl.md)
    and FedNH (App. A.2: GroupNorm with 2 groups following FedDF; CIFAR-style as in its official
    code, docs/papers/fednh.md). ``norm="batch"`` (torchvision's default) or ``"group"``
    (``GroupNorm(groups, c)``, ``groups=2`` as FedNH/FedDF; the common FL choice, no running
    statistics). The stem takes ``C`` input channels, so 1-channel images work.
    ``stem="imagenet"`` keeps torchvision's ImageNet stem instead (7x7 stride-2 conv and 3x3 stride-2
    max-pool): PerAda's backbone (Sec. 7; its official code feeds it 32x32 CIFAR inputs too,
    docs/papers/perada.md).
    """

    def __init__(self, in_shape: Shape, num_classes: int, *, norm: str = "batch", groups: int = 2,
                 stem: str = "cifar", mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 head_bias: bool = True) -> None:
        norms = {"batch": nn.BatchNorm2d, "group": partial(nn.GroupNorm, groups)}
        if norm not in norms:
            raise ValueError(f"resnet18 norm={norm!r} is not allowed; allowed: {sorted(norms)}")
        if stem not in ("cifar", "imagenet"):
            raise ValueError(f"resnet18 stem={stem!r} is not allowed; allowed: ['cifar', 'imagenet']")
        import torchvision  # on first use: importing torchvision costs about 1.8 s per stage

        net = torchvision.models.resnet18(weights=None, norm_layer=norms[norm])
        if stem == "cifar" or in_shape[0] != 3:
            k, s, p = (3, 1, 1) if stem == "cifar" else (7, 2, 3)
            net.conv1 = nn.Conv2d(in_shape[0], 64, kernel_size=k, stride=s, padding=p, bias=False)
            # re-initialise the new stem the way torchvision initialises every ResNet conv
            nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
        if stem == "cifar":
            net.maxpool = nn.Identity()
        net.fc = nn.Identity()  # the head lives in Classifier.head
        super().__init__(in_shape, num_classes, net, mean, std, head_bias)
