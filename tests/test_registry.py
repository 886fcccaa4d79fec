"""Methods register themselves (``@register("<name>")`` in their own module) and only the module of a
method that is looked up is imported (fedpipe.algorithms.registry)."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from fedpipe.algorithms import ALGORITHMS, register
from fedpipe.algorithms.registry import scan
from fedpipe.fl import Strategy


def loaded_methods(code: str) -> set[str]:
    """The method modules loaded after running ``code`` in a fresh interpreter."""
    probe = code + "\nimport sys\nprint(' '.join(sorted(m for m in sys.modules " \
        "if m.startswith('fedpipe.algorithms.') and m != 'fedpipe.algorithms.registry')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_importing_the_registry_loads_no_method() -> None:
    assert loaded_methods("from fedpipe.algorithms import ALGORITHMS; assert 'fednh' in ALGORITHMS"
                          "; assert len(ALGORITHMS) > 30") == set()


def test_looking_up_a_method_loads_its_module_and_what_it_imports_only() -> None:
    assert loaded_methods("from fedpipe.algorithms import ALGORITHMS; ALGORITHMS['fedprox']") == \
        {"fedpipe.algorithms.fedprox"}
    # Cluster2 builds on FedProx: its module imports fedprox, nothing else
    assert loaded_methods("from fedpipe.algorithms import ALGORITHMS; ALGORITHMS['cluster2']") == \
        {"fedpipe.algorithms.cluster2", "fedpipe.algorithms.fedprox"}


def test_the_scan_finds_exactly_the_registered_classes_in_their_modules() -> None:
    index = scan()
    for name, module in index.items():
        cls = ALGORITHMS[name]
        assert issubclass(cls, Strategy) and cls.name == name
        assert cls.__module__ == module, (name, cls.__module__, module)
    # every Strategy subclass that a method module defines with a name of its own is in the index
    for module in set(index.values()):
        mod = sys.modules[module]
        for _, obj in inspect.getmembers(mod, inspect.isclass):
            if obj.__module__ == module and issubclass(obj, Strategy) and "name" in vars(obj):
                assert index.get(obj.name) == module, (module, obj)


def test_a_name_registered_twice_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text('@register("dup")\nclass A: ...\n')
    (tmp_path / "b.py").write_text('@register("dup")\nclass B: ...\n')
    with pytest.raises(ValueError, match="'dup' registered in fedpipe.algorithms.a and b"):
        scan(tmp_path)

    class Other(Strategy):
        pass

    ALGORITHMS["fedavg"]  # loaded: its name is taken
    with pytest.raises(ValueError, match="registered twice"):
        register("fedavg")(Other)


def test_an_unknown_name_is_a_key_error_and_not_in_the_registry() -> None:
    assert "nosuch" not in ALGORITHMS
    with pytest.raises(KeyError):
        ALGORITHMS["nosuch"]
