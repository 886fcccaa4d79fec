"""Config machinery: strict dataclass construction from plain mappings; the params file and its
top-level sections (the root ``seed`` among them)."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from fedpipe.errors import ConfigError  # defined with the other errors; kept importable from here

T = TypeVar("T")


def load_params(path: str | Path = "params.yaml") -> dict[str, Any]:
    """Read the composed params file (never Hydra's ``@main``: DVC composes ``params.yaml``)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("params_file", str(path), "an existing YAML file (run from the repo root)")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError("params_file", str(path), f"valid YAML ({yaml_problem(e)})") from None
    if not isinstance(data, dict):
        raise ConfigError("params_file", str(path), "a YAML mapping at top level")
    return data


# Top-level sections of params.yaml; later stages add theirs here.
KNOWN_SECTIONS = ("seed", "dataset", "partition", "model", "fl", "study", "algorithms", "diffusion",
                  "warmup", "generate", "fid", "diffusion_fl", "device", "accel")


def check_sections(params: dict[str, Any]) -> None:
    """Every top-level key of ``params`` is a known section, and no section is null."""
    unknown = sorted(set(params) - set(KNOWN_SECTIONS))
    if unknown:
        raise ConfigError(unknown[0], params[unknown[0]],
                          "top-level sections are " + ", ".join(KNOWN_SECTIONS))
    for name in KNOWN_SECTIONS:  # null would silently stand for the dataclass defaults
        if name not in ("seed", "device") and name in params and params[name] is None:
            raise ConfigError(name, None, "a mapping (the composed section; {} for the defaults)")


def param_at(params: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """``params`` at the dotted ``key`` (``fid.extractor``), ``default`` where a part is missing."""
    node: Any = params
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def read_seed(params: dict[str, Any]) -> int:
    """The root ``seed``: it seeds only what every replicate shares (the FID feature extractor, the
    corrupted test sets); replicate r of ``study.seeds`` draws everything else from r
    (docs/replicates.md)."""
    seed = params.get("seed", 0)
    check(isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0, "seed", seed,
          "an integer >= 0")
    return seed


def yaml_problem(e: Exception) -> str:
    """One line from a YAML error: what is wrong and where (line, column)."""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}".replace("\n", " ")


def check_finite_tree(key: str, value: Any) -> None:
    """Every number inside ``value`` (nested mappings and lists) is finite."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(key, value, "a finite number")
    if isinstance(value, Mapping):
        for k, v in value.items():
            check_finite_tree(f"{key}.{k}", v)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_finite_tree(f"{key}[{i}]", v)


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against the annotation ``tp`` (int, float, bool, str, dict, list[...], X | None)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(key, value, inner[0])
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, value, f"a list of {item_tp.__name__}")
        return [_coerce(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value)]
    if tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(key, value, "a mapping")
        check_finite_tree(key, value)
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, value, "true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, value, "an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, value, "a number")
        if not math.isfinite(value):  # params are finite; where null = off, null is the way
            raise ConfigError(key, value, "a finite number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, value, "a string")
        return value
    raise TypeError(f"unsupported config annotation {tp!r} for {key}")  # a bug, not user input


def build(cls: type[T], data: Mapping[str, Any] | None, prefix: str) -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types raise ConfigError.

    Fields without a default are required. After construction, ``cls.validate(prefix)`` (if defined)
    checks value ranges.
    """
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(prefix, data, "a mapping of keys to values")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{prefix}.{unknown[0]}", data[unknown[0]],
                          f"known keys of {prefix} are {', '.join(sorted(fields))}")
    kwargs = {}
    for name, f in fields.items():
        key = f"{prefix}.{name}"
        if name in data:
            kwargs[name] = _coerce(key, data[name], hints[name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(key, None, "a value (this key is required)")
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate(prefix)
    return obj


def build_selected(registry: Mapping[str, type[T]], data: Any, prefix: str, selector: str) -> T:
    """Build the dataclass that ``data[selector]`` picks from ``registry`` (e.g. a dataset by
    ``name``, a partition by ``scheme``)."""
    if not isinstance(data, Mapping):
        raise ConfigError(prefix, data, f"a mapping with at least a {selector!r} key")
    choice = data.get(selector)
    if choice not in registry:
        raise ConfigError(f"{prefix}.{selector}", choice, "one of " + ", ".join(sorted(registry)))
    return build(registry[choice], data, prefix)


def section(data: Mapping[str, Any], name: str, prefix: str) -> Any:
    """``data[name]`` for a nested section: absent = {} (the defaults); an explicit null or a
    non-mapping is refused (null would silently stand for the dataclass defaults, not the
    composed ones)."""
    if name not in data:
        return {}
    value = data[name]
    if not isinstance(value, Mapping):
        raise ConfigError(f"{prefix}.{name}" if prefix else name, value,
                          "a mapping of keys to values ({} for the defaults)")
    return value


def check(cond: bool, key: str, value: Any, allowed: str) -> None:
    """Raise ConfigError(key, value, allowed) unless ``cond``."""
    if not cond:
        raise ConfigError(key, value, allowed)


def one_of(key: str, value: Any, choices: typing.Iterable[str]) -> None:
    choices = sorted(choices)
    check(value in choices, key, value, "one of " + ", ".join(choices))
