"""Stand-in data (``dataset.stand_in: true``): generated images of a torchvision dataset's shape,
classes and official sizes, read from nowhere; and damaged torchvision files as one clear line."""

import json
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from fedpipe.config import ConfigError, dataset_config
from fedpipe.config.dataset import (
    STAND_IN_NOTE,
    is_stand_in,
    public_dataset_config,
)
from fedpipe.data import DatasetNotFoundError, load_dataset

OFFICIAL = {  # name -> (C, H, W), classes, train size, test size
    "mnist": ((1, 28, 28), 10, 60000, 10000),
    "fashion_mnist": ((1, 28, 28), 10, 60000, 10000),
    "cifar10": ((3, 32, 32), 10, 50000, 10000),
    "cifar100": ((3, 32, 32), 100, 50000, 10000),
}


def _stand_in(name: str, root: str = "data/raw", **extra):
    return dataset_config({"name": name, "root": root, "stand_in": True, **extra})


@pytest.mark.parametrize("name", sorted(OFFICIAL))
def test_stand_in_has_the_official_shapes_sizes_and_classes(tmp_path, name):
    """Every torchvision dataset's stand-in: its (C, H, W), class count, official train / test
    sizes, balanced classes, float32 in [0, 1]; read from a folder that does not exist (and is
    not created), so nothing comes from disk."""
    shape, classes, n_train, n_test = OFFICIAL[name]
    missing = tmp_path / "nowhere"
    cfg = _stand_in(name, str(missing))
    assert (cfg.in_shape(), cfg.num_classes(), cfg.train_size(), cfg.test_size()) == \
        (shape, classes, n_train, n_test)
    ds = load_dataset(cfg)
    assert not missing.exists()
    assert ds.train.x.shape == (n_train, *shape) and ds.test.x.shape == (n_test, *shape)
    assert ds.train.x.dtype == torch.float32 and ds.train.y.dtype == torch.int64
    assert 0.0 <= float(ds.train.x.min()) and float(ds.train.x.max()) <= 1.0
    assert torch.bincount(ds.train.y, minlength=classes).tolist() == [n_train // classes] * classes
    assert torch.bincount(ds.test.y, minlength=classes).tolist() == [n_test // classes] * classes
    assert ds.meta.name == name and ds.meta.stand_in and ds.meta.num_classes == classes
    assert ds.meta.shape == shape and len(ds.meta.mean) == len(ds.meta.std) == shape[0]
    assert ds.holdout is None


def test_stand_in_is_deterministic_and_its_own_per_dataset():
    """Same config, same tensors bit for bit; another dataset of the same shape draws others; the
    labels come shuffled (like the real files), not sorted by class."""
    a, b = load_dataset(_stand_in("mnist")), load_dataset(_stand_in("mnist"))
    for s, t in ((a.train, b.train), (a.test, b.test)):
        assert torch.equal(s.x, t.x) and torch.equal(s.y, t.y)
    assert a.meta == b.meta
    other = load_dataset(_stand_in("fashion_mnist"))
    assert not torch.equal(other.train.x[:100], a.train.x[:100])
    assert not torch.equal(a.train.y, torch.sort(a.train.y).values)


def test_stand_in_classes_are_learnable():
    """Class means of the training split classify the test split far above chance (10%), so
    accuracy > chance still checks the plumbing."""
    ds = load_dataset(_stand_in("mnist"))
    flat = ds.train.x.flatten(1)
    means = torch.stack([flat[ds.train.y == c].mean(0) for c in range(10)])
    pred = torch.cdist(ds.test.x.flatten(1), means).argmin(1)
    assert float((pred == ds.test.y).float().mean()) > 0.9
    # and the classes overlap pixel-wise (noise): no image equals its class prototype
    assert float((flat - means[ds.train.y]).abs().mean()) > 0.1


def test_stand_in_metadata_stats_are_the_data_stats():
    """The normalisation constants in the metadata are the generated training images' own."""
    from fedpipe.data.datasets import _channel_stats

    ds = load_dataset(_stand_in("fashion_mnist"))
    assert (ds.meta.mean, ds.meta.std) == _channel_stats(ds.train.x)


@pytest.mark.parametrize("data,key", [
    ({"name": "mnist", "stand_in": "yes"}, "dataset.stand_in"),
    ({"name": "cifar10", "stand_in": 1}, "dataset.stand_in"),
    ({"name": "cifar10", "stand_in": True, "download": True}, "dataset.download"),
    ({"name": "digits", "stand_in": True}, "dataset.stand_in"),
    ({"name": "mnist5k", "stand_in": True}, "dataset.stand_in"),
    ({"name": "synthetic", "stand_in": True}, "dataset.stand_in"),
])
def test_bad_stand_in_value_is_a_config_error(data, key):
    with pytest.raises(ConfigError) as info:
        dataset_config(data)
    assert info.value.key == key and "\n" not in str(info.value)


def test_every_dataset_accepts_stand_in_false():
    for name in ("digits", "mnist5k", "synthetic", *OFFICIAL):
        assert dataset_config({"name": name, "stand_in": False}).stand_in is False


def test_is_stand_in_reads_params_sections_and_configs(repo_root):
    """The helper the report, claims and tracking call: whole params, the dataset section, or a
    built config; the committed params.yaml (digits) is real data."""
    import yaml

    params = yaml.safe_load((repo_root / "params.yaml").read_text())
    assert is_stand_in(params) is False
    section = {"name": "cifar10", "stand_in": True}
    assert is_stand_in({"seed": 0, "dataset": section}) is True
    assert is_stand_in(section) is True and is_stand_in(dataset_config(section)) is True
    assert is_stand_in({"name": "cifar10"}) is False
    with pytest.raises(ConfigError, match="dataset.stand_in"):
        is_stand_in({"dataset": {"name": "cifar10", "stand_in": "no"}})
    assert "never accuracy or FID" in STAND_IN_NOTE


def test_public_dataset_follows_the_study_dataset():
    """PerAda's public server data (another torchvision set's training images) is a stand-in
    exactly when the study's dataset is, read from the same root."""
    cfg = dataset_config({"name": "cifar10", "root": "/x", "stand_in": True,
                          "public_dataset": "cifar100"})
    pub = public_dataset_config(cfg)
    assert (pub.name, pub.root, pub.stand_in, pub.download) == ("cifar100", "/x", True, False)
    real = public_dataset_config(dataset_config({"name": "cifar10", "public_dataset": "cifar100"}))
    assert real.stand_in is False and real.root == "data/raw"
    digits = public_dataset_config(dataset_config({"name": "digits", "public_dataset": "mnist"}))
    assert (digits.name, digits.root, digits.stand_in) == ("mnist", "data/raw", False)
    with pytest.raises(ConfigError, match="dataset.public_dataset"):
        public_dataset_config(dataset_config({"name": "cifar10"}))


COST_SCRIPT = textwrap.dedent("""
    import json, resource, sys, time
    import torch
    from fedpipe.config import dataset_config
    from fedpipe.data import load_dataset

    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20

    cfg = dataset_config({"name": sys.argv[1], "root": "/nonexistent", "stand_in": True})
    base = rss_mib()
    t = time.perf_counter()
    ds = load_dataset(cfg)
    seconds = time.perf_counter() - t
    # VmHWM, this process image's own peak: ru_maxrss survives exec, so a child of a big pytest
    # worker would report the worker's size
    with open("/proc/self/status") as f:
        peak = next(int(x.split()[1]) for x in f if x.startswith("VmHWM:")) / 1024  # KiB
    out = sum(s.x.nbytes + s.y.nbytes for s in (ds.train, ds.test)) / 2**20
    print(json.dumps({"seconds": round(seconds, 2), "peak_mib": round(peak - base),
                      "output_mib": round(out), "threads": torch.get_num_threads()}))
""")


@pytest.mark.parametrize("name", ["cifar10"])
def test_stand_in_load_cost(name, record_property, capsys):
    """Time and peak memory of loading a stand-in, in a fresh process (recorded, time not
    asserted): peak memory stays near the output itself (generated in place, a chunk at a time)."""
    run = subprocess.run([sys.executable, "-c", COST_SCRIPT, name], capture_output=True,
                         text=True, timeout=300, check=True)
    cost = json.loads(run.stdout.strip().splitlines()[-1])
    record_property(f"stand_in_{name}", cost)
    with capsys.disabled():
        print(f"\nstand-in {name}: {cost}")
    # measured: the output + 30 to 250 MiB; a second float32 copy of the training images (as the
    # real reader's channel permute makes) would add 600 MiB
    assert cost["peak_mib"] < 1.5 * cost["output_mib"] + 100


# -- damaged torchvision files: one DatasetNotFoundError line, never AssertionError / ValueError

def _idx_images(n: int, rows: int = 28) -> bytes:
    pixels = np.random.default_rng(n).integers(0, 256, (n, rows, 28), dtype=np.uint8)
    return struct.pack(">IIII", 0x0803, n, rows, 28) + pixels.tobytes()


def _idx_labels(n: int) -> bytes:
    return struct.pack(">II", 0x0801, n) + (np.arange(n) % 10).astype(np.uint8).tobytes()


def _write_mnist(raw, train_images: bytes, train_labels: bytes | None = None) -> None:
    """The four files torchvision reads under <root>/MNIST/raw; the test files are intact."""
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "train-images-idx3-ubyte").write_bytes(train_images)
    (raw / "train-labels-idx1-ubyte").write_bytes(train_labels if train_labels is not None
                                                  else _idx_labels(6))
    (raw / "t10k-images-idx3-ubyte").write_bytes(_idx_images(3))
    (raw / "t10k-labels-idx1-ubyte").write_bytes(_idx_labels(3))


@pytest.mark.parametrize("damage", ["empty", "truncated_pixels", "truncated_header",
                                    "empty_labels", "fewer_labels", "wrong_magic"])
def test_damaged_mnist_file_is_one_clear_line(tmp_path, damage):
    raw = tmp_path / "MNIST" / "raw"
    good = _idx_images(6)
    images, labels = {
        "empty": (b"", None),
        "truncated_pixels": (good[:-100], None),
        "truncated_header": (good[:10], None),
        "empty_labels": (good, b""),
        "fewer_labels": (good, _idx_labels(4)),
        "wrong_magic": (struct.pack(">I", 0x0899) + good[4:], None),
    }[damage]
    _write_mnist(raw, images, labels)
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset(dataset_config({"name": "mnist", "root": str(tmp_path)}))
    msg = str(info.value)
    assert "\n" not in msg and str(raw) in msg and "corrupted" in msg


def test_intact_small_mnist_files_still_load(tmp_path):
    """The same writer with nothing damaged loads (the damage, not the writer, fails above)."""
    _write_mnist(tmp_path / "MNIST" / "raw", _idx_images(6))
    ds = load_dataset(dataset_config({"name": "mnist", "root": str(tmp_path)}))
    assert ds.train.x.shape == (6, 1, 28, 28) and ds.test.y.tolist() == [0, 1, 2]
    assert ds.meta.stand_in is False
