"""Corrupted copies of a test set (distribution-shift test splits, CIFAR-10-C style).

PerAda (Sec. 7, Evaluation Metrics; App. A.1) reports accuracy on CIFAR-10-C (Hendrycks &
Dietterich, "Benchmarking Neural Network Robustness to Common Corruptions and Perturbations", ICLR
2019). That data set cannot be downloaded here, so fedpipe regenerates corrupted copies of the
official test split offline, deterministically, and caches them as safetensors files.

Six of the paper's corruptions are implemented, with the severity tables of the authors' CIFAR-10-C
generator (``make_cifar_c.py`` in the ``hendrycks/robustness`` repository, ``ImageNet-C/create_c/``);
severity ``s`` in 1..5 picks entry ``s - 1``:

=================  =====================================  ==========================================
name               CIFAR-10-C table                       what it does here
=================  =====================================  ==========================================
gaussian_noise     std c = .04 .06 .08 .09 .10            ``x + c * N(0, 1)``
gaussian_blur      sigma c = .4 .6 .7 .8 1 (pixels)       Gaussian filter, radius ``int(4 c + .5)``
brightness         c = .05 .1 .15 .2 .3                   HSV value ``V + c`` (clipped), H, S kept
contrast           c = .75 .5 .4 .3 .15                   ``(x - m) c + m``, m the per-channel mean
pixelate           c = .95 .9 .85 .75 .65                 box-resize to ``int(H c)``, back to ``H``
jpeg               quality c = 80 65 58 50 40             JPEG encode/decode with PIL, as the source
=================  =====================================  ==========================================

Decisions where the source is silent or cannot apply as written:

- Images are float tensors in [0, 1] of shape (N, C, H, W) with C = 1 or 3; every output is clipped to
  [0, 1] and keeps the input's shape, dtype and device. CIFAR-10-C stored uint8 images; only ``jpeg``
  rounds to 8 bits here (it must), the others stay in float.
- **Small images.** The tables were made for 32x32. ``pixelate``'s factor is relative to the image side,
  so it is applied as is (sizes ``int(H c)``; on 28x28 MNIST 26, 25, 23, 21, 18). On 8x8 ``digits`` the
  sizes are 7, 7, 6, 6, 5: severities 1/2 and 3/4 coincide, and on the digits test set severity 5 changes
  the images slightly less than 3/4 do (mean absolute change 0.114 against 0.121), so pixelate's
  severities mean little on 8x8 images.
- ``gaussian_blur``'s sigma is in pixels of the image as given and is *not* rescaled: on 28x28 the
  rescaled sigma would differ by 12%, and on 8x8 ``digits`` (whose pixels already average 4x4 blocks of
  a 32x32 bitmap) the rescaled sigmas, 0.1-0.25 px, would leave the images unchanged. The blur's radius
  is capped at ``min(H, W) - 1``.
- **Border.** The blur pads by reflection (torchvision); the source used scikit-image's ``nearest``.
- **Grayscale brightness.** For one channel, V is the pixel value, so brightness is ``clip(x + c)``.
  For RGB the HSV round trip with H and S fixed scales each pixel's RGB by ``V' / V``, which is what is
  computed (torchvision has no public RGB<->HSV conversion); a black pixel (V = 0, hence S = 0) becomes
  grey ``c``, as in scikit-image.
- **Contrast** uses the source's per-image, per-channel mean (torchvision's ``adjust_contrast`` blends
  towards the mean of the grayscale image instead, which differs for RGB).
- **Noise streams.** ``gaussian_noise`` is the only random corruption. Its draws come from
  ``torch_generator(seed, "corruption/<name>", severity)``: the corruption's name is part of the
  purpose, so adding or reordering corruptions never changes an existing stream.

Caching: :func:`corrupted_split` writes ``<cache_dir>/<name>_s<severity>_seed<seed>.safetensors`` (the
corrupted images only; labels are the split's own). Its metadata records the name, severity, seed, the
md5 of the source images and a format version; a file whose metadata does not match is rebuilt. Use one
``cache_dir`` per dataset: two datasets sharing one would rebuild each other's files.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from fedpipe.config.core import ConfigError, check
from fedpipe.data.datasets import Dataset, Split
from fedpipe.io import load_tensors, read_metadata, save_tensors
from fedpipe.rng import torch_generator

log = logging.getLogger(__name__)

SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)

# Severity tables of make_cifar_c.py (Hendrycks & Dietterich 2019, CIFAR-10-C), entry s-1 for severity s.
GAUSSIAN_NOISE_STD: tuple[float, ...] = (0.04, 0.06, 0.08, 0.09, 0.10)
GAUSSIAN_BLUR_SIGMA: tuple[float, ...] = (0.4, 0.6, 0.7, 0.8, 1.0)
BRIGHTNESS_SHIFT: tuple[float, ...] = (0.05, 0.1, 0.15, 0.2, 0.3)
CONTRAST_FACTOR: tuple[float, ...] = (0.75, 0.5, 0.4, 0.3, 0.15)
PIXELATE_FACTOR: tuple[float, ...] = (0.95, 0.9, 0.85, 0.75, 0.65)
JPEG_QUALITY: tuple[int, ...] = (80, 65, 58, 50, 40)

CACHE_FORMAT = 1  # bump when a corruption's output changes, so that old cache files are rebuilt
_META_KEY = "corruption"

Corruption = Callable[[torch.Tensor, int, "torch.Generator | None"], torch.Tensor]


# --------------------------------------------------------------------------------------------------
# The corruptions: (x, severity, generator) -> corrupted x, x float (N, C, H, W) in [0, 1].


def gaussian_noise(x: torch.Tensor, severity: int, generator: torch.Generator | None) -> torch.Tensor:
    """Additive Gaussian noise, std ``GAUSSIAN_NOISE_STD[severity - 1]`` (CIFAR-10-C ``gaussian_noise``)."""
    if generator is None:
        raise ValueError("gaussian_noise draws noise: pass a generator (fedpipe.rng.torch_generator)")
    c = GAUSSIAN_NOISE_STD[severity - 1]
    noise = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=generator.device)
    return (x + c * noise.to(x.device)).clamp(0.0, 1.0)


def gaussian_blur(x: torch.Tensor, severity: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Gaussian blur, sigma ``GAUSSIAN_BLUR_SIGMA[severity - 1]`` pixels (CIFAR-10-C ``gaussian_blur``,
    one of its four extra corruptions). Radius ``int(4 sigma + 0.5)`` as scipy's ``truncate=4``,
    capped at ``min(H, W) - 1`` for reflection padding."""
    sigma = GAUSSIAN_BLUR_SIGMA[severity - 1]
    radius = max(0, min(int(4.0 * sigma + 0.5), min(x.shape[-2:]) - 1))
    if radius == 0:
        return x.clone()
    import torchvision.transforms.v2.functional as TF  # on first use (1.8 s of imports)

    out = TF.gaussian_blur(x, kernel_size=[2 * radius + 1] * 2, sigma=[sigma, sigma])
    return out.clamp(0.0, 1.0)


def brightness(x: torch.Tensor, severity: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """HSV value ``V + c``, clipped to 1, with ``c = BRIGHTNESS_SHIFT[severity - 1]`` (CIFAR-10-C
    ``brightness``). Hue and saturation fixed means RGB scales by ``V' / V`` (see the module doc)."""
    c = BRIGHTNESS_SHIFT[severity - 1]
    v = x.amax(dim=1, keepdim=True)
    v_new = (v + c).clamp(max=1.0)
    scaled = x * (v_new / v.clamp_min(torch.finfo(x.dtype).tiny))
    return torch.where(v > 0, scaled, v_new.expand_as(x)).clamp(0.0, 1.0)


def contrast(x: torch.Tensor, severity: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``(x - m) c + m`` with m the per-image, per-channel mean and ``c = CONTRAST_FACTOR[severity - 1]``
    (CIFAR-10-C ``contrast``)."""
    c = CONTRAST_FACTOR[severity - 1]
    m = x.mean(dim=(-2, -1), keepdim=True)
    return ((x - m) * c + m).clamp(0.0, 1.0)


def _box_resize_matrix(size_in: int, size_out: int) -> np.ndarray:
    """The (size_out, size_in) matrix of PIL's BOX resize along one axis.

    PIL's resampling is linear and separable, so resizing the rows of an identity image gives its
    coefficients exactly; the images are then resized with two matrix products instead of a PIL call
    per image and channel.
    """
    eye = Image.fromarray(np.eye(size_in, dtype=np.float32), mode="F")  # row j = basis vector e_j
    resized = np.asarray(eye.resize((size_out, size_in), Image.Resampling.BOX), dtype=np.float64)
    return resized.T


def _pixelate_matrix(size: int, factor: float) -> np.ndarray:
    """Down to ``int(size * factor)`` and back up to ``size``, both by BOX, as one (size, size) matrix."""
    small = max(1, int(size * factor))
    return _box_resize_matrix(small, size) @ _box_resize_matrix(size, small)


def pixelate(x: torch.Tensor, severity: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """BOX-resize to ``int(H c), int(W c)`` and back (PIL), ``c = PIXELATE_FACTOR[severity - 1]``
    (CIFAR-10-C ``pixelate``, which hard-coded 32 for H and W)."""
    c = PIXELATE_FACTOR[severity - 1]
    h, w = x.shape[-2:]
    mh = torch.as_tensor(_pixelate_matrix(h, c), dtype=x.dtype, device=x.device)
    mw = torch.as_tensor(_pixelate_matrix(w, c), dtype=x.dtype, device=x.device)
    return (mh @ x @ mw.T).clamp(0.0, 1.0)


def _jpeg_round_trip(image: np.ndarray, quality: int) -> np.ndarray:
    """One uint8 image (H, W) or (H, W, 3) through PIL's JPEG encoder and decoder."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
    buffer.seek(0)
    with Image.open(buffer) as decoded:
        return np.asarray(decoded)


def jpeg(x: torch.Tensor, severity: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """JPEG compression at quality ``JPEG_QUALITY[severity - 1]`` with PIL, as CIFAR-10-C's
    ``jpeg_compression`` (8-bit round trip; PIL's default 4:2:0 chroma subsampling for RGB)."""
    if x.shape[0] == 0:
        return x.clone()
    quality = JPEG_QUALITY[severity - 1]
    as_uint8 = (x.detach().to("cpu", torch.float32) * 255.0).round().clamp(0, 255).to(torch.uint8)
    hwc = as_uint8.permute(0, 2, 3, 1).numpy()  # PIL's layout; one channel -> mode "L"
    images = hwc[..., 0] if hwc.shape[-1] == 1 else hwc
    out = np.stack([_jpeg_round_trip(image, quality) for image in images]).reshape(hwc.shape)
    out_t = torch.from_numpy(out).permute(0, 3, 1, 2)
    return (out_t.to(device=x.device, dtype=x.dtype) / 255.0).clamp(0.0, 1.0).contiguous()


CORRUPTIONS: dict[str, Corruption] = {
    "gaussian_noise": gaussian_noise,
    "gaussian_blur": gaussian_blur,
    "brightness": brightness,
    "contrast": contrast,
    "pixelate": pixelate,
    "jpeg": jpeg,
}


# --------------------------------------------------------------------------------------------------
# Validation and the entry point.


def check_corruption(name: str, severity: int, key: str = "corruption") -> None:
    """Raise ``ConfigError`` naming ``<key>.name`` or ``<key>.severity`` unless both are valid."""
    if not isinstance(name, str) or name not in CORRUPTIONS:
        raise ConfigError(f"{key}.name", name, "one of " + ", ".join(sorted(CORRUPTIONS)))
    is_int = isinstance(severity, (int, np.integer)) and not isinstance(severity, bool)
    if not is_int or severity not in SEVERITIES:
        raise ConfigError(f"{key}.severity", severity, "an integer in 1..5")


def check_corruption_names(names: Sequence[str], severities: Sequence[int], key: str = "study"
                           ) -> None:
    """A study's ``<key>.corruptions``, names of :data:`CORRUPTIONS`, and ``<key>.severities``, a
    non-empty subset of :data:`SEVERITIES` (checked only when corruptions are asked for); raise
    ``ConfigError`` naming the key otherwise."""
    if not names:
        return
    for c in names:
        check(c in CORRUPTIONS, f"{key}.corruptions", c, "one of " + ", ".join(CORRUPTIONS))
    check(len(severities) >= 1 and set(severities) <= set(SEVERITIES),
          f"{key}.severities", severities, f"a non-empty subset of {list(SEVERITIES)}")


def _check_images(x: torch.Tensor) -> None:
    if x.ndim != 4 or x.shape[1] not in (1, 3) or not x.is_floating_point():
        raise ValueError(f"corruptions take float images (N, C, H, W) with C = 1 or 3, got "
                         f"{tuple(x.shape)} {x.dtype}")


def corrupt(x: torch.Tensor, name: str, severity: int,
            generator: torch.Generator | None = None) -> torch.Tensor:
    """Corruption ``name`` at ``severity`` (1..5) of images ``x`` (float (N, C, H, W) in [0, 1]).

    ``generator`` feeds the random corruptions (``gaussian_noise``) and is ignored by the others.
    """
    check_corruption(name, severity)
    _check_images(x)
    return CORRUPTIONS[name](x, int(severity), generator)


def noise_generator(seed: int, name: str, severity: int) -> torch.Generator:
    """The stream of corruption ``name`` at ``severity``: ``(seed, "corruption/<name>", severity)``."""
    return torch_generator(seed, f"corruption/{name}", severity)


# --------------------------------------------------------------------------------------------------
# Cached corrupted test splits.


def images_md5(x: torch.Tensor) -> str:
    """MD5 of a tensor's dtype, shape and bytes (the identity of a cache's source images)."""
    h = hashlib.md5(f"{x.dtype}{tuple(x.shape)}".encode())
    h.update(x.detach().to("cpu").contiguous().numpy().tobytes())
    return h.hexdigest()


def cache_path(cache_dir: str | Path, name: str, severity: int, seed: int) -> Path:
    return Path(cache_dir) / f"{name}_s{severity}_seed{seed}.safetensors"


def _expected_metadata(name: str, severity: int, seed: int, source: torch.Tensor) -> dict:
    return {"name": name, "severity": int(severity), "seed": int(seed),
            "source_md5": images_md5(source), "format": CACHE_FORMAT}


def _read_cache(path: Path, expected: dict, like: torch.Tensor) -> torch.Tensor | None:
    """The cached images if ``path`` holds exactly what ``expected`` describes, else None."""
    if not path.is_file():
        return None
    try:
        meta = read_metadata(path, _META_KEY)
        if meta != expected:
            log.info("corruption cache %s is stale (%s != %s): rebuilding", path, meta, expected)
            return None
        x = load_tensors(path)["x"]
    except Exception as e:  # an unreadable or truncated file is rebuilt, never trusted
        log.warning("corruption cache %s unreadable (%s): rebuilding", path, e)
        return None
    if x.shape != like.shape or x.dtype != like.dtype:
        return None
    return x


def corrupted_split(split: Split, name: str, severity: int, seed: int,
                    cache_dir: str | Path | None) -> Split:
    """The corrupted copy of ``split`` (labels unchanged), read from ``cache_dir`` when a valid cache
    file exists, else computed and written there atomically (``cache_dir=None``: no cache)."""
    check_corruption(name, severity)
    _check_images(split.x)
    expected = _expected_metadata(name, severity, seed, split.x)
    path = None if cache_dir is None else cache_path(cache_dir, name, severity, seed)
    if path is not None and (x := _read_cache(path, expected, split.x)) is not None:
        log.debug("corruption cache hit %s", path)
        return Split(x.to(split.x.device), split.y)
    x = CORRUPTIONS[name](split.x, int(severity), noise_generator(seed, name, severity))
    if path is not None:
        save_tensors(path, {"x": x}, metadata={_META_KEY: json.dumps(expected, sort_keys=True)})
        log.info("wrote corrupted split %s (%d images)", path, len(split))
    return Split(x, split.y)


def corrupted_test_sets(ds: Dataset, names: Iterable[str], severities: Sequence[int] = SEVERITIES,
                        seed: int = 0, cache_dir: str | Path | None = None
                        ) -> dict[tuple[str, int], Split]:
    """Corrupted copies of ``ds.test`` for every (name, severity) pair, keyed by that pair.

    Every name and severity is checked before any image is corrupted.
    """
    names = list(names)
    severities = list(severities)
    for name in names:
        for severity in severities:
            check_corruption(name, severity)
    return {(name, int(s)): corrupted_split(ds.test, name, int(s), seed, cache_dir)
            for name in names for s in severities}
