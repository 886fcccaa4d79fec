"""The method registry: a method registers itself where it is defined, and only its module is loaded.

A method's module marks each of its Strategy classes with ``@register("<name>")``, the name used in
params (``algorithms.<name>``, ``study.algorithms``); that is its one registration (its config
dataclass holds its defaults). The names are read from the modules' text without importing them
(:func:`scan`), so that knowing which methods exist costs a few milliseconds, and looking one up
(``ALGORITHMS[name]``) imports that method's module alone. A training stage therefore loads only the
method it runs, and its code fingerprint (:mod:`fedpipe.pipeline.code`) names that method's file and
not the other methods': an edit to one method re-runs only that method's stages.

``tests/test_registry.py`` checks that the scan and the decorators agree (every decorated class is
found by the scan, under its module, and nothing else is).
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

PACKAGE = "fedpipe.algorithms"
FOLDER = Path(__file__).resolve().parent
_DECORATOR = re.compile(r'^@register\(\s*"([a-z][a-z0-9_]*)"\s*\)\s*$', re.MULTILINE)

T = TypeVar("T", bound=type)
_LOADED: dict[str, type] = {}


def register(name: str) -> Callable[[T], T]:
    """Class decorator: registers a Strategy class as method ``name`` (also its ``name`` attribute).
    Write it as ``@register("<name>")`` on its own line: :func:`scan` finds it there."""
    def deco(cls: T) -> T:
        owner = _LOADED.get(name)
        if owner is not None and owner.__qualname__ != cls.__qualname__:
            raise ValueError(f"method name {name!r} registered twice: {owner} and {cls}")
        cls.name = name
        _LOADED[name] = cls
        return cls
    return deco


def scan(folder: Path = FOLDER) -> dict[str, str]:
    """``{method name: module name}`` of every ``@register("<name>")`` line in the package's modules,
    without importing them."""
    index: dict[str, str] = {}
    for path in sorted(folder.glob("*.py")):
        if path.stem.startswith("_") or path.stem == "registry":
            continue
        for name in _DECORATOR.findall(path.read_text()):
            if name in index:
                raise ValueError(f"method name {name!r} registered in {index[name]} and {path.stem}")
            index[name] = f"{PACKAGE}.{path.stem}"
    return index


class Registry(Mapping[str, type]):
    """Method name -> Strategy class, loading a method's module on first lookup."""

    @functools.cached_property
    def index(self) -> dict[str, str]:
        return scan()

    def __getitem__(self, name: str) -> type:
        if name not in self.index:
            raise KeyError(name)
        if name not in _LOADED:
            importlib.import_module(self.index[name])  # the module registers its classes
        if name not in _LOADED:
            raise RuntimeError(f"{self.index[name]} has a @register({name!r}) line that registers "
                               "nothing")
        return _LOADED[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, name: object) -> bool:
        return name in self.index

    def module_file(self, name: str) -> Path:
        """The file that defines method ``name`` (without importing it)."""
        return FOLDER / f"{self.index[name].rpartition('.')[2]}.py"


ALGORITHMS = Registry()
