"""The study plan: which of the pipeline's stages a study uses, so that the others are skipped.

DVC runs every stage of ``dvc.yaml``; a study that compares classification methods only (a paper's
smoke study) must not pay for the diffusion warm-up. The cheap ``plan`` stage reads ``study`` and
``algorithms`` and writes one small file per decision; the stages it gates depend on that file, not on
the study, so changing the study's seeds or methods re-runs them only when the decision changes.

- ``data/plan/diffusion.json`` = ``{"run": bool}``: whether the diffusion side (``feature_extractor``,
  ``warmup``, ``generate``, ``aux_quality``) is used. It is, when ``study.diffusion_algorithms`` is
  non-empty or a classification method of the study declares server data that the ``server_data``
  stage writes from the generated auxiliary set (``aux``, ``distill``; not ``holdout`` or ``public``,
  which come from real datasets).
- ``data/federate_ddpm/plan.json``: the diffusion track's algorithms and seeds. It keeps the folder
  that the ``report`` stage depends on in existence when the track has no runs (an empty DVC matrix).

A skipped stage still runs (a second or two) and writes placeholders: :mod:`fedpipe.pipeline.skip`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedpipe.config.core import build
from fedpipe.config.fl import StudyConfig
from fedpipe.io import write_json
from fedpipe.pipeline.skip import DIFFUSION_PLAN

DDPM_TRACK_PLAN = Path("data/federate_ddpm/plan.json")
DIFFUSION_STAGES = ("feature_extractor", "warmup", "generate", "aux_quality")


def uses_diffusion(params: dict[str, Any]) -> bool:
    """Whether the study uses the diffusion side: a diffusion-track method, or generated server data."""
    from fedpipe.pipeline.server_data import GENERATED_KINDS, needed_kinds

    study = build(StudyConfig, params.get("study"), "study")
    return bool(study.diffusion_algorithms) or bool(set(needed_kinds(params)) & set(GENERATED_KINDS))


def write_plan(params: dict[str, Any], root: str | Path = ".") -> dict[str, Any]:
    """Write the plan files under ``root`` (validating ``study`` and ``algorithms``); return the plan."""
    root = Path(root)
    study = build(StudyConfig, params.get("study"), "study")
    run = uses_diffusion(params)
    write_json(root / DIFFUSION_PLAN, {"run": run})
    write_json(root / DDPM_TRACK_PLAN, {"algorithms": list(study.diffusion_algorithms),
                                        "seeds": list(study.seeds)})
    return {"diffusion": run, "diffusion_algorithms": list(study.diffusion_algorithms)}
