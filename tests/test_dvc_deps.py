"""Each DVC stage re-runs when any code it runs changes (docs/architecture.md, "One code file per stage").

Every stage but ``plan`` depends on ``data/plan/code/<stage>.json``, which the always-run ``plan``
stage writes with the MD5 of every file the stage's script imports (:mod:`fedpipe.pipeline.code`, a
static ``ast`` walk of the imports). ``plan`` itself lists its code as deps, and those must cover the
code it runs: the file itself or a folder that contains it. Otherwise an edit leaves ``dvc repro``
calling a stale result up to date. The walker is tested here on a package made for the purpose.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedpipe.io import md5_file, read_json
from fedpipe.pipeline.code import CODE_DIR, code_closure, stage_code, write_stage_code

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
    """Paths of the Python scripts that ``cmd`` runs (``python[3] [opts] path/x.py args``)."""
    scripts = []
    for line in [cmd] if isinstance(cmd, str) else cmd:
        for part in re.split(r"&&|\|\||;|\|", line):
            tokens = shlex.split(part)
            for i, tok in enumerate(tokens):
                if re.fullmatch(r"(\S*/)?python[0-9.]*", tok):
                    rest = [t for t in tokens[i + 1:] if not t.startswith("-")]
                    if rest and rest[0].endswith(".py"):
                        scripts.append(rest[0])
    return scripts


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
CODE_STAGES = sorted(set(STAGES) - {"plan"})


def test_plan_deps_cover_its_code() -> None:
    """``plan`` runs on every repro (``always_changed``) and lists its own code as deps."""
    assert STAGES["plan"].get("always_changed") is True
    missing = uncovered_code(STAGES["plan"], REPO, [SRC])
    if missing:
        pytest.fail("dvc.yaml stage 'plan' runs code that no dep covers; add to its deps (a file, or "
                    "a folder that holds it):\n  - " + "\n  - ".join(missing), pytrace=False)
    assert str(CODE_DIR) in [str(o).split("#")[0].strip() for o in STAGES["plan"]["outs"]]


@pytest.mark.parametrize("stage", CODE_STAGES)
def test_stage_depends_on_its_code_file_and_lists_no_code(stage: str) -> None:
    """Each other stage depends on the code file of its own script (which ``plan`` writes), and on no
    file of src/ or stages/ directly (each such dep adds its lines to the stage's dvc.lock entry)."""
    body = STAGES[stage]
    scripts = stage_scripts(body.get("cmd", ""))
    assert len(scripts) == 1, f"stage {stage!r}: cmd {body.get('cmd')!r} runs {scripts}"
    script = Path(scripts[0])
    assert script.parent == Path("stages") and (REPO / script).is_file(), script
    deps = code_deps(body.get("deps"))
    assert f"{CODE_DIR}/{script.stem}.json" in deps, (stage, deps)
    direct = [d for d in deps if d.startswith(("src/", "stages/"))]
    assert not direct, f"stage {stage!r} lists code as deps: {direct}"


@pytest.fixture(scope="module")
def repo_code(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, str]]]:
    """The code files that ``plan`` writes for this repository (stages/ copied into a scratch root)."""
    root = tmp_path_factory.mktemp("plan")
    (root / "stages").mkdir()
    for script in (REPO / "stages").glob("*.py"):
        (root / "stages" / script.name).write_bytes(script.read_bytes())
    return root, write_stage_code(root, SRC)


def test_code_file_of_every_stage_holds_its_whole_closure(repo_code) -> None:
    root, codes = repo_code
    assert set(codes) == {p.stem for p in (REPO / "stages").glob("*.py")}
    for stage, files in codes.items():
        on_disk = read_json(root / CODE_DIR / f"{stage}.json")
        assert on_disk == files
        closure = code_closure(REPO / "stages" / f"{stage}.py", [SRC])
        expect = {(f"stages/{f.name}" if f.parent == (REPO / "stages").resolve()
                   else f.relative_to(SRC.resolve()).as_posix()): md5_file(f) for f in closure}
        assert files == expect, stage
        assert f"stages/{stage}.py" in files and "fedpipe/__init__.py" in files


def test_every_stage_in_dvc_yaml_has_a_code_file(repo_code) -> None:
    _, codes = repo_code
    for stage in CODE_STAGES:
        assert Path(stage_scripts(STAGES[stage]["cmd"])[0]).stem in codes, stage


def test_src_has_no_dynamic_import() -> None:
    """The walk sees static imports only: no module of src/ imports by name at run time."""
    found = [p.relative_to(REPO).as_posix() for p in SRC.rglob("*.py")
             if re.search(r"\bimport_module\(|\b__import__\(", p.read_text())]
    assert not found, f"dynamic imports, invisible to fedpipe.pipeline.code: {found}"


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
        "d": {"cmd": "python -u stages/d.py", "deps": []},
        "e": {"cmd": "python -m other.module stages/e.py", "deps": []},
    }}
    bodies = stage_bodies(dvc)
    assert [stage_scripts(bodies[k]["cmd"]) for k in "abcde"] == [
        ["stages/a.py"], ["stages/b.py"], ["stages/c.py"], ["stages/d.py"], []]
    assert code_deps(["x", "y/${item}", {"z": {"cache": False}}]) == ["x", "z"]


def test_code_files_change_exactly_for_the_stages_that_import_an_edit(toy: Path) -> None:
    """An edit to a module re-writes the code file of each stage that imports it, and only those; an
    unchanged tree writes byte-identical files; a removed script's file goes."""
    src = toy / "src"
    write_stage_code(toy, src)
    folder = toy / CODE_DIR
    before = {p.name: p.read_bytes() for p in folder.glob("*.json")}
    assert set(before) == {"lazy.json", "rel.json", "submod.json", "sibling.json"}
    write_stage_code(toy, src)
    assert {p.name: p.read_bytes() for p in folder.glob("*.json")} == before
    (src / "pkg" / "mods" / "alpha.py").write_text("x = 2\n")
    (toy / "stages" / "lazy.py").unlink()
    write_stage_code(toy, src)
    after = {p.name: p.read_bytes() for p in folder.glob("*.json")}
    assert set(after) == {"rel.json", "submod.json", "sibling.json"}
    assert sorted(n for n in after if after[n] != before[n]) == ["sibling.json", "submod.json"]
    assert read_json(folder / "submod.json")["pkg/mods/alpha.py"] == md5_file(src / "pkg/mods/alpha.py")
    assert set(read_json(folder / "sibling.json")) == {
        "stages/sibling.py", "stages/submod.py", "pkg/__init__.py", "pkg/mods/__init__.py",
        "pkg/mods/alpha.py"}


def test_stage_code_names_scripts_and_package_files_relative(toy: Path) -> None:
    assert stage_code(toy / "stages" / "rel.py", toy / "src") == {
        f: md5_file((toy / "src" / f) if not f.startswith("stages/") else toy / f)
        for f in ["pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/impl.py", "pkg/sub/other.py",
                  "pkg/top.py", "stages/rel.py"]}
