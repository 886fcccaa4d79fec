"""The feature_extractor stage: the FID feature extractor and the cached reference statistics of the
real training set.

- Default (``fid.extractor: classifier``): a classifier from the model registry (``fid.classifier``)
  is trained centrally on the real training set (Adam, ``fid.classifier_*``), and FID uses its
  penultimate-layer features. This is the usual practice for MNIST-like data and the only one that
  works offline. The classifier is also what measures the class accuracy of labelled generated sets.
- ``fid.extractor: inception``: the standard 2048-d InceptionV3 FID from a local weights file; the
  classifier is still trained (for the class-accuracy checks).

Outputs in ``data/fid/``: ``classifier.safetensors``, ``reference.safetensors`` (sum, covariance sum
and count of the real training features, tagged with the extractor's name) and ``metrics.json``
(classifier test accuracy; FID of the real test set against the reference, the floor that real
data of that size reaches).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch
from tqdm.auto import tqdm

from fedpipe.config.device import AccelConfig
from fedpipe.config.diffusion import FIDConfig, check_diffusion_models
from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import ClientData, DatasetMeta, load_dataset
from fedpipe.fl.local import local_train
from fedpipe.io import md5_file, save_tensors, write_json
from fedpipe.metrics.fid import save_reference
from fedpipe.pipeline.diffusion import FID_DIR, DiffusionStageConfig
from fedpipe.pipeline.fid_tools import META_KEY, build_classifier, make_fid
from fedpipe.rng import torch_generator
from fedpipe.tasks import ClassificationTask

log = logging.getLogger(__name__)


def train_classifier(cfg: FIDConfig, meta: DatasetMeta, train: ClientData, seed: int,
                     device: torch.device, progress: bool = True,
                     accel: AccelConfig | None = None) -> torch.nn.Module:
    """The FID classifier, trained on ``device`` (its data moved there once; ``accel``: the CUDA
    switches, nothing on the CPU)."""
    accel = accel or AccelConfig()
    model = build_classifier(cfg, meta, seed).to(device)
    train = train.to(device)
    task = ClassificationTask(bf16_autocast=accel.bf16_autocast, compile=accel.compile)
    local = LocalTrainConfig(epochs=cfg.classifier_epochs, batch_size=cfg.classifier_batch_size,
                             optimizer="adam", lr=cfg.classifier_lr)
    total = cfg.classifier_epochs * math.ceil(len(train) / cfg.classifier_batch_size)
    with tqdm(total=total, desc="FID classifier", unit="step", disable=not progress,
              mininterval=1.0) as bar:
        local_train(model, train, task, local, 0, torch_generator(seed, "fid-classifier"),
                    step_hook=lambda m: bar.update(1))
    return model.eval()


def feature_extractor(cfg: DiffusionStageConfig, out_dir: str | Path = FID_DIR,
                      progress: bool = True) -> dict:
    """Train the classifier, cache the reference statistics; returns the stage's metrics."""
    out = Path(out_dir)
    check_diffusion_models(cfg.dataset, cfg.diffusion, cfg.fid)  # before any data loads
    ds = load_dataset(cfg.dataset)
    device = cfg.device.torch
    clf = train_classifier(cfg.fid, ds.meta, ClientData(ds.train.x, ds.train.y), cfg.seed, device,
                           progress, cfg.device.accel)
    acc = ClassificationTask().evaluate(clf.cpu(), ds.test.x, ds.test.y)["accuracy"]
    clf.to(device)
    meta = {"model": cfg.fid.classifier.name, "kwargs": cfg.fid.classifier.kwargs,
            "dataset": cfg.dataset.name, "test_accuracy": acc}
    save_tensors(out / "classifier.safetensors",
                 dict(sorted((k, v) for k, v in clf.state_dict().items())),
                 {META_KEY: json.dumps(meta, sort_keys=True)})
    fid = make_fid(cfg.fid, clf, device)
    ref = fid.reference(ds.train.x, batch_size=cfg.fid.batch_size)
    save_reference(out / "reference.safetensors", ref, fid.name)
    test_fid = fid.score(ds.test.x, ref, batch_size=cfg.fid.batch_size)
    metrics = {"extractor": fid.name, "classifier_test_accuracy": acc,
               "reference_samples": len(ds.train), "fid_real_test": test_fid,
               "real_test_samples": len(ds.test)}
    write_json(out / "metrics.json", metrics)
    log.info("FID extractor %s: classifier test accuracy %.4f; FID(real test, train) = %.4f",
             fid.name, acc, test_fid)
    return {"metrics": metrics,
            "outputs": {str(out / "reference.safetensors"): md5_file(out / "reference.safetensors")}}


