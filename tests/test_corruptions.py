"""Corrupted test splits (fedpipe.data.corruptions): properties, hand-computed values, determinism,
the cache and validation."""

from __future__ import annotations

import colorsys

import numpy as np
import pytest
import torch
from PIL import Image

from fedpipe.config import ConfigError
from fedpipe.data import Dataset, DatasetMeta, Split
from fedpipe.data import corruptions as C
from fedpipe.io import read_metadata

NAMES = list(C.CORRUPTIONS)


def _images(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed))


def _gen(seed: int = 1) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _mad(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().mean())


# --- properties ------------------------------------------------------------------------------------

def test_registry_has_the_six_corruptions():
    assert set(NAMES) == {"gaussian_noise", "gaussian_blur", "brightness", "contrast", "pixelate", "jpeg"}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(4, 3, 32, 32), (4, 1, 28, 28), (4, 1, 8, 8)])
@pytest.mark.parametrize("severity", C.SEVERITIES)
def test_keeps_shape_dtype_and_range(name, shape, severity):
    x = _images(shape)
    y = C.corrupt(x, name, severity, _gen())
    assert y.shape == x.shape and y.dtype == x.dtype
    assert float(y.min()) >= 0.0 and float(y.max()) <= 1.0
    assert not torch.equal(y, x)


@pytest.mark.parametrize("name", NAMES)
def test_keeps_float64(name):
    x = _images((2, 3, 16, 16)).double()
    assert C.corrupt(x, name, 3, _gen()).dtype == torch.float64


@pytest.mark.parametrize("name", NAMES)
def test_severity_increases_distance_strictly_on_32x32(name):
    x = _images((8, 3, 32, 32))
    d = [_mad(C.corrupt(x, name, s, _gen()), x) for s in C.SEVERITIES]
    assert all(a < b for a, b in zip(d, d[1:], strict=False)), d


@pytest.mark.parametrize("name", NAMES)
def test_severity_increases_distance_on_8x8(name):
    # On 8x8 pixelate's sizes are 7, 7, 6, 6, 5, so only non-decreasing there (module docstring).
    x = _images((16, 1, 8, 8))
    d = [_mad(C.corrupt(x, name, s, _gen()), x) for s in C.SEVERITIES]
    assert all(a <= b for a, b in zip(d, d[1:], strict=False)), d
    assert d[0] < d[-1]


def test_does_not_modify_its_input():
    x = _images((2, 3, 8, 8))
    before = x.clone()
    for name in NAMES:
        C.corrupt(x, name, 5, _gen())
    assert torch.equal(x, before)


# --- hand-computed values --------------------------------------------------------------------------

@pytest.mark.parametrize("severity", C.SEVERITIES)
def test_brightness_on_a_constant_grey_image(severity):
    x = torch.full((1, 1, 4, 4), 0.5)
    c = C.BRIGHTNESS_SHIFT[severity - 1]
    torch.testing.assert_close(C.corrupt(x, "brightness", severity), torch.full_like(x, 0.5 + c))


def test_brightness_clips_and_lifts_black():
    x = torch.tensor([0.0, 0.95, 0.4]).view(1, 1, 1, 3)
    torch.testing.assert_close(C.corrupt(x, "brightness", 5), torch.tensor([0.3, 1.0, 0.7]).view(1, 1, 1, 3))


def test_brightness_rgb_matches_an_hsv_round_trip():
    x = _images((1, 3, 4, 4), seed=3)
    x[0, :, 0, 0] = 0.0  # a black pixel
    x[0, :, 0, 1] = torch.tensor([0.9, 0.95, 0.2])  # V clips at 1
    y = C.corrupt(x, "brightness", 4)
    c = C.BRIGHTNESS_SHIFT[3]
    for i in range(4):
        for j in range(4):
            h, s, v = colorsys.rgb_to_hsv(*x[0, :, i, j].tolist())
            expected = colorsys.hsv_to_rgb(h, s, min(v + c, 1.0))
            np.testing.assert_allclose(y[0, :, i, j].numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("severity", C.SEVERITIES)
def test_contrast_values(severity):
    c = C.CONTRAST_FACTOR[severity - 1]
    constant = torch.full((1, 3, 4, 4), 0.3)
    torch.testing.assert_close(C.corrupt(constant, "contrast", severity), constant)
    # half 0, half 1: mean 0.5, so the values become 0.5 -/+ 0.5 c
    x = torch.zeros(1, 1, 2, 2)
    x[..., 1, :] = 1.0
    expected = torch.tensor([[0.5 - 0.5 * c] * 2, [0.5 + 0.5 * c] * 2]).view(1, 1, 2, 2)
    torch.testing.assert_close(C.corrupt(x, "contrast", severity), expected)


def test_contrast_uses_each_channels_own_mean():
    x = torch.zeros(1, 3, 1, 2)
    x[0, 0] = torch.tensor([0.0, 1.0])  # mean 0.5
    x[0, 1] = torch.tensor([0.2, 0.4])  # mean 0.3
    y = C.corrupt(x, "contrast", 2)  # c = 0.5
    torch.testing.assert_close(y[0, 0, 0], torch.tensor([0.25, 0.75]))
    torch.testing.assert_close(y[0, 1, 0], torch.tensor([0.25, 0.35]))


def test_pixelate_4x4_to_2x2_block_means():
    # severity 5: int(4 * 0.65) = 2, so each 2x2 block is replaced by its mean
    x = torch.arange(16, dtype=torch.float32).view(1, 1, 4, 4) / 16
    blocks = torch.tensor([[2.5, 4.5], [10.5, 12.5]]) / 16
    expected = blocks.repeat_interleave(2, 0).repeat_interleave(2, 1).view(1, 1, 4, 4)
    torch.testing.assert_close(C.corrupt(x, "pixelate", 5), expected)


@pytest.mark.parametrize("size", [8, 28, 32])
@pytest.mark.parametrize("severity", C.SEVERITIES)
def test_pixelate_matches_pil_box_resizes(size, severity):
    x = _images((1, 1, size, size), seed=5)
    small = int(size * C.PIXELATE_FACTOR[severity - 1])
    img = Image.fromarray(x[0, 0].numpy(), mode="F")
    ref = img.resize((small, small), Image.Resampling.BOX).resize((size, size), Image.Resampling.BOX)
    np.testing.assert_allclose(C.corrupt(x, "pixelate", severity)[0, 0].numpy(), np.asarray(ref), atol=1e-5)


@pytest.mark.parametrize("severity", C.SEVERITIES)
def test_gaussian_noise_statistics_on_mid_grey(severity):
    x = torch.full((8, 1, 64, 64), 0.5)
    y = C.corrupt(x, "gaussian_noise", severity, _gen(severity))
    c = C.GAUSSIAN_NOISE_STD[severity - 1]
    noise = y - x
    assert abs(float(noise.mean())) < 3 * c / 64 / np.sqrt(8)
    assert float(noise.std()) == pytest.approx(c, rel=0.02)


def test_gaussian_blur_keeps_a_constant_image_and_is_a_filter():
    x = torch.full((1, 3, 8, 8), 0.7)
    torch.testing.assert_close(C.corrupt(x, "gaussian_blur", 5), x)
    impulse = torch.zeros(1, 1, 17, 17)  # radius 4: no reflection reaches the impulse at the centre
    impulse[..., 8, 8] = 1.0
    y = C.corrupt(impulse, "gaussian_blur", 5)[0, 0]
    assert float(y.sum()) == pytest.approx(1.0, abs=1e-5)
    assert float(y[8, 8]) == float(y.max())
    assert float(y[8, 13]) == 0.0 and float(y[8, 12]) > 0.0  # support = radius int(4 sigma + .5) = 4
    torch.testing.assert_close(y, y.T)
    torch.testing.assert_close(y, y.flip(0))


def test_jpeg_is_close_on_a_smooth_image_and_8bit():
    ramp = torch.linspace(0, 1, 32).view(1, 1, 1, 32).expand(2, 3, 32, 32).contiguous()
    y = C.corrupt(ramp, "jpeg", 1)
    assert _mad(y, ramp) < 0.02
    torch.testing.assert_close(y * 255, (y * 255).round())


# --- determinism -----------------------------------------------------------------------------------

def test_same_seed_same_bits_different_seed_different_noise():
    split = Split(_images((4, 3, 8, 8)), torch.arange(4))
    a = C.corrupted_split(split, "gaussian_noise", 3, seed=7, cache_dir=None).x
    b = C.corrupted_split(split, "gaussian_noise", 3, seed=7, cache_dir=None).x
    c = C.corrupted_split(split, "gaussian_noise", 3, seed=8, cache_dir=None).x
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_streams_differ_across_severities():
    g3 = C.noise_generator(0, "gaussian_noise", 3)
    g4 = C.noise_generator(0, "gaussian_noise", 4)
    assert not torch.equal(torch.randn(8, generator=g3), torch.randn(8, generator=g4))


@pytest.mark.parametrize("name", [n for n in NAMES if n != "gaussian_noise"])
def test_deterministic_corruptions_ignore_the_seed(name):
    split = Split(_images((2, 1, 8, 8)), torch.arange(2))
    a = C.corrupted_split(split, name, 2, seed=1, cache_dir=None).x
    b = C.corrupted_split(split, name, 2, seed=2, cache_dir=None).x
    assert torch.equal(a, b)


def test_gaussian_noise_needs_a_generator():
    with pytest.raises(ValueError, match="generator"):
        C.corrupt(_images((1, 1, 4, 4)), "gaussian_noise", 1)


# --- cache -----------------------------------------------------------------------------------------

def _boom(*args, **kwargs):
    raise AssertionError("recomputed despite a valid cache")


def test_cache_hit_returns_identical_tensors_without_recomputing(tmp_path, monkeypatch):
    split = Split(_images((5, 3, 8, 8)), torch.arange(5))
    first = C.corrupted_split(split, "gaussian_noise", 2, seed=3, cache_dir=tmp_path)
    path = C.cache_path(tmp_path, "gaussian_noise", 2, 3)
    meta = read_metadata(path, "corruption")
    assert meta == {"name": "gaussian_noise", "severity": 2, "seed": 3,
                    "source_md5": C.images_md5(split.x), "format": C.CACHE_FORMAT}
    monkeypatch.setitem(C.CORRUPTIONS, "gaussian_noise", _boom)
    second = C.corrupted_split(split, "gaussian_noise", 2, seed=3, cache_dir=tmp_path)
    assert torch.equal(first.x, second.x)
    assert torch.equal(second.y, split.y)


def test_changed_source_invalidates_the_cache(tmp_path, monkeypatch):
    split = Split(_images((5, 1, 8, 8)), torch.arange(5))
    C.corrupted_split(split, "contrast", 4, seed=0, cache_dir=tmp_path)
    changed = Split(split.x.clone(), split.y)
    changed.x[0, 0, 0, 0] = 1.0 - changed.x[0, 0, 0, 0]
    calls = []
    original = C.CORRUPTIONS["contrast"]

    def counting(*args):
        calls.append(1)
        return original(*args)

    monkeypatch.setitem(C.CORRUPTIONS, "contrast", counting)
    rebuilt = C.corrupted_split(changed, "contrast", 4, seed=0, cache_dir=tmp_path)
    assert calls == [1]
    assert torch.equal(rebuilt.x, C.corrupt(changed.x, "contrast", 4))
    meta = read_metadata(C.cache_path(tmp_path, "contrast", 4, 0), "corruption")
    assert meta["source_md5"] == C.images_md5(changed.x)


def test_unreadable_cache_file_is_rebuilt(tmp_path):
    split = Split(_images((3, 1, 8, 8)), torch.arange(3))
    path = C.cache_path(tmp_path, "jpeg", 1, 0)
    path.write_bytes(b"not a safetensors file")
    out = C.corrupted_split(split, "jpeg", 1, seed=0, cache_dir=tmp_path)
    assert torch.equal(out.x, C.corrupt(split.x, "jpeg", 1))
    assert read_metadata(path, "corruption")["name"] == "jpeg"


def test_corrupted_test_sets_uses_the_test_split(tmp_path):
    meta = DatasetMeta("toy", 2, (1, 8, 8), (0.5,), (0.25,))
    ds = Dataset(Split(_images((6, 1, 8, 8), 1), torch.zeros(6, dtype=torch.int64)),
                 Split(_images((4, 1, 8, 8), 2), torch.tensor([0, 1, 0, 1])), meta)
    sets = C.corrupted_test_sets(ds, ["brightness", "gaussian_noise"], [1, 5], seed=0, cache_dir=tmp_path)
    assert set(sets) == {("brightness", 1), ("brightness", 5), ("gaussian_noise", 1), ("gaussian_noise", 5)}
    for (name, s), split in sets.items():
        assert torch.equal(split.y, ds.test.y)
        assert torch.equal(split.x, C.corrupted_split(ds.test, name, s, 0, None).x)
    assert len(list(tmp_path.glob("*.safetensors"))) == 4


# --- validation ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, severity, key", [
    ("fog", 1, "corruption.name"),
    ("gaussian_noise", 0, "corruption.severity"),
    ("gaussian_noise", 6, "corruption.severity"),
    ("gaussian_noise", 2.0, "corruption.severity"),
    ("gaussian_noise", True, "corruption.severity"),
])
def test_bad_name_or_severity_raises_config_error(name, severity, key):
    with pytest.raises(ConfigError) as e:
        C.corrupt(_images((1, 1, 4, 4)), name, severity, _gen())
    assert e.value.key == key
    assert "\n" not in str(e.value) and key in str(e.value)


def test_corrupted_test_sets_validates_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setitem(C.CORRUPTIONS, "contrast", _boom)
    meta = DatasetMeta("toy", 2, (1, 4, 4), (0.5,), (0.25,))
    split = Split(_images((2, 1, 4, 4)), torch.tensor([0, 1]))
    with pytest.raises(ConfigError, match="corruption.severity"):
        C.corrupted_test_sets(Dataset(split, split, meta), ["contrast"], [1, 7], 0, tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("names, severities, key, value", [
    (["jpeg", "fog"], [1], "study.corruptions", "fog"),
    (["jpeg"], [], "study.severities", []),
    (["jpeg"], [1, 6], "study.severities", [1, 6]),
])
def test_study_corruption_names_are_checked_against_the_registry(names, severities, key, value):
    with pytest.raises(ConfigError) as e:
        C.check_corruption_names(names, severities, "study")
    assert (e.value.key, e.value.value) == (key, value)
    C.check_corruption_names([], [7], "study")  # severities matter only when corruptions are asked
    C.check_corruption_names(NAMES, list(C.SEVERITIES), "study")


def test_rejects_non_image_tensors():
    with pytest.raises(ValueError, match="C = 1 or 3"):
        C.corrupt(torch.rand(2, 4, 8, 8), "contrast", 1)
