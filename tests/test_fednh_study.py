"""FedNH's studies (paper presets and the smoke study compose and validate) and its claims module
(claims encoded per study, the GM-vs-own-PM(L) arms, judged on hand-made seed values; the report
section beside Tables 1 and 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedpipe.claims import all_claims, judge_all
from fedpipe.claims import fednh as fc
from fedpipe.config import partition_stage_config
from fedpipe.config.core import build
from fedpipe.config.fl import StudyConfig

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("preset,clients,rounds", [("fednh_smoke", 20, 15), ("fednh_cifar10", 100, 200),
                                                   ("fednh_cifar100", 100, 200)])
def test_fednh_studies_compose_and_validate(tmp_path, preset, clients, rounds):
    from fedpipe.config.compose import compose_params
    from fedpipe.pipeline.common import train_config

    out = compose_params(REPO, [f"study={preset}"], output=str(tmp_path / "params.yaml"))
    params = yaml.safe_load(out.read_text())
    part = partition_stage_config(params)
    assert part.partition.scheme == "dirichlet" and part.partition.alpha == 0.3
    assert part.partition.num_clients == clients
    study = build(StudyConfig, params["study"], "study")
    assert study.diffusion_algorithms == [] and len(study.seeds) >= 3
    for algo in study.algorithms:
        cfg = train_config(params, algo)
        assert cfg.model.name == "cnn_fednh" and cfg.fl.rounds == rounds
        assert cfg.fl.aggregation == "uniform" and cfg.fl.local.grad_clip == 10.0
    assert train_config(params, "fedavg").algo_cfg.keep_local_model
    if preset != "fednh_smoke":
        assert part.dataset.name == preset.removeprefix("fednh_")
        assert cfg.fl.participation == 0.1 and cfg.fl.local.lr == 0.01 and cfg.fl.local.epochs == 5
    keys = {c.key for c in all_claims(study)}
    assert {"fednh/test_accuracy/fednh-gt-fedavg", "fednh/pm_l_mean/fednh-gt-fedavg",
            "fednh/test_accuracy/fedrep-lt-fedrep_pm_l", "fednh/pm_v_mean/local-lt-fednh"} <= keys


def test_no_fednh_claims_in_a_study_without_fednh():
    assert fc.claims(StudyConfig(algorithms=["fedavg", "local"])) == []
    assert fc.report_section(StudyConfig(algorithms=["fedavg"]), {}) == []


def seeds(**per_algo):
    return {a: {str(s): dict(m) for s, m in enumerate(ms)} for a, ms in per_algo.items()}


def test_fednh_claims_judged_on_hand_values():
    study = StudyConfig(name="fednh_smoke", algorithms=["fedavg", "fednh", "fedrep", "local"])
    per_seed = seeds(
        fedavg=[{"test_accuracy": 0.70, "pm_v_mean": 0.60, "pm_l_mean": 0.80}] * 3,
        fednh=[{"test_accuracy": a, "pm_v_mean": 0.65, "pm_l_mean": 0.79} for a in (0.75, 0.76, 0.78)],
        fedrep=[{"test_accuracy": 0.2, "pm_v_mean": 0.5, "pm_l_mean": pm} for pm in (0.7, 0.72, 0.74)],
        local=[{"test_accuracy": 0.1, "pm_v_mean": v, "pm_l_mean": 0.6} for v in (0.30, 0.32, 0.29)])
    tracks = {"classification": fc.with_pm_arms(per_seed)}
    assert tracks["classification"]["fedrep_pm_l"]["1"] == {"test_accuracy": 0.72}
    res = {r.claim.key: r for r in judge_all(fc.claims(study), tracks)}
    assert res["fednh/test_accuracy/fednh-gt-fedavg"].status == "held"
    assert res["fednh/pm_l_mean/fednh-gt-fedavg"].status == "not shown"  # 0.79 < 0.80, SE = 0
    gap = res["fednh/test_accuracy/fedrep-lt-fedrep_pm_l"]
    assert gap.status == "held" and gap.mean_diff == pytest.approx(0.52)
    assert res["fednh/pm_v_mean/local-lt-fedavg"].status == "held"
    assert res["fednh/pm_v_mean/fednh-gt-fedavg"].status == "not shown"  # 0.65 vs 0.60, SE = 0
    assert "fednh/pm_v_mean/local-lt-fedproto" not in res  # the paper has FedProto below Local
    assert "fednh/pm_v_mean/local-lt-fedrep" not in res  # and FedRep, on CIFAR-100 Dir(0.3)


def test_report_section_prints_the_paper_columns_beside_ours():
    study = StudyConfig(name="fednh_cifar100", algorithms=["fednh", "local"])
    metrics = {"fednh": {"test_accuracy": 0.4, "test_accuracy_std": 0.01, "pm_v_mean": 0.3,
                         "pm_l_mean": 0.5, "pm_l_client_std": 0.04, "seeds": 3},
               "local": {"test_accuracy": 0.1, "pm_v_mean": 0.1, "pm_l_mean": 0.3, "seeds": 3}}
    text = "\n".join(fc.report_section(study, metrics))
    assert ("| fednh | 40.00 ± 1.00 | 30.00 | 50.00 | 4.00 | 41.34 | 38.25 | 55.21 | 43.19 | 36.88 "
            "| 45.46 | 3.91 |") in text
    assert "| local | — |" in text
