"""Data layer: dataset registry, partitioners, client feature skew, partition statistics."""

from fedpipe.data.corruptions import CORRUPTIONS, corrupt, corrupted_split, corrupted_test_sets
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
