"""Metrics: accuracy (global, per-client, personalized), fairness summaries, and FID."""

from fedpipe.metrics.accuracy import client_accuracy_summary, per_client_accuracy
from fedpipe.metrics.fid import (
    FID,
    ClassifierFeatures,
    InceptionFeatures,
    ReferenceMismatchError,
    inception_extractor,
    load_reference,
    save_reference,
)

__all__ = [
    "FID",
    "ClassifierFeatures",
    "InceptionFeatures",
    "ReferenceMismatchError",
    "client_accuracy_summary",
    "inception_extractor",
    "load_reference",
    "per_client_accuracy",
    "save_reference",
]
