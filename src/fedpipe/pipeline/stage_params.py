"""The params each DVC stage reads, the ``params`` of its one plan file (``data/plan/stages/<stage>.json``,
written by :func:`fedpipe.pipeline.plan.write_stage_files` with the code it runs).

A stage must re-run when a param it reads changes. Listing the params in ``dvc.yaml`` (``params:
[dataset, model, fl, ...]``) makes DVC write every value of every listed section into the stage's
``dvc.lock`` entry: about 80 of a federate stage's 88 lines. DVC re-reads and re-writes the whole lock
after every stage it runs, so that cost grows with the study: at 300 stages with the params listed
the lock is 27,000 lines and one load and dump of it took 7.4 s on the 2-core machine, 4.4 s with
the params in one file (16,000 lines), 0.95 s for 300 entries of one dep and one out
(``benchmarks/lock_size.py``; the whole stage: ``benchmarks/stage_overhead.py``). So the way code is handled
(:mod:`fedpipe.pipeline.code`) is the way params are handled: the always-run ``plan`` stage writes,
for each stage, the values of the sections and keys :data:`STAGE_PARAMS` names (JSON, sorted keys)
into the stage's one file, which holds its code too. A training stage has one file per method
(``data/plan/stages/federate/<method>.json``: the shared sections and ``algorithms.<method>``), so a
change to one method's section re-runs that method's stages only, as before. A change to any value a
stage reads changes its file and re-runs it; an unchanged params.yaml leaves every file
byte-identical, so nothing re-runs.

``plan`` itself lists every top-level section as its params (:data:`PLAN_SECTIONS`), so ``dvc params
diff`` and ``dvc exp show`` still show every param that varies between experiments; its one lock
entry holds them once. ``dvc status`` sees a params edit once ``plan`` has run (``dvc repro`` runs it
first), as for code.

A key a stage lists that the params lack is written as ``null`` (DVC stopped at such a stage when
it listed the key itself).
"""

from __future__ import annotations

from typing import Any

from fedpipe.config.core import param_at
from fedpipe.pipeline.code import METHOD_LOOKUPS
from fedpipe.pipeline.code import PER_METHOD as METHOD_LISTS

METHOD_SECTION = "algorithms.{algorithm}"
"""The placeholder of a per-method stage's own method section."""

STAGE_PARAMS: dict[str, tuple[str, ...]] = {
    "partition": ("dataset", "partition"),
    "backbone": ("dataset", "model", "fl", "device", "accel"),
    "server_data": ("dataset",),
    "federate": ("dataset", "model", "fl", METHOD_SECTION, "device", "accel"),
    "evaluate": ("seed", "dataset", "model", "study"),
    "feature_extractor": ("seed", "dataset", "fid.extractor", "fid.inception_weights",
                          "fid.batch_size", "fid.classifier", "fid.classifier_epochs",
                          "fid.classifier_lr", "fid.classifier_batch_size", "device", "accel"),
    "warmup": ("dataset", "diffusion", "warmup", "device", "accel"),
    "generate": ("dataset", "diffusion", "warmup", "generate", "device", "accel"),
    "aux_quality": ("dataset", "diffusion", "generate", "fid", "device", "accel"),
    "federate_ddpm": ("dataset", "diffusion", "diffusion_fl", "fid", METHOD_SECTION, "device",
                      "accel"),
    "report": ("seed", "dataset", "partition", "study", "algorithms"),
}
"""The sections (``fl``) and single keys (``fid.extractor``) each stage reads. A stage that lists
single keys of a section reads no other key of it (``tests/test_dvc_params.py``)."""

PER_METHOD = {stage: lookups for stage, lookups in METHOD_LOOKUPS.items() if lookups in METHOD_LISTS}
"""The stages with one file per method, and the ``study`` list of their methods: those with
one code file per method (:data:`fedpipe.pipeline.code.METHOD_LOOKUPS`)."""

PLAN_SECTIONS = ("study", "algorithms", "seed", "dataset", "partition", "model", "fl", "device",
                 "accel", "diffusion", "warmup", "generate", "fid", "diffusion_fl")
"""The top-level sections the ``plan`` stage lists as its params in dvc.yaml: every section any
stage reads (tested), so that DVC shows every param."""


def stage_values(params: dict[str, Any], stage: str, method: str | None = None) -> dict[str, Any]:
    """{key: value} of what ``stage`` (for ``method``) reads: its stage file's ``params``."""
    keys = [k.format(algorithm=method) if k == METHOD_SECTION else k for k in STAGE_PARAMS[stage]]
    return {k: param_at(params, k) for k in keys}


def stage_params_docs(params: dict[str, Any], study: Any) -> dict[str, dict[str, Any]]:
    """Every stage's params for ``study`` (a ``StudyConfig``), by its stage file's path under
    :data:`fedpipe.cli.STAGE_FILES_DIR` without ``.json``: one per stage, one per method of a
    per-method stage."""
    docs: dict[str, dict[str, Any]] = {}
    for stage in STAGE_PARAMS:
        if stage in PER_METHOD:
            for m in dict.fromkeys(getattr(study, PER_METHOD[stage])):
                docs[f"{stage}/{m}"] = stage_values(params, stage, m)
        else:
            docs[stage] = stage_values(params, stage)
    return docs
