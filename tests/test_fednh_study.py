"""FedNH's studies (paper presets and the smoke study compose and validate) and its claims module
(claims encoded per study, judged on hand-made seed values; the report section beside Tables 1 and
2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedpipe.claims import all_claims, judge_all
from fedpipe.claims import fednh as fc
from fedpipe.config.core import build
from fedpipe.config.fl import StudyConfig
from fedpipe.pipeline.partition import partition_stage_config

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("preset,clients,rounds", [("fednh_smoke", 20, 15), ("fednh_cifar10", 100, 200),
                                                   ("fednh_cifar100", 100, 200)])
def test_fednh_studies_compose_and_validate(tmp_path, preset, clients, rounds):
    from fedpipe.pipeline.common import train_config
    from fedpipe.pipeline.compose import compose_params

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
    others = set(study.algorithms) - {"fednh"}
    assert keys == ({"fednh/test_accuracy/fednh-gt-fedavg", "fednh/test_accuracy/fednh-ge-fedrod",
                     "fednh/pm_l_mean/fednh-gt-fedavg"}
                    | {f"fednh/pm_v_mean/fednh-gt-{m}" for m in others})
    # the paper's personalized baselines (§4.1) are all in every FedNH study, the smoke included
    assert {"fedrod", "ditto", "creff", "fedper", "fedrep", "fedbabu", "local"} <= others


def test_no_fednh_claims_in_a_study_without_fednh():
    assert fc.claims(StudyConfig(algorithms=["fedavg", "local"])) == []
    assert fc.report_section(StudyConfig(algorithms=["fedavg"]), {}) == []


def seeds(**per_algo):
    return {a: {str(s): dict(m) for s, m in enumerate(ms)} for a, ms in per_algo.items()}


def test_fednh_claims_judged_on_hand_values():
    study = StudyConfig(name="fednh_smoke", algorithms=["fedavg", "fednh", "fedrod", "local"])
    per_seed = seeds(
        fedavg=[{"test_accuracy": 0.70, "pm_v_mean": 0.60, "pm_l_mean": 0.80}] * 3,
        fednh=[{"test_accuracy": a, "pm_v_mean": v, "pm_l_mean": 0.79}
               for a, v in ((0.75, 0.65), (0.76, 0.66), (0.78, 0.68))],
        fedrod=[{"test_accuracy": a, "pm_v_mean": v, "pm_l_mean": 0.8}
                for a, v in ((0.77, 0.80), (0.78, 0.81), (0.79, 0.84))],
        local=[{"test_accuracy": None, "pm_v_mean": v, "pm_l_mean": 0.6} for v in (0.30, 0.32, 0.29)])
    claims = fc.claims(study)
    assert [c.text for c in claims] == [
        "FedNH GM > FedAvg GM", "FedNH GM on par with or above FedROD GM",
        "FedNH PM(V) > FedAvg PM(V)", "FedNH PM(V) > Local PM(V)", "FedNH PM(V) > FedROD PM(V)",
        "FedNH PM(L) > FedAvg PM(L)"]
    res = {r.claim.key: r for r in judge_all(claims, {"classification": per_seed})}
    assert res["fednh/test_accuracy/fednh-gt-fedavg"].status == "held"
    # GM 0.75/0.76/0.78 against FedROD 0.77/0.78/0.79: d = -0.02, -0.02, -0.01, margin 5% of 0.78
    on_par = res["fednh/test_accuracy/fednh-ge-fedrod"]
    assert on_par.threshold == pytest.approx(0.039) and on_par.mean_diff == pytest.approx(-1 / 60)
    assert on_par.status == "held"
    assert res["fednh/pm_v_mean/fednh-gt-local"].status == "held"
    assert res["fednh/pm_v_mean/fednh-gt-fedrod"].status == "contradicted"  # 0.66 < 0.82
    assert res["fednh/pm_l_mean/fednh-gt-fedavg"].status == "not shown"  # 0.79 < 0.80, SE = 0
    assert not any("local" in k and "test_accuracy" in k for k in res)  # Local has no GM claim


def test_report_section_prints_the_paper_columns_beside_ours():
    study = StudyConfig(name="fednh_cifar100", algorithms=["fednh", "local"])
    metrics = {"fednh": {"test_accuracy": 0.4, "test_accuracy_std": 0.01, "pm_v_mean": 0.3,
                         "pm_l_mean": 0.5, "pm_l_client_std": 0.04, "seeds": 3},
               "local": {"test_accuracy": 0.1, "pm_v_mean": 0.1, "pm_l_mean": 0.3, "seeds": 3}}
    text = "\n".join(fc.report_section(study, metrics))
    assert ("| fednh | 40.00 ± 1.00 | 30.00 | 50.00 | 4.00 | 41.34 | 38.25 | 55.21 | 43.19 | 36.88 "
            "| 45.46 | 3.91 |") in text
    assert "| local | — |" in text
