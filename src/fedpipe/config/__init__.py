"""Typed, validated views of ``params.yaml``.

Each params section has a dataclass; building one from a mapping rejects unknown keys and checks every
value, raising :class:`ConfigError` with one line that names the key, the value and what is allowed.
Nothing here loads data: all checks run before any compute starts (stages exit with code 2). What
each stage reads of these sections (its view of params) is defined beside the stage, in
:mod:`fedpipe.pipeline`.
"""

from fedpipe.config.core import ConfigError, build, load_params
from fedpipe.config.dataset import (
    DATASET_CONFIGS,
    DatasetConfig,
    DigitsConfig,
    SyntheticConfig,
    TorchvisionConfig,
    dataset_config,
)
from fedpipe.config.partition import PARTITION_CONFIGS, PartitionConfig, partition_config

__all__ = [
    "ConfigError",
    "build",
    "load_params",
    "DATASET_CONFIGS",
    "DatasetConfig",
    "DigitsConfig",
    "SyntheticConfig",
    "TorchvisionConfig",
    "dataset_config",
    "PARTITION_CONFIGS",
    "PartitionConfig",
    "partition_config",
]
