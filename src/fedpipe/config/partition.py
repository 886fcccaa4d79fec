"""Partition params (section ``partition``). ``scheme`` selects the dataclass; every scheme shares the
fields of :class:`PartitionConfig` (client count, minimum size, local test split, quantity and
feature skew) and adds its own. A key of another scheme is an unknown key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedpipe.config.core import build_selected, check, one_of
from fedpipe.config.dataset import DatasetConfig

FEATURE_SKEWS = ("none", "rotation", "noise")
LOCAL_TESTS = ("drawn", "classes")
DEFAULT_SKEW_VALUES = {"none": [], "rotation": [0.0, 90.0, 180.0, 270.0],
                       "noise": [0.0, 0.05, 0.1, 0.2]}


@dataclass(frozen=True)
class PartitionConfig:
    """Fields shared by every scheme.

    - ``num_clients``: N.
    - ``min_size``: every client must get at least this many training samples.
    - ``local_test``: how each client's local test split is made from the official test set:
      ``drawn`` = a sample with the client's training label distribution, of ``local_test_size``
      images; ``classes`` = every test image of each class the client holds (Equitable-FL's
      per-client test set, docs/papers/equitable_fl.md: clients owning the same classes share it, so
      a client accuracy resolves about 1 / (its classes' test images), not 1 / its small share).
    - ``local_test_size``: size of each drawn local test split (``local_test: drawn``); ``null`` =
      the client's proportional share of the test set (n_test * m_i / n_train).
    - ``quantity_skew_sigma``: log-normal client sizes: client weights w_i = exp(N(0, sigma^2)) scale
      the share of every class a client receives (0 = off). Works on top of every label scheme.
    - ``feature_skew``: ``none``, ``rotation`` (degrees) or ``noise`` (Gaussian std, in [0,1] pixel
      units); client i gets ``feature_skew_values[i % len]``. An empty list takes the defaults
      (rotation 0/90/180/270, noise 0/0.05/0.1/0.2).
    """

    scheme: str = "iid"
    num_clients: int = 10
    min_size: int = 1
    local_test: str = "drawn"
    local_test_size: int | None = None
    quantity_skew_sigma: float = 0.0
    feature_skew: str = "none"
    feature_skew_values: list[float] = field(default_factory=list)

    def validate(self, p: str) -> None:
        one_of(f"{p}.scheme", self.scheme, PARTITION_CONFIGS)
        check(self.num_clients >= 1, f"{p}.num_clients", self.num_clients, "an integer >= 1")
        check(self.min_size >= 0, f"{p}.min_size", self.min_size, "an integer >= 0")
        one_of(f"{p}.local_test", self.local_test, LOCAL_TESTS)
        if self.local_test == "classes":
            check(self.local_test_size is None, f"{p}.local_test_size", self.local_test_size,
                  "null with local_test: classes (every test image of the client's classes)")
        if self.local_test_size is not None:
            check(self.local_test_size >= 1, f"{p}.local_test_size", self.local_test_size,
                  "null or an integer >= 1")
        check(0.0 <= self.quantity_skew_sigma <= 5.0, f"{p}.quantity_skew_sigma",
              self.quantity_skew_sigma, "a number in [0, 5]")
        one_of(f"{p}.feature_skew", self.feature_skew, FEATURE_SKEWS)
        if self.feature_skew == "none":
            check(not self.feature_skew_values, f"{p}.feature_skew_values",
                  self.feature_skew_values, "[] when feature_skew is none")
        if self.feature_skew == "noise":
            check(all(v >= 0 for v in self.feature_skew_values), f"{p}.feature_skew_values",
                  self.feature_skew_values, "noise levels >= 0")

    def skew_values(self) -> list[float]:
        return list(self.feature_skew_values) or list(DEFAULT_SKEW_VALUES[self.feature_skew])

    def check_against(self, ds: DatasetConfig, p: str = "partition") -> None:
        """Cross-checks with the dataset (its size and class count), still without loading it."""
        n, c = ds.train_size(), ds.num_classes()
        check(self.num_clients <= n, f"{p}.num_clients", self.num_clients,
              f"at most the {n} training samples of dataset {ds.name}")
        check(self.num_clients * self.min_size <= n, f"{p}.min_size", self.min_size,
              f"at most {n // self.num_clients} ({n} samples of {ds.name} over "
              f"{self.num_clients} clients)")
        self._check_scheme(ds, n, c, p)

    def _check_scheme(self, ds: DatasetConfig, n: int, c: int, p: str) -> None:
        """Scheme-specific cross-checks (overridden)."""


@dataclass(frozen=True)
class IIDConfig(PartitionConfig):
    """Uniformly random split (sizes follow ``quantity_skew_sigma``)."""

    scheme: str = "iid"


@dataclass(frozen=True)
class DirichletConfig(PartitionConfig):
    """Per-class proportions q_c ~ Dir(alpha * 1_N) split class c over the clients.

    Drawn again (at most ``max_retries`` times) until every client has ``min_size`` samples; then a
    clear error instead of looping forever.
    """

    scheme: str = "dirichlet"
    alpha: float = 0.5
    max_retries: int = 100

    def validate(self, p: str) -> None:
        super().validate(p)
        check(self.alpha > 0, f"{p}.alpha", self.alpha, "a number > 0")
        check(1 <= self.max_retries <= 100000, f"{p}.max_retries", self.max_retries,
              "an integer in [1, 100000]")


@dataclass(frozen=True)
class ShardsConfig(PartitionConfig):
    """FedDDPM's shards: sort by label, cut into N * shards_per_client equal shards, deal at random."""

    scheme: str = "shards"
    shards_per_client: int = 2

    def validate(self, p: str) -> None:
        super().validate(p)
        check(self.shards_per_client >= 1, f"{p}.shards_per_client", self.shards_per_client,
              "an integer >= 1")

    def _check_scheme(self, ds: DatasetConfig, n: int, c: int, p: str) -> None:
        shards = self.num_clients * self.shards_per_client
        check(shards <= n, f"{p}.shards_per_client", self.shards_per_client,
              f"num_clients * shards_per_client <= {n} (the training samples of {ds.name}); "
              f"{self.num_clients} * {self.shards_per_client} = {shards} shards cannot be dealt")


@dataclass(frozen=True)
class PathologicalConfig(PartitionConfig):
    """Each client holds ``classes_per_client`` classes; a class is split among its owners."""

    scheme: str = "pathological"
    classes_per_client: int = 2

    def validate(self, p: str) -> None:
        super().validate(p)
        check(self.classes_per_client >= 1, f"{p}.classes_per_client",
              self.classes_per_client, "an integer >= 1")

    def _check_scheme(self, ds: DatasetConfig, n: int, c: int, p: str) -> None:
        check(self.classes_per_client <= c, f"{p}.classes_per_client", self.classes_per_client,
              f"at most the {c} classes of {ds.name}")


@dataclass(frozen=True)
class LabelBlocksConfig(PartitionConfig):
    """Equitable-FL Table 1: planted groups of clients, each owning a disjoint block of classes.

    Group g has ``groups[g]`` consecutive clients and owns the next ``blocks[g]`` classes (in class
    order). Within a class, the group's clients get disjoint samples: ``per_class_per_client`` each
    (paper: 800 for MNIST/CIFAR-10) or, when null, the class split evenly over the group.
    """

    scheme: str = "label_blocks"
    groups: list[int] = field(default_factory=lambda: [4, 6])
    blocks: list[int] = field(default_factory=lambda: [4, 6])
    per_class_per_client: int | None = None

    def validate(self, p: str) -> None:
        super().validate(p)
        check(len(self.groups) >= 1 and all(g >= 1 for g in self.groups), f"{p}.groups",
              self.groups, "a non-empty list of integers >= 1")
        check(len(self.blocks) == len(self.groups) and all(b >= 1 for b in self.blocks),
              f"{p}.blocks", self.blocks, f"{len(self.groups)} integers >= 1 (one per group)")
        check(sum(self.groups) == self.num_clients, f"{p}.groups", self.groups,
              f"group sizes summing to num_clients={self.num_clients}")
        if self.per_class_per_client is not None:
            check(self.per_class_per_client >= 1, f"{p}.per_class_per_client",
                  self.per_class_per_client, "null or an integer >= 1")
            check(self.quantity_skew_sigma == 0, f"{p}.quantity_skew_sigma",
                  self.quantity_skew_sigma, "0 when per_class_per_client is set")

    def _check_scheme(self, ds: DatasetConfig, n: int, c: int, p: str) -> None:
        check(sum(self.blocks) <= c, f"{p}.blocks", self.blocks,
              f"class blocks summing to at most the {c} classes of {ds.name}")


PARTITION_CONFIGS: dict[str, type[PartitionConfig]] = {
    "iid": IIDConfig,
    "dirichlet": DirichletConfig,
    "shards": ShardsConfig,
    "pathological": PathologicalConfig,
    "label_blocks": LabelBlocksConfig,
}


def partition_config(data: dict[str, Any] | None, prefix: str = "partition") -> PartitionConfig:
    """Build the partition config selected by ``data['scheme']``."""
    return build_selected(PARTITION_CONFIGS, data, prefix, "scheme")
