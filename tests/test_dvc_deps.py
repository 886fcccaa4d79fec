"""Each DVC stage's deps cover all the code it runs (DESIGN.md §3).

For every stage of dvc.yaml, find its script (``python stages/<x>.py ...`` in ``cmd``) and follow its
imports statically with ``ast``: absolute and relative imports, imports inside functions (lazy imports
run too), ``from pkg import name`` where ``name`` is a submodule, the ``__init__.py`` of every package on
the way, and imports of sibling scripts in stages/ (the script's folder is ``sys.path[0]``). Only
modules found under the search roots (stages/ and src/) are followed; third-party imports are ignored.
Every file reached must be covered by a dep: the file itself or a folder that contains it. Otherwise an
edit to it leaves ``dvc repro`` calling a stale result up to date.

The walker is conservative: an import under ``if TYPE_CHECKING:`` or in an ``except ImportError:`` branch
counts as run. Dynamic imports (``importlib.import_module``) are not seen; src/ has none.
"""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DVC_YAML = REPO / "dvc.yaml"
SRC = REPO / "src"


# --------------------------------------------------------------------------------------------------
# The checker


def stage_bodies(dvc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Stage name -> the body that holds its ``cmd`` and ``deps`` (``do`` of a ``foreach`` stage; the
    stage itself for a plain or a ``matrix`` stage)."""
    out = {}
    for name, stage in (dvc.get("stages") or {}).items():
        out[name] = stage["do"] if "foreach" in stage else stage
    return out


def stage_scripts(cmd: str | Sequence[str]) -> list[str]:
    """Paths of the Python scripts that ``cmd`` runs (``python[3] [opts] path/x.py args``, or
    ``python -m fedpipe.launch path/x.py args``)."""
    scripts = []
    for line in [cmd] if isinstance(cmd, str) else cmd:
        for part in re.split(r"&&|\|\||;|\|", line):
            tokens = shlex.split(part)
            for i, tok in enumerate(tokens):
                if re.fullmatch(r"(\S*/)?python[0-9.]*", tok):
                    rest = [t for t in tokens[i + 1:] if not t.startswith("-")]
                    if rest[:1] == ["fedpipe.launch"]:  # python -m fedpipe.launch <script> (warm start)
                        rest = rest[1:]
                    if rest and rest[0].endswith(".py"):
                        scripts.append(rest[0])
    return scripts


def module_file(name: str, roots: Sequence[Path]) -> Path | None:
    """The file of module ``name`` (``a/b.py`` or ``a/b/__init__.py``) in the first root that has it."""
    rel = Path(*name.split("."))
    for root in roots:
        for cand in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
            if cand.is_file():
                return cand
    return None


def module_name(path: Path, roots: Sequence[Path]) -> str:
    """Dotted name of the module in ``path`` (relative to the root that contains it)."""
    for root in roots:
        if path.is_relative_to(root):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join(parts)
    raise ValueError(f"{path} is under none of {roots}")


def imported_names(path: Path, name: str) -> set[str]:
    """Every module name that importing ``path`` (module ``name``) may import, anywhere in its body.

    ``from x import y`` yields both ``x`` and ``x.y`` (``y`` may be a submodule); the caller keeps the
    names that resolve to files.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".") if package else []
                up = node.level - 1
                if up > len(base_parts):
                    raise ImportError(f"{path}: relative import beyond the top-level package")
                base_parts = base_parts[:len(base_parts) - up]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base:
                out.add(base)
            out.update(f"{base}.{a.name}" if base else a.name for a in node.names if a.name != "*")
    return out


def with_parents(name: str) -> list[str]:
    """``a.b.c`` -> ``[a, a.b, a.b.c]``: importing a module runs its packages' ``__init__`` first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def code_closure(script: Path, roots: Sequence[Path]) -> set[Path]:
    """``script`` and every file under ``roots`` that running it imports, transitively.

    ``script``'s folder is searched first (it is ``sys.path[0]`` when run as a script), then ``roots``.
    """
    script = script.resolve()
    search = [script.parent] + [r.resolve() for r in roots]
    seen: set[Path] = set()
    todo: list[tuple[Path, str]] = [(script, "__main__")]
    while todo:
        path, name = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for imported in imported_names(path, name):
            for mod in with_parents(imported):
                f = module_file(mod, search)
                if f is not None and f.resolve() not in seen:
                    todo.append((f.resolve(), module_name(f.resolve(), search)))
    return seen


def covered(file: str, deps: Iterable[str]) -> bool:
    """A dep covers ``file`` (both relative to the repo root) if it is the file or a folder above it."""
    f = Path(file)
    for dep in deps:
        d = Path(dep.rstrip("/"))
        if f == d or d in f.parents:
            return True
    return False


def code_deps(deps: Iterable[Any]) -> list[str]:
    """Dep paths as written, without the templated (``${...}``) ones."""
    out = []
    for d in deps or []:
        path = next(iter(d)) if isinstance(d, Mapping) else str(d)
        if "${" not in path:
            out.append(path)
    return out


def uncovered_code(body: Mapping[str, Any], repo: Path, roots: Sequence[Path]) -> list[str]:
    """Files (relative to ``repo``) that the stage ``body`` runs and no dep covers; a stage whose
    ``cmd`` runs no script under ``repo`` is reported as such."""
    scripts = stage_scripts(body.get("cmd", ""))
    if not scripts:
        return [f"<no `python <script>.py` in cmd {body.get('cmd')!r}>"]
    deps = code_deps(body.get("deps"))
    missing: set[str] = set()
    for script in scripts:
        path = repo / script
        if not path.is_file():
            missing.add(f"<script {script} does not exist>")
            continue
        for f in code_closure(path, roots):
            rel = f.relative_to(repo.resolve()).as_posix()
            if not covered(rel, deps):
                missing.add(rel)
    return sorted(missing)


# --------------------------------------------------------------------------------------------------
# The check on this repository's dvc.yaml

STAGES = stage_bodies(yaml.safe_load(DVC_YAML.read_text()))


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_deps_cover_its_code(stage: str) -> None:
    body = STAGES[stage]
    missing = uncovered_code(body, REPO, [SRC])
    if missing:
        pytest.fail(f"dvc.yaml stage {stage!r} runs code that no dep covers, so `dvc repro` would call "
                    f"a stale result up to date after an edit to it; add to its deps (a file, or a "
                    f"folder that holds it):\n  - " + "\n  - ".join(missing), pytrace=False)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_script_is_a_dep(stage: str) -> None:
    body = STAGES[stage]
    scripts = stage_scripts(body.get("cmd", ""))
    assert scripts, f"stage {stage!r}: no `python <script>.py` in cmd {body.get('cmd')!r}"
    deps = code_deps(body.get("deps"))
    for s in scripts:
        assert covered(s, deps), f"stage {stage!r}: its script {s} is not listed in its deps {deps}"


def test_every_stage_is_checked() -> None:
    names = set(yaml.safe_load(DVC_YAML.read_text())["stages"])
    assert names and names == set(STAGES)


def test_closure_of_a_real_stage_holds_every_package_init_on_the_way() -> None:
    for script in sorted((REPO / "stages").glob("*.py")):
        files = code_closure(script, [SRC])
        assert script.resolve() in files
        assert (SRC / "fedpipe" / "__init__.py").resolve() in files, script.name
        for f in files:
            assert f.is_relative_to((REPO / "stages").resolve()) or f.is_relative_to(SRC.resolve()), f
            if f.is_relative_to(SRC.resolve()):
                for pkg in f.relative_to(SRC.resolve()).parents:
                    if pkg != Path("."):
                        assert (SRC / pkg / "__init__.py").resolve() in files, (script.name, f, pkg)


# --------------------------------------------------------------------------------------------------
# Unit tests of the walker and the checker on a package made for the purpose


def write(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """repo/{stages,src/pkg}: each stage script reaches one kind of import."""
    write(tmp_path, {
        "src/pkg/__init__.py": "",
        "src/pkg/top.py": "import os\n",
        "src/pkg/unused.py": "",
        "src/pkg/sub/__init__.py": "from .impl import thing\n",
        "src/pkg/sub/impl.py": "from ..top import os\nthing = 1\n",
        "src/pkg/sub/other.py": "from . import impl\n",
        "src/pkg/lazy/__init__.py": "",
        "src/pkg/lazy/heavy.py": "",
        "src/pkg/lazy/user.py": "def f():\n    from pkg.lazy.heavy import x\n    return x\n",
        "src/pkg/mods/__init__.py": "",
        "src/pkg/mods/alpha.py": "",
        "src/pkg/mods/beta.py": "",
        "stages/lazy.py": "import numpy\n\n\ndef main():\n    import pkg.lazy.user\n",
        "stages/rel.py": "from pkg.sub.other import impl\n",
        "stages/submod.py": "from pkg.mods import alpha\n",
        "stages/sibling.py": "from submod import x\n",
    })
    return tmp_path


def closure(toy: Path, script: str) -> set[str]:
    return {f.relative_to(toy.resolve()).as_posix()
            for f in code_closure(toy / "stages" / script, [toy / "src"])}


def test_walker_follows_a_lazy_import_inside_a_function(toy: Path) -> None:
    assert closure(toy, "lazy.py") == {
        "stages/lazy.py", "src/pkg/__init__.py", "src/pkg/lazy/__init__.py", "src/pkg/lazy/user.py",
        "src/pkg/lazy/heavy.py"}


def test_walker_follows_relative_imports_and_package_inits(toy: Path) -> None:
    assert closure(toy, "rel.py") == {
        "stages/rel.py", "src/pkg/__init__.py", "src/pkg/sub/__init__.py", "src/pkg/sub/other.py",
        "src/pkg/sub/impl.py", "src/pkg/top.py"}


def test_walker_follows_from_package_import_submodule(toy: Path) -> None:
    assert closure(toy, "submod.py") == {
        "stages/submod.py", "src/pkg/__init__.py", "src/pkg/mods/__init__.py", "src/pkg/mods/alpha.py"}


def test_walker_follows_a_sibling_stage_script(toy: Path) -> None:
    assert closure(toy, "sibling.py") == closure(toy, "submod.py") | {"stages/sibling.py"}


def test_walker_rejects_a_relative_import_above_the_top_package(tmp_path: Path) -> None:
    write(tmp_path, {"src/pkg/__init__.py": "", "src/pkg/bad.py": "from ... import x\n",
                     "stages/s.py": "import pkg.bad\n"})
    with pytest.raises(ImportError, match="beyond the top-level package"):
        code_closure(tmp_path / "stages/s.py", [tmp_path / "src"])


def test_checker_reports_each_uncovered_file_and_accepts_folders(toy: Path) -> None:
    roots = [toy / "src"]
    body = {"cmd": "python stages/rel.py ${item}",
            "deps": ["stages/rel.py", "src/pkg/sub", "data/${item}/x", {"src/pkg/top.py": {}}]}
    assert uncovered_code(body, toy, roots) == ["src/pkg/__init__.py"]
    body["deps"].append("src/pkg/")
    assert uncovered_code(body, toy, roots) == []
    # a file dep covers only itself; a dep that is a path prefix but not a folder covers nothing
    body = {"cmd": "python stages/lazy.py", "deps": ["stages/lazy.py", "src/pkg/__init__.py",
                                                     "src/pkg/lazy/user.py", "src/pkg/la"]}
    assert uncovered_code(body, toy, roots) == ["src/pkg/lazy/__init__.py", "src/pkg/lazy/heavy.py"]
    assert uncovered_code({"cmd": "python stages/lazy.py"}, toy, roots) == [
        "src/pkg/__init__.py", "src/pkg/lazy/__init__.py", "src/pkg/lazy/heavy.py",
        "src/pkg/lazy/user.py", "stages/lazy.py"]


def test_checker_flags_a_cmd_without_a_script(toy: Path) -> None:
    assert uncovered_code({"cmd": "echo hi", "deps": []}, toy, [toy / "src"])[0].startswith("<no ")
    assert "does not exist" in uncovered_code({"cmd": "python stages/nope.py"}, toy, [toy / "src"])[0]


def test_stage_bodies_and_scripts() -> None:
    dvc = {"stages": {
        "a": {"cmd": "python stages/a.py", "deps": ["stages/a.py"]},
        "b": {"foreach": [1, 2], "do": {"cmd": "python3 -u stages/b.py ${item}", "deps": []}},
        "c": {"matrix": {"x": [1]}, "cmd": ["mkdir -p out && python stages/c.py ${item.x}"], "deps": []},
        "d": {"cmd": "python -m fedpipe.launch stages/d.py", "deps": []},
        "e": {"cmd": "python -m other.module stages/e.py", "deps": []},
    }}
    bodies = stage_bodies(dvc)
    assert [stage_scripts(bodies[k]["cmd"]) for k in "abcde"] == [
        ["stages/a.py"], ["stages/b.py"], ["stages/c.py"], ["stages/d.py"], []]
    assert code_deps(["x", "y/${item}", {"z": {"cache": False}}]) == ["x", "z"]
