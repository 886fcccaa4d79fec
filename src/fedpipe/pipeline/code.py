"""The code each DVC stage runs, the ``code`` of its one plan file (``data/plan/stages/<stage>.json``,
written by :func:`fedpipe.pipeline.plan.write_stage_files` with the params it reads).

A stage's result must be re-computed when any code it runs changes (docs/architecture.md). Listing that
code as DVC deps (about twenty files and folders of ``src/`` per stage) made every stage's entry in
``dvc.lock`` about 180 lines, and DVC re-reads and re-writes the whole lock file after every stage it
runs: in an eight-replicate smoke of about a hundred stages, the lock file grew past 20,000 lines and
its handling took more of the wall time than the training (docs/architecture.md, "One code file
per stage"). Instead, the always-run ``plan`` stage walks each stage script's imports (:func:`code_closure`)
and writes ``{file: md5}`` for every file of the project it reaches; the stage depends on that one
file. An edit to any file a stage imports changes its json and re-runs it (and only the stages that
import the file); an unchanged tree leaves every json byte-identical, so nothing re-runs.

The walk is static (``ast``) and conservative: absolute and relative imports anywhere in a module
(imports inside functions run too), ``from pkg import name`` where ``name`` is a submodule, the
``__init__.py`` of every package on the way, and sibling scripts of ``stages/`` (a script's folder is
``sys.path[0]``). An import under ``if TYPE_CHECKING:`` or in an ``except ImportError:`` branch counts
as run. Only files under the search roots are followed (third-party imports are not).

The one dynamic import is the method registry's (:mod:`fedpipe.algorithms.registry`): a method's
module loads when a stage looks the method up, and the walk cannot see which. :data:`METHOD_LOOKUPS`
says, per stage, which methods it looks up, and their modules (with their own imports) join its code:
``federate@<algorithm>-<seed>`` depends on ``data/plan/stages/federate/<algorithm>.json``, whose code
is the stage's plus that one method's, so an edit to one method re-runs that method's stages (and the stages
that read their outputs) and nothing else. :func:`fedpipe.cli.check_loaded_code` makes this a
guarantee: at the end of a stage run under DVC, every project file the process loaded must be in the
stage file's code, or the stage fails (``tests/test_dvc_deps.py`` also checks that no other dynamic
import exists). The file's place and name (:data:`fedpipe.cli.STAGE_FILES_DIR`,
:func:`fedpipe.cli.stage_file`) are the stage runner's, which reads them; this module computes the code.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fedpipe.cli import STAGES_DIR, package_root
from fedpipe.io import md5_file

METHOD_LOOKUPS: dict[str, str | tuple[str, ...]] = {
    "federate": "algorithms",  # one stage file per method of study.algorithms: its own
    "federate_ddpm": "diffusion_algorithms",  # the same for the diffusion track's methods
    "evaluate": "study",  # every classification method of the study (a global model or not)
    "backbone": ("fedavg",),  # PerAda's backbone: the plain model trained by FedAvg
    "plan": "all",  # validates every algorithms section
}
"""Which registered methods each stage looks up at run time: a ``study`` key (``algorithms``,
``diffusion_algorithms``: :data:`PER_METHOD`) gives one stage file per method
(``<stage>/<method>.json``); ``"study"`` adds every method of ``study.algorithms`` to the stage's one
file, ``"all"`` every registered method; a tuple names the methods. A stage not listed looks up none
(:func:`fedpipe.cli.check_loaded_code` holds every stage to this)."""
PER_METHOD = ("algorithms", "diffusion_algorithms")


def module_file(name: str, roots: Sequence[Path]) -> Path | None:
    """The file of module ``name`` (``a/b.py`` or ``a/b/__init__.py``) in the first root that has it."""
    return _module_file(name, tuple(roots))


@functools.cache
def _module_file(name: str, roots: tuple[Path, ...]) -> Path | None:
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
    return set(_imported_names(path, name, path.stat().st_mtime_ns))


@functools.cache
def _imported_names(path: Path, name: str, mtime_ns: int) -> frozenset[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _statements(tree.body):
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
    return frozenset(out)


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement in ``body`` and, recursively, in the bodies of its compound statements (an
    import is a statement: the expressions in between need no visit)."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, field, ()) or ():
                yield from _statements([child] if isinstance(child, ast.stmt) else child.body)


def with_parents(name: str) -> list[str]:
    """``a.b.c`` -> ``[a, a.b, a.b.c]``: importing a module runs its packages' ``__init__`` first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def code_closure(script: Path, roots: Sequence[Path]) -> set[Path]:
    """``script`` and every file under ``roots`` that running it imports, transitively.

    ``script``'s folder is searched first (it is ``sys.path[0]`` when run as a script), then ``roots``.
    """
    script = script.resolve()
    search = (script.parent, *(r.resolve() for r in roots))
    seen: set[Path] = set()
    todo: list[tuple[Path, str]] = [(script, "__main__")]
    while todo:
        path, name = todo.pop()
        if path not in seen:
            seen.add(path)
            todo.extend(c for c in _children(path, name, search) if c[0] not in seen)
    return seen


@functools.cache
def _children(path: Path, name: str, search: tuple[Path, ...]) -> tuple[tuple[Path, str], ...]:
    """The (file, module name) pairs that importing ``path`` (module ``name``) imports directly, the
    packages on the way included; ``search`` holds resolved folders, so its files need no resolve."""
    out = {}
    for imported in imported_names(path, name):
        for mod in with_parents(imported):
            f = module_file(mod, search)
            if f is not None and f not in out:
                out[f] = module_name(f, search)
    return tuple(out.items())


def stage_code(script: Path, src: Path | None = None) -> dict[str, str]:
    """``{file: md5}`` of the code that running ``script`` imports: the stage scripts as
    ``stages/<name>.py``, the package's files relative to ``src`` (``fedpipe/fl/engine.py``), sorted."""
    src = (src or package_root()).resolve()
    stages = script.resolve().parent
    out = {}
    for f in code_closure(script, [src]):
        rel = (Path(STAGES_DIR.name) / f.relative_to(stages) if f.is_relative_to(stages)
               else f.relative_to(src))
        out[rel.as_posix()] = md5_file(f)
    return dict(sorted(out.items()))


def module_code(module: Path, src: Path | None = None) -> dict[str, str]:
    """``{file: md5}`` of the package file ``module`` and what it imports (named as by
    :func:`stage_code`)."""
    src = (src or package_root()).resolve()
    return {f.relative_to(src).as_posix(): md5_file(f) for f in code_closure(module, [src])}


def stage_codes(root: Path, src: Path | None, study: Any | None,
                methods: Any | None = None) -> dict[str, dict[str, str]]:
    """``{relative json path (no suffix): {file: md5}}`` for every stage script under ``root``: one
    file per stage, or per (stage, method) for the stages of :data:`METHOD_LOOKUPS` that run one
    method (``study``: the StudyConfig whose methods they run, None for no methods; ``methods``: the
    method registry, whose ``module_file`` gives a method's module without importing it)."""
    def method_code(name: str) -> dict[str, str]:
        return module_code(methods.module_file(name), src)

    out: dict[str, dict[str, str]] = {}
    for script in sorted((root / STAGES_DIR).glob("*.py")):
        code = stage_code(script, src)
        lookups = METHOD_LOOKUPS.get(script.stem, ())
        if lookups in PER_METHOD:
            for name in (getattr(study, lookups) if study is not None else ()):
                out[f"{script.stem}/{name}"] = dict(sorted({**code, **method_code(name)}.items()))
            continue
        if lookups == "all":
            names = tuple(methods or ())
        elif lookups == "study":
            names = tuple(study.algorithms) if study is not None else ()
        else:
            names = lookups
        for name in names:
            code |= method_code(name)
        out[script.stem] = dict(sorted(code.items()))
    return out
