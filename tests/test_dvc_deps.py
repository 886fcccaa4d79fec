"""Each DVC stage re-runs when any code it runs changes (docs/architecture.md, "One code file per stage").

Every stage but ``plan`` depends on ``data/plan/stages/<stage>.json``, whose ``code`` the always-run
``plan`` stage writes with the MD5 of every file the stage's script imports (:mod:`fedpipe.pipeline.code`, a
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

from fedpipe.algorithms import ALGORITHMS
from fedpipe.cli import STAGE_FILES_DIR, check_loaded_code, stage_file
from fedpipe.config import load_params
from fedpipe.config.core import build
from fedpipe.config.fl import StudyConfig
from fedpipe.io import md5_file, read_json
from fedpipe.pipeline.code import METHOD_LOOKUPS, code_closure, stage_code, stage_codes
from fedpipe.pipeline.plan import write_stage_files

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
    assert str(STAGE_FILES_DIR) in [str(o).split("#")[0].strip() for o in STAGES["plan"]["outs"]]


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
    per_method = isinstance(METHOD_LOOKUPS.get(script.stem), str) and \
        METHOD_LOOKUPS[script.stem] != "study"
    if per_method:  # templated: the file of its own method
        every = [str(d) for d in body.get("deps")]
        assert f"{STAGE_FILES_DIR}/{script.stem}/${{item.algorithm}}.json" in every, (stage, every)
    else:
        assert f"{STAGE_FILES_DIR}/{script.stem}.json" in deps, (stage, deps)
    direct = [d for d in deps if d.startswith(("src/", "stages/"))]
    assert not direct, f"stage {stage!r} lists code as deps: {direct}"


STUDY = build(StudyConfig, {"algorithms": ["fedavg", "fedprox", "fednh"],
                            "diffusion_algorithms": ["fedavg", "fedddpm"], "seeds": [0]}, "study")


@pytest.fixture(scope="module")
def repo_code(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, str]]]:
    """The code files that ``plan`` writes for this repository and a study of three methods
    (stages/ copied into a scratch root)."""
    root = tmp_path_factory.mktemp("plan")
    (root / "stages").mkdir()
    for script in (REPO / "stages").glob("*.py"):
        (root / "stages" / script.name).write_bytes(script.read_bytes())
    return root, write_codes(root, STUDY)


def write_codes(root: Path, study: StudyConfig) -> dict[str, dict[str, str]]:
    """The plan's stage files for ``study`` and this repository's params, written under ``root``;
    their code by file."""
    files = write_stage_files(root, load_params(REPO / "params.yaml"), study,
                              {a: {} for a in study.algorithms}, SRC)
    return {rel: f["code"] for rel, f in files.items()}


def closure_md5(*files: Path) -> dict[str, str]:
    out = {}
    for file in files:
        for f in code_closure(file, [SRC]):
            rel = (f"stages/{f.name}" if f.parent == (REPO / "stages").resolve()
                   else f.relative_to(SRC.resolve()).as_posix())
            out[rel] = md5_file(f)
    return out


def test_code_file_of_every_stage_holds_its_whole_closure_and_its_methods(repo_code) -> None:
    """A stage's file: its script's closure, plus the modules of the methods it looks up; a training
    stage's file per method names that method's module and no other method's."""
    root, codes = repo_code
    per_method = {"federate": STUDY.algorithms, "federate_ddpm": STUDY.diffusion_algorithms}
    expected = {p.stem for p in (REPO / "stages").glob("*.py") if p.stem not in per_method}
    expected |= {f"{s}/{m}" for s, ms in per_method.items() for m in ms}
    assert set(codes) == expected
    for rel, files in codes.items():
        assert read_json(root / STAGE_FILES_DIR / f"{rel}.json")["code"] == files
        stage, _, method = rel.partition("/")
        script = REPO / "stages" / f"{stage}.py"
        lookups = METHOD_LOOKUPS.get(stage, ())
        methods = [method] if method else (list(STUDY.algorithms) if lookups == "study"
                                           else list(ALGORITHMS) if lookups == "all"
                                           else list(lookups))
        assert files == closure_md5(script, *(ALGORITHMS.module_file(m) for m in methods)), rel
        assert f"stages/{stage}.py" in files and "fedpipe/__init__.py" in files
        named = {f for f in files if f.startswith("fedpipe/algorithms/")} - {
            "fedpipe/algorithms/__init__.py", "fedpipe/algorithms/registry.py"}
        if method:
            assert f"fedpipe/algorithms/{ALGORITHMS.module_file(method).name}" in named, rel
            others = {f"fedpipe/algorithms/{ALGORITHMS.module_file(m).name}" for m in ALGORITHMS
                      if ALGORITHMS.module_file(m) != ALGORITHMS.module_file(method)}
            # a method's module may import another's (cluster2 builds on fedprox): only those
            imported = {f for f in closure_md5(ALGORITHMS.module_file(method))}
            assert not (named & others) - imported, rel
    assert "fedpipe/algorithms/fednh.py" not in codes["federate/fedavg"]
    assert "fedpipe/algorithms/fednh.py" not in codes["backbone"]


def test_a_study_change_removes_the_stale_method_files(repo_code, tmp_path) -> None:
    root, _ = repo_code
    smaller = build(StudyConfig, {"algorithms": ["fedavg"], "diffusion_algorithms": [],
                                  "seeds": [0]}, "study")
    codes = write_codes(root, smaller)
    on_disk = {p.relative_to(root / STAGE_FILES_DIR).with_suffix("").as_posix()
               for p in (root / STAGE_FILES_DIR).rglob("*.json")}
    assert on_disk == set(codes) and "federate/fedprox" not in on_disk
    assert not (root / STAGE_FILES_DIR / "federate_ddpm").exists()
    write_codes(root, STUDY)  # back, for the other tests


def test_stage_file_names_the_method_file_of_a_training_stage(repo_code) -> None:
    root, _ = repo_code
    d = root / STAGE_FILES_DIR
    assert stage_file("federate@fedprox-3", root) == d / "federate/fedprox.json"
    assert stage_file("federate_ddpm@fedddpm-0", root) == d / "federate_ddpm/fedddpm.json"
    assert stage_file("partition@3", root) == d / "partition.json"
    assert stage_file("evaluate", root) == d / "evaluate.json"


def test_a_stage_that_loaded_a_method_its_file_does_not_name_is_caught(repo_code) -> None:
    """The guard of ``fedpipe.cli.run_stage``: this test process has loaded every method, so against
    the code file of federate@fedavg the other methods' modules are reported (and fedavg's is not)."""
    root, _ = repo_code
    for name in ALGORITHMS:
        ALGORITHMS[name]
    missing = check_loaded_code("federate@fedavg-0", root)
    assert "fedpipe/algorithms/fednh.py" in missing and "fedpipe/algorithms/fedprox.py" in missing
    assert "fedpipe/algorithms/fedavg.py" not in missing
    assert check_loaded_code("nostage@1", root) == []  # no stage file: nothing to hold it to
    # a stage file without code (the plan ran where the stage has no script): nothing either
    (root / STAGE_FILES_DIR / "noscript.json").write_text('{"params": {}}')
    assert check_loaded_code("noscript@1", root) == []
    (root / STAGE_FILES_DIR / "noscript.json").unlink()


def test_every_stage_in_dvc_yaml_has_a_code_file(repo_code) -> None:
    _, codes = repo_code
    for stage in CODE_STAGES:
        script = Path(stage_scripts(STAGES[stage]["cmd"])[0]).stem
        assert script in codes or any(c.startswith(f"{script}/") for c in codes), stage


def test_src_has_no_dynamic_import_but_the_registry() -> None:
    """The walk sees static imports only: no module of src/ imports by name at run time, except the
    method registry, whose lookups METHOD_LOOKUPS declares (and the stage guard checks)."""
    found = [p.relative_to(REPO).as_posix() for p in SRC.rglob("*.py")
             if re.search(r"\bimport_module\(|\b__import__\(", p.read_text())]
    assert found == ["src/fedpipe/algorithms/registry.py"], \
        f"dynamic imports, invisible to fedpipe.pipeline.code: {found}"


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
    """An edit to a module changes the code of each stage that imports it, and only those; an
    unchanged tree gives the same code; a removed script's stage goes."""
    src = toy / "src"
    before = stage_codes(toy, src, None)
    assert set(before) == {"lazy", "rel", "submod", "sibling"}
    assert stage_codes(toy, src, None) == before
    (src / "pkg" / "mods" / "alpha.py").write_text("x = 2\n")
    (toy / "stages" / "lazy.py").unlink()
    after = stage_codes(toy, src, None)
    assert set(after) == {"rel", "submod", "sibling"}
    assert sorted(n for n in after if after[n] != before[n]) == ["sibling", "submod"]
    assert after["submod"]["pkg/mods/alpha.py"] == md5_file(src / "pkg/mods/alpha.py")
    assert set(after["sibling"]) == {
        "stages/sibling.py", "stages/submod.py", "pkg/__init__.py", "pkg/mods/__init__.py",
        "pkg/mods/alpha.py"}


def test_stage_code_names_scripts_and_package_files_relative(toy: Path) -> None:
    assert stage_code(toy / "stages" / "rel.py", toy / "src") == {
        f: md5_file((toy / "src" / f) if not f.startswith("stages/") else toy / f)
        for f in ["pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/impl.py", "pkg/sub/other.py",
                  "pkg/top.py", "stages/rel.py"]}


def test_no_stage_module_imports_another_stage_module() -> None:
    """A stage's script imports its own module of fedpipe.pipeline only, and no such module imports
    another stage's: what stages share lives in modules of its own (outputs, aux, fid_tools,
    server_inputs, diffusion, inputs, common), so an edit to one stage's code re-runs that stage."""
    from fedpipe.pipeline.code import imported_names

    stages = {p.stem for p in (REPO / "stages").glob("*.py")}
    own = {f"fedpipe.pipeline.{s}" for s in stages}
    crossing = []
    for s in sorted(stages):
        for path, name in ((REPO / "stages" / f"{s}.py", "__main__"),
                           (SRC / "fedpipe/pipeline" / f"{s}.py", f"fedpipe.pipeline.{s}")):
            if path.is_file():
                crossing += [f"{path.relative_to(REPO)} -> {n}" for n in imported_names(path, name)
                             if n in own - {f"fedpipe.pipeline.{s}"}]
    assert not crossing, crossing
