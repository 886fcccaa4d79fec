"""Metrics: accuracy (global, per-client, personalized) and fairness summaries."""

from fedpipe.metrics.accuracy import client_accuracy_summary, per_client_accuracy

__all__ = ["client_accuracy_summary", "per_client_accuracy"]
