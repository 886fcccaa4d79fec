"""The FID tools file (written by feature_extractor, read by aux_quality and the diffusion track's
training stages): the feature classifier, the FID metric it feeds, their check and reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from fedpipe.config.diffusion import FIDConfig
from fedpipe.data import DatasetMeta
from fedpipe.io import load_tensors, read_metadata
from fedpipe.metrics.fid import FID, ClassifierFeatures, inception_extractor, load_reference
from fedpipe.models import build_model
from fedpipe.pipeline.diffusion import FID_DIR
from fedpipe.rng import torch_seed

META_KEY = "fedpipe.fid_classifier"


@dataclass(frozen=True)
class FIDTools:
    """What scoring needs: the FID object, the cached real reference, and the trained classifier."""

    fid: FID
    reference: dict[str, torch.Tensor]
    classifier: torch.nn.Module


def build_classifier(cfg: FIDConfig, meta: DatasetMeta, seed: int) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(torch_seed(seed, "fid-classifier-init"))
        return build_model(cfg.classifier.name, meta.shape, meta.num_classes, mean=meta.mean,
                           std=meta.std, **cfg.classifier.kwargs)


def make_fid(cfg: FIDConfig, classifier: torch.nn.Module, device: torch.device) -> FID:
    if cfg.extractor == "inception":
        return FID(inception_extractor(cfg.inception_weights), "inception-v3-2048", device=device)
    return FID(ClassifierFeatures(classifier), f"classifier:{cfg.classifier.name}", device=device)


def check_fid_inputs(fid_dir: str | Path = FID_DIR) -> None:
    """The feature_extractor stage's files are there and readable (InputError otherwise); the
    stages that score call it before any compute."""
    from fedpipe.io import check_input
    from fedpipe.metrics.fid import META_KEY as REFERENCE_KEY

    check_input(Path(fid_dir) / "classifier.safetensors", "feature_extractor", metadata=META_KEY)
    check_input(Path(fid_dir) / "reference.safetensors", "feature_extractor",
                metadata=REFERENCE_KEY)


def load_fid_tools(cfg: FIDConfig, meta: DatasetMeta, seed: int, fid_dir: str | Path = FID_DIR,
                   device: str | torch.device = "cpu") -> FIDTools:
    """The FID object, reference and classifier written by the feature_extractor stage, computing
    on ``device`` (the stage's resolved top-level ``device``)."""
    d = Path(fid_dir)
    check_fid_inputs(d)
    saved = read_metadata(d / "classifier.safetensors", META_KEY) or {}
    if saved.get("model") != cfg.classifier.name:
        raise ValueError(f"{d / 'classifier.safetensors'} holds a {saved.get('model')!r} classifier, "
                         f"params say {cfg.classifier.name!r} (re-run `dvc repro feature_extractor`)")
    device = torch.device(device)
    clf = build_classifier(cfg, meta, seed)
    clf.load_state_dict(load_tensors(d / "classifier.safetensors", "feature_extractor"))
    clf.to(device).eval()
    fid = make_fid(cfg, clf, device)
    ref, name = load_reference(d / "reference.safetensors")
    if name != fid.name:
        raise ValueError(f"{d / 'reference.safetensors'} was made with {name!r}, not {fid.name!r}")
    return FIDTools(fid, ref, clf)
