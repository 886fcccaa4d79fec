"""Metrics: accuracy (global, per-client, personalized), fairness summaries, and FID.

The FID names (:mod:`fedpipe.metrics.fid`) load on first use: torchmetrics' FID costs about a second of
imports, which the classification stages never need.
"""

from typing import Any

from fedpipe.metrics.accuracy import (
    client_accuracy_summary,
    per_client_accuracy,
    per_client_loss,
)
from fedpipe.metrics.fairness import (
    client_disagreement,
    clustering_nmi,
    fairness_summary,
    sigma_acc,
)
from fedpipe.metrics.personalized import (
    class_weights,
    per_class_accuracy,
    pm_accuracy,
    pm_accuracy_of,
    train_class_counts,
    weighted_client_accuracy,
)

__all__ = [
    "FID",
    "ClassifierFeatures",
    "InceptionFeatures",
    "ReferenceMismatchError",
    "class_weights",
    "client_accuracy_summary",
    "client_disagreement",
    "clustering_nmi",
    "fairness_summary",
    "inception_extractor",
    "load_reference",
    "per_class_accuracy",
    "per_client_accuracy",
    "per_client_loss",
    "pm_accuracy",
    "pm_accuracy_of",
    "save_reference",
    "sigma_acc",
    "train_class_counts",
    "weighted_client_accuracy",
]

_FID_NAMES = {"FID", "ClassifierFeatures", "InceptionFeatures", "ReferenceMismatchError",
              "inception_extractor", "load_reference", "save_reference"}


def __getattr__(name: str) -> Any:
    if name in _FID_NAMES:
        from fedpipe.metrics import fid

        return getattr(fid, name)
    raise AttributeError(f"module 'fedpipe.metrics' has no attribute {name!r}")
