"""The study plan: which of the pipeline's stages a study uses, so that the others are skipped.

DVC runs every stage of ``dvc.yaml``; a study that compares classification methods only (a paper's
smoke study) must not pay for the diffusion warm-up. The cheap ``plan`` stage reads ``study`` and
``algorithms`` and writes one small file per decision; the stages it gates depend on that file, not on
the study, so changing the study's methods re-runs them only when the decision changes (a new seed
adds its own replicate's stages, ``warmup@<seed>`` ...; the others stay cached).

- ``data/plan/diffusion.json`` = ``{"run": bool}``: whether the diffusion side (``feature_extractor``,
  ``warmup``, ``generate``, ``aux_quality``) is used. It is, when ``study.diffusion_algorithms`` is
  non-empty or a classification method of the study declares server data that the ``server_data``
  stage writes from the generated auxiliary set (``aux``, ``distill``; not ``holdout`` or ``public``,
  which come from real datasets).
- ``data/federate_ddpm/plan.json``: the diffusion track's algorithms and seeds. It keeps the folder
  that the ``report`` stage depends on in existence when the track has no runs (an empty DVC matrix).
- ``data/plan/stages/<stage>.json`` (``<stage>/<algorithm>.json`` for a training stage, one per
  method): the stage's one plan dep (:func:`write_stage_files`), ``{"code": ..., "params": ...}``:
  the code it runs, ``{file: md5}`` of every project file its script imports
  (:mod:`fedpipe.pipeline.code`; a training stage's is the stage's code and its method's), and the
  values of the params it reads (:mod:`fedpipe.pipeline.stage_params`). Each stage depends on its
  own file instead of listing code and params in dvc.yaml, which keeps ``dvc.lock`` small (DVC loads
  and dumps the whole lock after every stage it runs); the ``always_changed`` plan stage re-hashes
  the code on every run, so an edit re-runs exactly the stages that import the changed file or read
  the changed param, and an unchanged tree and params.yaml leave every file byte-identical.
  A federate stage's file also holds ``"inputs"``: the files its method's config names by path,
  with their MD5 (PerAda's ``backbone: <file>.safetensors``: ``{"backbone": {"path": ..., "md5":
  ...}}``; ``{}`` for a method that names none). A dvc.yaml dependency cannot depend on a param, so
  the plan stage hashes the named files on every run: a changed file changes that method's stage
  file and re-runs its federate stages (only those). A named file that does not exist is a
  ConfigError here, before any compute.
- ``data/plan/backbone.json`` = ``{"run": bool, "pretrain_rounds": int | null, "users": [...]}``:
  whether the
  ``backbone@<seed>`` stages pretrain PerAda's offline backbone (some algorithm of the study has
  ``backbone: fedavg``), and its one algorithm-side setting. All such algorithms share the one
  backbone per seed, so they must agree on ``pretrain_rounds`` (a ConfigError here otherwise); the
  rest of its settings (``model``, ``fl``, ``dataset``, the seed) are the stage's own params.

- ``data/plan/server_data.json`` = ``{kind: [algorithm, ...]}``: the server data the study's
  classification methods declare (``fedpipe.pipeline.server_inputs.needed_kinds``), which is all the
  ``server_data@<seed>`` stages read of ``study`` and ``algorithms``: they depend on this file, so an
  edit to another setting of a method (its learning rate) does not re-run them.
A skipped stage still runs (a second or two) and writes placeholders: :mod:`fedpipe.pipeline.skip`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedpipe.cli import STAGE_FILES_DIR
from fedpipe.config.core import ConfigError, build
from fedpipe.config.fl import StudyConfig
from fedpipe.io import md5_file, write_json, write_json_folder
from fedpipe.pipeline.code import stage_codes
from fedpipe.pipeline.skip import BACKBONE_PLAN, DIFFUSION_PLAN, SERVER_DATA_PLAN
from fedpipe.pipeline.stage_params import stage_params_docs

DDPM_TRACK_PLAN = Path("data/federate_ddpm/plan.json")
DIFFUSION_STAGES = ("feature_extractor", "warmup", "generate", "aux_quality")
FILE_FIELDS = ("backbone",)
"""Config fields that may name an input file (``<path>.safetensors``); read as federate does
(``fedpipe.pipeline.federate.backbone_of``)."""


def uses_diffusion(params: dict[str, Any], kinds: dict[str, list[str]] | None = None) -> bool:
    """Whether the study uses the diffusion side: a diffusion-track method, or generated server data
    (``kinds``: the study's ``needed_kinds``, when the caller has them already)."""
    from fedpipe.pipeline.server_inputs import GENERATED_KINDS, needed_kinds

    study = build(StudyConfig, params.get("study"), "study")
    kinds = needed_kinds(params) if kinds is None else kinds
    return bool(study.diffusion_algorithms) or bool(set(kinds) & set(GENERATED_KINDS))


def input_files(params: dict[str, Any], root: str | Path = ".") -> dict[str, dict[str, Any]]:
    """{algorithm: {field: {"path", "md5"}}} of the files that each classification algorithm of the
    study names in its config (paths relative to ``root``, the repo root for a stage)."""
    from fedpipe.algorithms import init_config

    study = build(StudyConfig, params.get("study"), "study")
    sections = params.get("algorithms") or {}
    out: dict[str, dict[str, Any]] = {}
    for name in study.algorithms:
        cfg = init_config(name, sections.get(name), "study.algorithms")
        out[name] = {}
        for key in FILE_FIELDS:
            path = getattr(cfg, key, None)
            if not (isinstance(path, str) and path.endswith(".safetensors")):
                continue
            if not (Path(root) / path).is_file():
                raise ConfigError(f"algorithms.{name}.{key}", path,
                                  "an existing .safetensors file (never downloaded)")
            out[name][key] = {"path": path, "md5": md5_file(Path(root) / path)}
    return out


def backbone_users(params: dict[str, Any]) -> tuple[list[str], int | None]:
    """The classification algorithms of the study whose backbone is ``fedavg`` (pretrained by the
    ``backbone`` stage) and their common ``pretrain_rounds`` (null = ``fl.rounds``); two users with
    different values are a ConfigError (one backbone per seed serves them all)."""
    from fedpipe.algorithms import algorithm_config, init_config

    study = build(StudyConfig, params.get("study"), "study")
    sections = params.get("algorithms") or {}
    users: list[str] = []
    rounds: int | None = None
    for name in study.algorithms:
        algorithm_config(name, sections.get(name), "study.algorithms")  # the whole section valid
        cfg = init_config(name, sections.get(name), "study.algorithms")
        if cfg.backbone != "fedavg":
            continue
        if users and cfg.pretrain_rounds != rounds:
            raise ConfigError(f"algorithms.{name}.pretrain_rounds", cfg.pretrain_rounds,
                              f"{rounds} (as algorithms.{users[0]}.pretrain_rounds: the algorithms "
                              "with backbone fedavg share one pretrained backbone per seed)")
        users.append(name)
        rounds = cfg.pretrain_rounds
    return users, rounds


def backbone_plan(params: dict[str, Any]) -> dict[str, Any]:
    """What ``data/plan/backbone.json`` holds: whether the backbone stage runs, for which algorithms,
    with their common ``pretrain_rounds`` (:func:`backbone_users`)."""
    users, rounds = backbone_users(params)
    return {"run": bool(users), "pretrain_rounds": rounds, "users": users}


def check_tracks(study: StudyConfig) -> None:
    """Each method of a track trains that track's task (``Strategy.tracks``): a classifier-only
    method (FedNH's prototype head, say) on the diffusion track is a ConfigError here, before the
    warm-up runs."""
    from fedpipe.algorithms import ALGORITHMS

    for key, track, names in (("study.algorithms", "classification", study.algorithms),
                              ("study.diffusion_algorithms", "diffusion",
                               study.diffusion_algorithms)):
        able = sorted(n for n in ALGORITHMS if track in ALGORITHMS[n].tracks)
        for i, name in enumerate(names):
            if track not in ALGORITHMS[name].tracks:
                raise ConfigError(f"{key}[{i}]", name,
                                  f"a method that trains the {track} task: {', '.join(able)}")


def check_study(params: dict[str, Any]) -> StudyConfig:
    """The study against the registries (ConfigError otherwise): its graph, both tracks' algorithm
    names and the ``algorithms`` sections (:mod:`fedpipe.algorithms`), its corruption names and
    severities (:mod:`fedpipe.data.corruptions`). Run by the plan stage before any stage of the
    study's methods runs, and by ``fedpipe.pipeline.compose`` before a composed params file is
    written."""
    from fedpipe.algorithms import check_algorithm_sections, check_algorithms

    study = build(StudyConfig, params.get("study"), "study")
    study.check_graph()
    check_algorithms(study.algorithms, "study.algorithms")
    check_algorithms(study.diffusion_algorithms, "study.diffusion_algorithms")
    check_tracks(study)
    sections = check_algorithm_sections(params.get("algorithms"))
    for name in (*study.algorithms, *study.diffusion_algorithms):
        if name not in sections:  # a hand-edited params.yaml: DVC would stop at the method's stage
            raise ConfigError(f"algorithms.{name}", None, "a section ({} for the method's defaults;"
                              " `make params` or `dvc exp run` adds it)")
    if study.corruptions:  # the corruptions (and their image libraries) load only when asked for
        from fedpipe.data.corruptions import check_corruption_names

        check_corruption_names(study.corruptions, study.severities, "study")
    return study


def check_every_section(params: dict[str, Any], study: StudyConfig) -> None:
    """Every params section the study's stages read, checked as they check it (types, ranges,
    what the methods need of the model and the data), so that a bad value (``-S fl.rounds=abc``)
    stops the pipeline here, in the first stage, before any data is loaded or any stage computes:
    the partition, each classification method's training config, and the diffusion track's
    sections when the study uses it."""
    from fedpipe.config import dataset_config
    from fedpipe.config.diffusion import check_diffusion_models
    from fedpipe.config.fl import fl_config
    from fedpipe.config.partition import partition_config
    from fedpipe.pipeline.common import train_config
    from fedpipe.pipeline.diffusion import diffusion_stage_config

    dataset = dataset_config(params.get("dataset"))
    partition_config(params.get("partition")).check_against(dataset)
    for name in study.algorithms:
        train_config(params, name)
    if study.diffusion_algorithms or study.diffusion_seeds:
        cfg = diffusion_stage_config(params, "warmup")
        fl_config(params.get("diffusion_fl"), "diffusion_fl")
        check_diffusion_models(cfg.dataset, cfg.diffusion, cfg.fid)


def write_plan(params: dict[str, Any], root: str | Path = ".") -> dict[str, Any]:
    """Write the plan files under ``root`` (validating ``study`` and ``algorithms``); return the plan."""
    from fedpipe.pipeline.server_inputs import needed_kinds

    root = Path(root)
    study = check_study(params)
    kinds = needed_kinds(params)  # what server_data@<seed> writes (validated: a ConfigError here)
    run = uses_diffusion(params, kinds)
    inputs = input_files(params, root)
    backbone = backbone_plan(params)
    write_json(root / DIFFUSION_PLAN, {"run": run})
    write_json(root / BACKBONE_PLAN, backbone)
    write_json(root / DDPM_TRACK_PLAN, {"algorithms": list(study.diffusion_algorithms),
                                        "seeds": list(study.seeds)})
    write_json(root / SERVER_DATA_PLAN, kinds)
    write_stage_files(root, params, study, inputs)
    return {"diffusion": run, "diffusion_algorithms": list(study.diffusion_algorithms),
            "inputs": inputs, "backbone": backbone["users"]}


def stage_files(root: Path, params: dict[str, Any], study: StudyConfig,
                inputs: dict[str, dict[str, Any]], src: Path | None = None
                ) -> dict[str, dict[str, Any]]:
    """Every stage's plan file, by its path under :data:`fedpipe.cli.STAGE_FILES_DIR` without
    ``.json``: ``{"code": {file: md5}, "params": {key: value}}``, and ``"inputs"`` for a federate
    stage (``inputs``: :func:`input_files`); no ``"code"`` for a stage whose script is not under
    ``root/stages`` (a test's copy of the pipeline: nothing to hold it to). One per script of
    ``stages/`` and per stage of :data:`fedpipe.pipeline.stage_params.STAGE_PARAMS`, one per method
    of a per-method stage."""
    from fedpipe.algorithms import ALGORITHMS

    codes = stage_codes(root, src, study, ALGORITHMS)
    values = stage_params_docs(params, study)
    files: dict[str, dict[str, Any]] = {}
    for key in sorted(set(codes) | set(values)):  # plan reads every section: no params of its own
        files[key] = {"params": values.get(key, {})}
        if key in codes:  # a stage with its script under root/stages
            files[key]["code"] = codes[key]
        stage, _, method = key.partition("/")
        if stage == "federate":
            files[key]["inputs"] = inputs[method]
    return files


def write_stage_files(root: Path, params: dict[str, Any], study: StudyConfig,
                      inputs: dict[str, dict[str, Any]], src: Path | None = None
                      ) -> dict[str, dict[str, Any]]:
    """Write :func:`stage_files` under ``root`` (the folder then holds exactly these files, and the
    same code and params give the same bytes: ``write_json`` sorts keys); return them."""
    files = stage_files(root, params, study, inputs, src)
    write_json_folder(root / STAGE_FILES_DIR, files)
    return files
