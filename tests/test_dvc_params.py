"""Each DVC stage re-runs when any param it reads changes, and a stage that lists single keys of a
section (``fid.extractor``, ``study.seeds``; DVC writes only those into its ``dvc.lock`` entry, and
re-runs it only when one of them changes) reads no other key of that section.

- :func:`test_the_feature_extractor_reads_only_the_fid_keys_it_lists`: the stage's work, run on a
  tiny classifier, reads only the ``fid`` fields its dvc.yaml entry lists (the validation before it,
  the same for every diffusion stage, reads the whole section and computes nothing).
- Not narrowed, and why: ``evaluate`` reads five of ``study``'s keys, but two of them
  (``corruptions``, ``severities``) are absent from most studies' composed params, and DVC stops at a
  stage whose listed key is missing; ``federate``, ``federate_ddpm``, ``warmup`` and ``backbone`` read
  every key of their sections.
- ``tests/test_config.py``: every listed key is in every study's composed params (DVC stops at a
  stage whose listed key is missing).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from fedpipe.config.diffusion import FIDConfig
from fedpipe.pipeline.stage_params import STAGE_PARAMS

REPO = Path(__file__).resolve().parents[1]
NARROWED = {  # stage -> section -> its config class
    "feature_extractor": {"fid": FIDConfig},
}


def stage_params(stage: str) -> list[str]:
    """What ``stage`` reads, as its params file lists it (fedpipe.pipeline.stage_params)."""
    return list(STAGE_PARAMS[stage])


def listed_keys(stage: str, section: str) -> set[str]:
    """The keys of ``section`` that ``stage`` lists one by one (empty if it lists the section)."""
    return {p.split(".", 1)[1] for p in stage_params(stage) if p.startswith(f"{section}.")}


def test_every_narrowed_section_is_listed_key_by_key_and_not_whole():
    for stage, sections in NARROWED.items():
        params = stage_params(stage)
        for section, cls in sections.items():
            keys = listed_keys(stage, section)
            assert section not in params and keys, (stage, section)
            fields = {f.name for f in dataclasses.fields(cls)}
            assert keys < fields, (stage, section, keys - fields)  # real fields, not all of them


class Reads:
    """``real``'s attributes, each one read recorded in ``seen``."""

    def __init__(self, real, seen: set[str]):
        self._real, self._seen = real, seen

    def __getattr__(self, name: str):
        self._seen.add(name)
        return getattr(self._real, name)


@pytest.mark.slow
def test_the_feature_extractor_reads_only_the_fid_keys_it_lists(tmp_path, monkeypatch):
    import torch

    import fedpipe.pipeline.feature_extractor as fe
    from fedpipe.pipeline.diffusion import diffusion_stage_config

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["fid"] = {**params["fid"], "classifier_epochs": 1}  # a second, not a minute
    params["device"] = "cpu"
    cfg = diffusion_stage_config(params, "feature_extractor")
    seen: set[str] = set()
    monkeypatch.setattr(fe, "check_diffusion_models", lambda *a: None)  # validation: reads all
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = fe.feature_extractor(dataclasses.replace(cfg, fid=Reads(cfg.fid, seen)),
                                   tmp_path / "fid", progress=False)
    finally:
        torch.set_num_threads(before)
    assert out["metrics"]["extractor"] == "classifier:lenet"
    assert seen >= {"classifier", "classifier_epochs", "batch_size", "extractor"}  # it records
    assert seen <= listed_keys("feature_extractor", "fid"), sorted(seen)
