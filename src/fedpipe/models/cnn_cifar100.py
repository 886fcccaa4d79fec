"""Equitable-FL's CIFAR-100 CNN (§5.1): "5 convolutional layers, each followed by ReLU, and 3
max-pooling layers", then two fully connected layers, the first down to 512 and the last 512 -> C.

The paper gives neither channel widths, kernel sizes nor pool positions; inferred here
(docs/papers/equitable_fl.md): 3x3 convs with padding 1, widths 64, 128 | pool | 256, 256 | pool |
512 | pool, so a 3x32x32 input gives 512x4x4 = 8192 -> Linear(8192, 512) -> ReLU (the penultimate features,
``feature_dim = 512``, Equitable-FL's activation vectors) -> head Linear(512, C).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from fedpipe.models.classifiers import Classifier, Shape, _feature_dim


class CNNCifar100(Classifier):
    def __init__(self, in_shape: Shape, num_classes: int, *,
                 widths: tuple[int, int, int, int, int] = (64, 128, 256, 256, 512),
                 hidden: int = 512, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, head_bias: bool = True) -> None:
        w = list(widths)
        if len(w) != 5:
            raise ValueError(f"cnn_cifar100 needs 5 conv widths, got {widths}")

        def conv(i: int, o: int) -> list[nn.Module]:
            return [nn.Conv2d(i, o, 3, padding=1), nn.ReLU()]

        convs = nn.Sequential(
            *conv(in_shape[0], w[0]), *conv(w[0], w[1]), nn.MaxPool2d(2),
            *conv(w[1], w[2]), *conv(w[2], w[3]), nn.MaxPool2d(2),
            *conv(w[3], w[4]), nn.MaxPool2d(2), nn.Flatten())
        flat = _feature_dim(convs, in_shape)
        body = nn.Sequential(convs, nn.Linear(flat, hidden), nn.ReLU())
        super().__init__(in_shape, num_classes, body, mean, std, head_bias)
