"""Skipping a stage the study does not use (see :mod:`fedpipe.pipeline.plan`, which decides).

A skipped stage still runs (a second or two): :func:`skip_if_unused` writes a placeholder for every
output ``dvc.yaml`` declares for it, marked so that a reader fails with one line
(:class:`fedpipe.errors.SkippedStageError`, raised by :func:`fedpipe.io.load_tensors`) instead of
reading an empty model. This module imports no algorithm or model code, so the gated stages' DVC deps
stay those of their own work.
"""

from __future__ import annotations

from pathlib import Path

from fedpipe.errors import InputError
from fedpipe.io import SKIPPED_KEY, read_json_input, save_tensors, write_csv, write_json, write_text

DIFFUSION_PLAN = Path("data/plan/diffusion.json")
BACKBONE_PLAN = Path("data/plan/backbone.json")
SERVER_DATA_PLAN = Path("data/plan/server_data.json")
SKIPPED_FILE = "SKIPPED.json"  # what a placeholder folder holds


def stage_outputs(stage: str, dvc_yaml: str | Path = "dvc.yaml",
                  item: dict[str, object] | None = None) -> list[str]:
    """Every path ``dvc.yaml`` declares as an output of ``stage`` (outs, metrics, plots); for a
    ``matrix`` stage, ``item`` gives the values that replace ``${item.<key>}``."""
    import yaml

    spec = yaml.safe_load(Path(dvc_yaml).read_text(encoding="utf-8"))["stages"][stage]
    paths: list[str] = []
    for section in ("outs", "metrics", "plots"):
        for entry in spec.get(section, []) or []:
            path = entry if isinstance(entry, str) else next(iter(entry))
            for key, value in (item or {}).items():
                path = path.replace(f"${{item.{key}}}", str(value))
            paths.append(path)
    return paths


def write_placeholder(path: str | Path, reason: str) -> None:
    """A placeholder for an output of a skipped stage, by its kind (suffix; no suffix is a folder)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        import json

        save_tensors(path, {}, metadata={SKIPPED_KEY: json.dumps(reason)})
    elif path.suffix == ".json":
        write_json(path, {"skipped": reason})
    elif path.suffix == ".csv":
        write_csv(path, ["skipped"], [])
    elif path.suffix == ".png":
        _placeholder_png(path, reason)
    elif path.suffix:
        write_text(path, f"skipped: {reason}\n")
    else:
        path.mkdir(parents=True, exist_ok=True)
        for old in path.iterdir():  # a folder out is replaced whole, as a run would
            if old.is_file():
                old.unlink()
        write_json(path / SKIPPED_FILE, {"skipped": reason})


def _placeholder_png(path: Path, reason: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedpipe.io import save_figure

    fig, ax = plt.subplots(figsize=(4, 1))
    ax.axis("off")
    ax.text(0.5, 0.5, f"skipped: {reason}", ha="center", va="center", wrap=True, fontsize=8)
    save_figure(path, fig, dpi=60)


DIFFUSION_REASON = "no diffusion-track method and no generated server data"


def skip_if_unused(stage: str, plan: str | Path = DIFFUSION_PLAN,
                   dvc_yaml: str | Path = "dvc.yaml", item: dict[str, object] | None = None,
                   why: str = DIFFUSION_REASON) -> bool:
    """If the plan says the study does not use ``stage``, write its placeholders and return True.
    ``item``: a ``matrix`` stage's values (``{"seed": 0}`` for ``backbone@0``); ``why``: the
    reason written into the placeholders.

    Without a plan file (the script run by hand, outside ``dvc repro``) the stage runs."""
    if not Path(plan).is_file() or not Path(dvc_yaml).is_file():  # run by hand: run as asked
        return False
    outputs = stage_outputs(stage, dvc_yaml, item)
    if item:
        stage = f"{stage}@{'-'.join(str(v) for v in item.values())}"
    decision = read_json_input(plan, "plan")
    if not isinstance(decision, dict) or not isinstance(decision.get("run", True), bool):
        raise InputError(plan, "not a plan file ({\"run\": true|false}; corrupt?)", "plan")
    if decision.get("run", True):
        for out in outputs:  # a folder that held a placeholder is the real output again
            if not Path(out).suffix:
                (Path(out) / SKIPPED_FILE).unlink(missing_ok=True)
        return False
    reason = f"stage {stage} is not used by this study ({why}; see {plan})"
    for out in outputs:
        write_placeholder(out, reason)
    print(f"{stage}: skipped, not used by this study ({plan})")
    return True
