"""Fréchet distance between the feature statistics of real and generated images (FID).

FID fits a Gaussian to the features of each image set and reports

    FID = ||mu_r - mu_g||^2 + tr(S_r + S_g - 2 (S_r S_g)^{1/2}),

so lower is better and 0 means identical first and second moments. The number depends on the
feature extractor as much as on the images, so an `FID` object carries a ``name`` (for example
``"classifier:lenet"`` or ``"inception-v3-2048"``) that is recorded next to every score and inside
every cached reference file; scores made with different extractors are never compared, and a
reference made by another extractor is refused.

Extractors:

- `ClassifierFeatures` (the default): the penultimate features of a `Classifier` trained on the real
  training set. This is the usual practice for MNIST-like data (8x8 digits, 28x28 MNIST), on which
  ImageNet Inception features say little, and it runs offline.
- `InceptionFeatures` (`inception_extractor`): the standard 2048-d Inception-v3 FID, through
  torchmetrics' own ``NoTrainInceptionV3``, loaded from a local weights file only (never downloaded).

The statistics (feature sum, sum of outer products, count) and the Fréchet distance, matrix square
root included, are computed by torchmetrics' ``FrechetInceptionDistance``; this module is glue: it
batches images, caches the real-set statistics once (`FID.reference`) and stores them as
safetensors (`save_reference` / `load_reference`).

Behaviours of torchmetrics worth knowing (checked against torchmetrics 1.9):

- a custom extractor receives the images unchanged (``normalize`` only picks the dtype of a dummy
  input, and no dummy forward runs when the extractor has ``num_features``);
- features are accumulated in float64, but ``compute()`` casts the FID back to the dtype the extractor
  returned, so both extractors here return float64 features (a float32 extractor would round every
  score to float32);
- the trace of the matrix square root is taken from the eigenvalues of ``S_r @ S_g`` (a general,
  non-symmetric eigendecomposition: on the CPU, tens of seconds for the 2048-d Inception features, a
  few milliseconds for a classifier's ~100); rounding leaves the FID of a set against itself at
  about 1e-12 of the feature variance, of either sign, rather than exactly 0;
- with ``normalize=True`` its Inception path truncates ``x * 255`` to uint8 without clamping;
  `InceptionFeatures` clamps to [0, 1] and rounds instead, as when the images are saved as PNG.
"""

from __future__ import annotations

import io
import json
import os
import pickle
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn
from torchmetrics.image.fid import FrechetInceptionDistance, NoTrainInceptionV3
from tqdm.auto import tqdm

from fedpipe.io import read_tensors, save_tensors
from fedpipe.models.classifiers import Classifier

DEFAULT_BATCH_SIZE = 256
META_KEY = "fedpipe.fid_reference"
REFERENCE_KEYS = ("real_features_sum", "real_features_cov_sum", "real_features_num_samples")
INCEPTION_WEIGHTS_FILE = "pt_inception-2015-12-05-6726825d.pth"

Reference = dict[str, torch.Tensor]


class ReferenceMismatchError(ValueError):
    """A cached reference was made by another feature extractor than the one scoring."""


class ClassifierFeatures(nn.Module):
    """Penultimate features ``classifier.features(x)`` of a trained `Classifier`, as float64.

    The classifier runs in eval mode (BatchNorm running statistics, no dropout); its own
    training flag is restored after each call, so wrapping a shared model changes nothing.
    """

    def __init__(self, classifier: Classifier) -> None:
        super().__init__()
        self.classifier = classifier
        self.num_features = int(classifier.feature_dim)  # torchmetrics then skips its dummy forward

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        expected = getattr(self.classifier, "in_shape", None)
        if expected is not None and tuple(images.shape[1:]) != tuple(expected):
            raise ValueError(f"images have shape (C, H, W) = {tuple(images.shape[1:])}; the FID "
                             f"classifier expects {tuple(expected)}")
        dtype = next(self.classifier.parameters()).dtype
        was_training = self.classifier.training
        self.classifier.eval()
        try:
            return self.classifier.features(images.to(dtype)).double()
        finally:
            self.classifier.train(was_training)


class InceptionFeatures(nn.Module):
    """The standard 2048-d FID Inception-v3 (torchmetrics' ``NoTrainInceptionV3``) for images in [0, 1].

    ``weights_path`` must be a local copy of the FID Inception weights converted from TensorFlow's
    2015-12-05 graph: pytorch-fid's ``pt_inception-2015-12-05-6726825d.pth`` (torch-fidelity serves
    the same state dict as ``weights-inception-2015-12-05-6726825d.pth``). It is read with
    ``torch.load(weights_only=True)`` first, so a file that is not a plain state dict is refused
    before torch-fidelity unpickles it. Grayscale images are repeated to 3 channels; images are
    clamped to [0, 1] and rounded to uint8, the input the network expects, then resized to 299x299
    (``antialias=True``: torchmetrics' default bilinear resize with antialiasing; ``False``: the
    TF1-compatible resize of the original FID code).
    """

    num_features = 2048

    def __init__(self, weights_path: str | os.PathLike, antialias: bool = True) -> None:
        super().__init__()
        path = Path(weights_path)
        if not path.is_file():
            raise FileNotFoundError(f"Inception FID weights not found at {path}: expected a local copy of "
                                    f"{INCEPTION_WEIGHTS_FILE} (the TF FID Inception-v3 state dict; "
                                    "fedpipe never downloads it)")
        try:  # refuse pickles that carry anything but tensors before torch-fidelity loads the file
            state = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise ValueError(f"{path} is not a plain Inception state dict (weights_only load failed: "
                             f"{str(e).splitlines()[0]})") from e
        buf = io.BytesIO()
        torch.save(state, buf)
        buf.seek(0)
        # torch-fidelity calls torch.load(..., weights_only=False) on what it is given: give it the
        # re-serialised, already vetted state dict rather than the path.
        self.net = NoTrainInceptionV3(name="inception-v3-compat", features_list=["2048"],
                                      feature_extractor_weights_path=buf,  # type: ignore[arg-type]
                                      antialias=antialias)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.shape[1] == 1:
            images = images.expand(-1, 3, -1, -1)
        elif images.shape[1] != 3:
            raise ValueError(f"Inception FID needs 1- or 3-channel images, got {images.shape[1]} channels")
        pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8)
        return self.net(pixels).double()


def inception_extractor(weights_path: str | os.PathLike, antialias: bool = True) -> InceptionFeatures:
    """The 2048-d Inception-v3 extractor from a local weights file (see `InceptionFeatures`)."""
    return InceptionFeatures(weights_path, antialias=antialias)


class FID:
    """FID with one feature extractor, recorded as ``name`` next to every number.

    ``extractor`` maps images (N, C, H, W) in [0, 1] to features (N, num_features) and has an int
    ``num_features``. With ``device``, the extractor is moved there (in place) and features are
    computed there; otherwise on the extractor's own device. Images may live anywhere: they are
    moved batch by batch.
    """

    def __init__(self, extractor: nn.Module, name: str, device: str | torch.device | None = None) -> None:
        num = getattr(extractor, "num_features", None)
        if not isinstance(num, int) or num < 1:
            raise TypeError(f"the FID extractor needs an int attribute num_features, got {num!r}")
        if not name:
            raise ValueError("an FID extractor needs a non-empty name")
        if device is not None:
            extractor.to(device)
        self.extractor = extractor
        self.name = name
        self.num_features = num
        self.device = torch.device(device) if device is not None else _module_device(extractor)

    def __repr__(self) -> str:
        return f"FID(name={self.name!r}, num_features={self.num_features}, device={self.device})"

    def reference(self, images: torch.Tensor, batch_size: int = DEFAULT_BATCH_SIZE) -> Reference:
        """Statistics of the real ``images`` as torchmetrics keeps them (on the CPU, float64 sums)."""
        metric = self._metric()
        self._update(metric, images, real=True, batch_size=batch_size, what="reference")
        return {k: getattr(metric, k).detach().cpu().clone() for k in REFERENCE_KEYS}

    def score(self, images: torch.Tensor, reference: Mapping[str, torch.Tensor] | str | os.PathLike,
              batch_size: int = DEFAULT_BATCH_SIZE) -> float:
        """FID of the generated ``images`` against a reference (statistics, or a reference file)."""
        if isinstance(reference, str | os.PathLike):
            reference = self.load_reference(reference)
        ref = check_reference(reference, self.num_features)
        metric = self._metric()
        for k in REFERENCE_KEYS:
            setattr(metric, k, ref[k].to(self.device))
        self._update(metric, images, real=False, batch_size=batch_size, what="generated")
        return float(metric.compute())

    def save_reference(self, path: str | os.PathLike, reference: Mapping[str, torch.Tensor]) -> None:
        save_reference(path, reference, self.name)

    def load_reference(self, path: str | os.PathLike) -> Reference:
        """A saved reference, refused (`ReferenceMismatchError`) if another extractor made it."""
        ref, name = load_reference(path)
        if name != self.name:
            raise ReferenceMismatchError(f"FID reference {path} was made with extractor {name!r}; "
                                         f"this FID uses {self.name!r}")
        return ref

    def _metric(self) -> FrechetInceptionDistance:
        # reset_real_features=False: a reset keeps the cached real statistics.
        return FrechetInceptionDistance(feature=self.extractor, reset_real_features=False).to(self.device)

    def _update(self, metric: FrechetInceptionDistance, images: torch.Tensor, real: bool,
                batch_size: int, what: str) -> None:
        _check_images(images, what)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        starts = range(0, len(images), batch_size)
        with torch.inference_mode():
            for s in tqdm(starts, desc=f"FID {what} ({self.name})", unit="batch", leave=False,
                          disable=len(starts) < 10):
                metric.update(images[s:s + batch_size].to(self.device), real=real)


def save_reference(path: str | os.PathLike, reference: Mapping[str, torch.Tensor], name: str) -> None:
    """Write reference statistics as safetensors with one metadata key: JSON holding the extractor
    ``name``, the sample count and the feature width."""
    ref = check_reference(reference)
    meta = {"extractor": name, "num_samples": int(ref["real_features_num_samples"]),
            "num_features": int(ref["real_features_sum"].numel())}
    save_tensors(path, ref, {META_KEY: json.dumps(meta, sort_keys=True)})


def load_reference(path: str | os.PathLike, stage: str | None = "feature_extractor"
                   ) -> tuple[Reference, str]:
    """The statistics and extractor name written by `save_reference`, verified against their
    content hash (InputError naming ``dvc repro <stage>`` otherwise)."""
    tensors, meta = read_tensors(path, stage)
    if "extractor" not in meta:
        raise ValueError(f"{path} is not an FID reference (no {META_KEY!r} metadata)")
    ref = check_reference(tensors)
    if int(ref["real_features_num_samples"]) != meta["num_samples"]:
        raise ValueError(f"{path}: metadata says {meta['num_samples']} samples, the tensors "
                         f"{int(ref['real_features_num_samples'])}")
    return ref, meta["extractor"]


def check_reference(reference: Mapping[str, torch.Tensor], num_features: int | None = None) -> Reference:
    """Validate reference statistics; returns them as float64 sums and an int64 count."""
    missing = [k for k in REFERENCE_KEYS if k not in reference]
    if missing:
        raise ValueError(f"FID reference lacks {missing}; expected keys {list(REFERENCE_KEYS)}")
    s = reference["real_features_sum"].double()
    cov = reference["real_features_cov_sum"].double()
    n = reference["real_features_num_samples"].long().reshape(())
    d = s.numel()
    if s.dim() != 1 or cov.shape != (d, d):
        raise ValueError(f"FID reference has feature sum {tuple(s.shape)} and covariance sum "
                         f"{tuple(cov.shape)}; expected (d,) and (d, d)")
    if num_features is not None and d != num_features:
        raise ReferenceMismatchError(f"FID reference has {d} features; this extractor gives {num_features}")
    if int(n) < 2:
        raise ValueError(f"FID reference holds {int(n)} samples; at least 2 are needed")
    return {"real_features_sum": s, "real_features_cov_sum": cov, "real_features_num_samples": n}


def _check_images(images: torch.Tensor, what: str) -> None:
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(f"FID {what} images must be a tensor (N, C, H, W), got {shape}")
    if not images.is_floating_point():
        raise TypeError(f"FID {what} images must be floats in [0, 1], got {images.dtype}")
    if len(images) < 2:
        raise ValueError(f"FID needs at least 2 {what} images (a covariance), got {len(images)}")


def _module_device(module: nn.Module) -> torch.device:
    for t in (*module.parameters(), *module.buffers()):
        return t.device
    return torch.device("cpu")
