"""Compose ``params.yaml`` from ``conf/`` with Hydra, exactly as ``dvc exp run`` does.

``python -m fedpipe.pipeline.compose [override ...]`` (``make params``) regenerates the committed
default ``params.yaml`` after an edit under ``conf/``; it uses DVC's own composition function so the
file is byte-identical to what ``dvc exp run`` would write. The composed params are checked before
they replace the file (:func:`check_composed`, the plan stage's checks): names that are not registry
names never reach ``params.yaml``, whose values DVC substitutes into stage names and paths. The tool
sits with the stages' library side, above the registries it checks against (:mod:`fedpipe.config`
holds the config sections only).

Run by hand, a composition that fails prints one line and exits with code 2, as a stage does
(:func:`fedpipe.cli.run_stage`): Hydra's errors and fedpipe's check of ``key=value`` overrides
(``hydra_plugins/fedpipe_overrides.py``) become a :class:`~fedpipe.errors.CompositionError`
(:func:`composition_error`): an unknown key names the closest keys, a group option with no file
(``study=clasification``) the closest files of ``conf/<group>/``.

``params.yaml`` is not rewritten while another DVC process runs in the repository
(:func:`workspace_busy`): its stages read the file, and would train with the new params under the
old run's name. Experiments side by side go through DVC's queue (``dvc exp run --queue -S ...``,
then ``dvc queue start``), each in a copy of its own.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from fedpipe.errors import CompositionError


def group_options(conf: Path, group: str) -> list[str]:
    """The options of config group ``group``: the YAML files of ``conf/<group>/`` (those whose name
    starts with ``_`` are fragments other files include, not options)."""
    folder = conf / group
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.iterdir()
                  if p.suffix in (".yaml", ".yml") and not p.name.startswith("_"))


def _first_line(text: str) -> str:
    return next((x.strip() for x in str(text).splitlines() if x.strip()), "")


def composition_error(e: BaseException, conf: Path) -> CompositionError | None:
    """The one line for a failed composition from ``conf``, or None for an error that is not a
    composition error (a bug keeps its traceback)."""
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    plugin = sys.modules.get("hydra_plugins.fedpipe_overrides")
    unknown_key = getattr(plugin, "UnknownKeyError", None)
    if unknown_key is not None and isinstance(e, unknown_key):
        return CompositionError(str(e))  # already fedpipe's line (did you mean ...?)
    if isinstance(e, MissingConfigException) and "/" in (e.missing_cfg_file or ""):
        group, _, option = e.missing_cfg_file.rpartition("/")
        options = group_options(conf, group)
        close = difflib.get_close_matches(option, options, n=3, cutoff=0.6)
        hint = (" (did you mean " + " or ".join(close) + "?)" if close
                else ": " + ", ".join(options) if options else " (the folder has none)")
        parent = re.match(r"In '([^']+)':", str(e))
        named = (f"; named in conf/{parent[1]}.yaml" if parent and parent[1] != "config" else "")
        allowed = f"a file of conf/{group}/{hint}{named}"
        return CompositionError(f"invalid config: {group}={option}; allowed: {allowed}", group,
                                option, allowed)
    if isinstance(e, OverrideParseException):
        return CompositionError(f"invalid config: {e.override} is not a Hydra override "
                                f"(key=value, group=option, +key=value, ~key): "
                                f"{_first_line(e.message)}")
    if isinstance(e, (HydraException, OmegaConfBaseException)):
        return CompositionError(f"invalid config: {_first_line(str(e))}")
    return None


def check_composed(params: dict[str, Any]) -> None:
    """The params file's sections are known ones, and the study holds registry names only: its
    algorithms, the ``algorithms`` sections' settings, its corruptions (ConfigError otherwise;
    :func:`fedpipe.pipeline.plan.check_study`)."""
    from fedpipe.config.core import check_sections
    from fedpipe.pipeline.plan import check_study

    check_sections(params)
    check_study(params)


def _dvc_command(pid: int) -> str | None:
    """The command line of process ``pid`` if it runs DVC (a pid of a dead run may be reused)."""
    try:
        argv = [x.decode(errors="replace") for x in
                Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if x]
    except OSError:
        return None
    return " ".join(argv) if any(Path(x).name == "dvc" for x in argv[:3]) else None


def dvc_runs(root: str | Path) -> list[tuple[int, str]]:
    """The DVC processes (pid, command) running in repository ``root``, other than this one, as
    DVC's own run files say: the workspace experiment's process file
    (``.dvc/tmp/exps/run/workspace/workspace.json``, there for the whole ``dvc exp run``) and the
    stage locks (``.dvc/tmp/rwlock``: the pid of each DVC process whose stage reads or writes a
    path). A pid that is gone, or no longer runs DVC, is left out. Linux (``/proc``) only."""
    import json

    dvc = Path(root) / ".dvc" / "tmp"
    pids: set[int] = set()
    try:
        pid = json.loads((dvc / "exps" / "run" / "workspace" / "workspace.json").read_text())["pid"]
        pids.add(int(pid))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        locks = json.loads((dvc / "rwlock").read_text())
    except (OSError, ValueError):
        locks = {}
    for kind in ("read", "write"):
        section = locks.get(kind) if isinstance(locks, dict) else None
        for held in (section or {}).values():
            for info in held if isinstance(held, list) else [held]:
                if isinstance(info, dict) and isinstance(info.get("pid"), int):
                    pids.add(info["pid"])
    pids.discard(os.getpid())
    return [(p, cmd) for p in sorted(pids) if (cmd := _dvc_command(p)) is not None]


def workspace_busy(root: str | Path) -> str | None:
    """The line refusing to write ``root``'s params.yaml while another DVC process runs there
    (:func:`dvc_runs`), else None. ``dvc exp run -S`` composes params.yaml before it takes any lock,
    so a second run started while the first one's stages run rewrites the file under them: the
    first experiment trains, and is recorded with, the second one's params (and one of them
    fails). Experiments side by side go through DVC's queue, each in a copy of its own."""
    runs = dvc_runs(root)
    if not runs:
        return None
    who = "; ".join(f"PID {pid}: {cmd}" for pid, cmd in runs)
    return (f"params.yaml not written: another DVC process ({who}) is running in "
            f"{Path(root).resolve()}, and its stages read params.yaml; wait for it to end, or run "
            "experiments side by side through DVC's queue (dvc exp run --queue -S ..., then "
            "dvc queue start)")


def compose_params(root: str | Path = ".", overrides: list[str] | None = None,
                   output: str = "params.yaml") -> Path:
    """Compose ``root/conf`` with ``overrides`` into ``root/output`` (atomically, checked first);
    a composition that fails is a :class:`~fedpipe.errors.CompositionError` and leaves the file
    as it was, and so is ``root``'s params.yaml while DVC runs there (:func:`workspace_busy`)."""
    from dvc.utils.hydra import compose_and_dump

    from fedpipe.config.core import load_params

    root = Path(root).resolve()
    out = root / output
    if out == root / "params.yaml":
        busy = workspace_busy(root)
        if busy:
            raise CompositionError(busy)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp.yaml", dir=out.parent)
    os.close(fd)
    try:
        try:
            compose_and_dump(Path(tmp), str(root / "conf"), None, "config",
                             str(root), list(overrides or []))  # DVC's plugins_path: hydra_plugins/
        except Exception as e:
            line = composition_error(e, root / "conf")
            if line is None:
                raise
            raise line from None
        check_composed(load_params(tmp))
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return out


if __name__ == "__main__":
    from fedpipe.cli import run_stage

    run_stage(lambda: print(compose_params(".", sys.argv[1:])))
