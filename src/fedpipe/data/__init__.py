"""Data layer: dataset registry, partitioners, client feature skew, partition statistics, corruptions.

The corruptions (:mod:`fedpipe.data.corruptions`) load on first use: they import torchvision's
transforms (about a second), which most stages never need.
"""

from typing import Any

from fedpipe.data.datasets import (
    Dataset,
    DatasetMeta,
    DatasetNotFoundError,
    Split,
    load_dataset,
)
from fedpipe.data.partition import Partition, apportion, make_partition
from fedpipe.data.skew import ClientData, apply_feature_skew, client_data
from fedpipe.data.stats import partition_statistics

__all__ = [
    "Dataset",
    "DatasetMeta",
    "DatasetNotFoundError",
    "Split",
    "load_dataset",
    "Partition",
    "apportion",
    "make_partition",
    "ClientData",
    "apply_feature_skew",
    "client_data",
    "partition_statistics",
    "CORRUPTIONS",
    "corrupt",
    "corrupted_split",
    "corrupted_test_sets",
]

_LAZY = {"CORRUPTIONS", "corrupt", "corrupted_split", "corrupted_test_sets"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from fedpipe.data import corruptions

        return getattr(corruptions, name)
    raise AttributeError(f"module 'fedpipe.data' has no attribute {name!r}")
