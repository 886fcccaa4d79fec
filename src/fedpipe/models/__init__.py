"""Model registry: ``build_model(name, in_shape, num_classes, **kwargs)``.

Classifiers live in `fedpipe.models.classifiers`; each is a `Classifier` with ``features(x)``,
``head`` (the final ``nn.Linear``), ``feature_dim``, and ``forward(x) = head(features(x))``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from fedpipe.models.adapters import ResNet8
from fedpipe.models.classifiers import (
    MLP,
    Classifier,
    CNNFedNH,
    ConvNet,
    LeNet,
    Normalize,
    ResNet18,
)
from fedpipe.models.cnn_cifar100 import CNNCifar100

MODELS: dict[str, Callable[..., Classifier]] = {
    "mlp": MLP,  # Equitable-FL, MNIST "simple" model
    "lenet": LeNet,  # Equitable-FL, CIFAR-10 CNN (PyTorch-tutorial LeNet-5)
    "cnn_fednh": CNNFedNH,  # FedNH / FedROD CIFAR CNN (Conv2Cifar)
    "convnet": ConvNet,  # FedPTR, MTT ConvNet-128 depth 3
    "resnet18": ResNet18,  # CIFAR-style ResNet-18 (torchvision); stem=imagenet for PerAda
    "cnn_cifar100": CNNCifar100,  # Equitable-FL, CIFAR-100 5-conv CNN
    "resnet8": ResNet8,  # small ResNet (one BasicBlock per stage) for CPU smoke studies (PerAda)
}


def build_model(name: str, in_shape: tuple[int, int, int], num_classes: int, **kwargs) -> nn.Module:
    """Build the registered model ``name`` for images of shape ``in_shape = (C, H, W)``.

    ``kwargs`` are the model's options (e.g. ``hidden``, ``width``, ``norm``, ``mean``, ``std``);
    an unknown name or option raises ``ValueError`` with one line listing what is allowed.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; allowed: {', '.join(sorted(MODELS))}")
    builder = MODELS[name]
    options = [p for p in inspect.signature(builder).parameters
               if p not in ("self", "in_shape", "num_classes")]
    unknown = sorted(set(kwargs) - set(options))
    if unknown:
        raise ValueError(f"model {name!r} got unknown option(s) {unknown}; "
                         f"allowed: {', '.join(options)}")
    return builder(tuple(in_shape), int(num_classes), **kwargs)


__all__ = [
    "MODELS",
    "UNET_PRESETS",
    "MLP",
    "CNNFedNH",
    "Classifier",
    "ConvNet",
    "LeNet",
    "NoisePredictor",
    "Normalize",
    "ResNet18",
    "ResNet8",
    "build_model",
    "build_unet",
]


def __getattr__(name: str) -> Any:
    """The UNet names (:mod:`fedpipe.models.unet`) load on first use: diffusers costs seconds of
    imports, which the classification stages never need."""
    if name in ("UNET_PRESETS", "NoisePredictor", "build_unet"):
        from fedpipe.models import unet

        return getattr(unet, name)
    raise AttributeError(f"module 'fedpipe.models' has no attribute {name!r}")
