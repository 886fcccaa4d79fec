"""Algorithms: one module per method family, each a :class:`fedpipe.fl.Strategy`.

A method registers itself in its own module (``@register("<name>")``, :mod:`.registry`);
``ALGORITHMS`` maps the name used in params (``algorithms.<name>``, ``study.algorithms``) to the
Strategy class and imports a method's module only when it is looked up, so that a stage loads only
the method it runs. Each class's ``config_class`` is its hyperparameter dataclass. Every section may also
say where the method's model starts (``backbone``, ``pretrain_rounds``: :func:`init_config`), which
the pipeline honours for every algorithm; the algorithm's config never sees those keys.
"""

from __future__ import annotations

from typing import Any

from fedpipe.algorithms.registry import ALGORITHMS, register
from fedpipe.config import ConfigError, build
from fedpipe.config.fl import INIT_KEYS, InitConfig

__all__ = ["ALGORITHMS", "algorithm_config", "check_algorithm_sections", "check_algorithms",
           "init_config", "register"]


def check_algorithms(names: list[str] | tuple[str, ...], key: str) -> None:
    """Every name of ``names`` (the value of param ``key``) is a registered algorithm. (Only
    registry names reach a stage's name, dvc.yaml's paths, or anything else.)"""
    for i, name in enumerate(names):
        if name not in ALGORITHMS:
            raise ConfigError(f"{key}[{i}]", name, "one of " + ", ".join(sorted(ALGORITHMS)))


def algorithm_config(name: str, data: dict[str, Any] | None, key: str = "algorithm argument") -> Any:
    """Validate ``algorithms.<name>`` against the algorithm's config dataclass (``key`` names where
    ``name`` came from, for the error line); its init keys (:func:`init_config`) are validated and
    left out."""
    init_config(name, data, key)  # the section's init keys are valid too
    own = {k: v for k, v in data.items() if k not in INIT_KEYS} if isinstance(data, dict) else data
    return build(ALGORITHMS[name].config_class, own, f"algorithms.{name}")


def init_config(name: str, data: dict[str, Any] | None, key: str = "algorithm argument"
                ) -> InitConfig:
    """Where algorithm ``name``'s model starts: the ``backbone`` / ``pretrain_rounds`` keys of
    ``algorithms.<name>``, by default the algorithm's ``default_backbone`` (``none``; PerAda's frozen
    backbone: ``fedavg``)."""
    if name not in ALGORITHMS:
        raise ConfigError(key, name, "one of " + ", ".join(sorted(ALGORITHMS)))
    given = {k: v for k, v in data.items() if k in INIT_KEYS} if isinstance(data, dict) else {}
    return build(InitConfig, {"backbone": ALGORITHMS[name].default_backbone, **given},
                 f"algorithms.{name}")


def check_algorithm_sections(data: Any) -> dict[str, Any]:
    """The ``algorithms`` section: a mapping from registered names to mappings, each valid for its
    algorithm (all are checked, not only the study's: a typo in any is an error). Returns it."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("algorithms", data, "a mapping of algorithm name to its settings")
    for name, cfg in data.items():
        if name not in ALGORITHMS:
            raise ConfigError(f"algorithms.{name}", cfg,
                              "a registered algorithm name: " + ", ".join(sorted(ALGORITHMS)))
        if cfg is not None and not isinstance(cfg, dict):
            raise ConfigError(f"algorithms.{name}", cfg, "a mapping of settings ({} for the defaults)")
        algorithm_config(name, cfg)
    return data
