"""Sequential mode (fedpipe.sequential, docs/claims.md "Sequential mode"): the spending boundaries
against published values, the error rate over all looks and claims by simulation (no real effect: a
paper reads any claim held at most 5% of the time), the power at the documented effect sizes, the
adapter to claims.json, the command's checks of its input; under DVC (slow): the looks of a small
stand-in pipeline, each running only its new replicates' stages."""

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from fakes import STAND_IN_OUTPUTS
from scipy import stats

import fedpipe.sequential as sq
from fedpipe import claims

REPO = Path(__file__).resolve().parents[1]
LOOKS = (5, 8, 11, 14)


def t_pvalues(d: np.ndarray, looks=LOOKS, z: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """[..., looks, claims] one-sided p-values of "mean > 0" and of "mean < 0" from per-replicate
    differences ``d`` [..., claims, replicates], by the claims module's paired t test (or the z test
    with the SD known to be 1)."""
    p, po = [], []
    for n in looks:
        mean, se, df = claims.paired_stats(d[..., :n])
        if z:
            a = stats.norm.sf(mean * math.sqrt(n))
            p.append(a)
            po.append(1 - a)
        else:
            a, b = claims.directional_p(mean, se, df)
            p.append(a)
            po.append(b)
    return np.stack(p, axis=-2), np.stack(po, axis=-2)


def test_boundaries_match_the_published_obrien_fleming_type_values():
    # Lan-DeMets O'Brien-Fleming-type spending, 4 equally spaced looks, one-sided 0.025 (gsDesign's
    # sfLDOF; Jennison & Turnbull 2000, Table 7.6's design): 4.333, 2.963, 2.359, 2.014
    assert sq.z_boundaries((0.25, 0.5, 0.75, 1.0), 0.025) == pytest.approx(
        (4.3326, 2.9631, 2.3590, 2.0141), abs=2e-4)
    # one look is the fixed test
    assert sq.z_boundaries((1.0,), 0.05) == pytest.approx((stats.norm.isf(0.05),))
    assert float(sq.obf_spending(1.0, 0.05)) == pytest.approx(0.05)
    # the z boundaries spend exactly the level under no effect (the analytic crossing probability)
    d = sq.Design(LOOKS)
    assert sq.power(0.0, d) == pytest.approx(d.calibrated(0.05), rel=1e-6)


def test_boundaries_fall_as_the_level_rises():
    """Sequential Holm's error bound needs each look's boundary to be monotone in the level: a claim
    that crosses at alpha / m crosses at alpha / (m - 1)."""
    table = sq.Design(LOOKS).nominal_table(12)
    assert np.all(np.diff(table[0], axis=0) < 0)  # m = 1..12: the nominal level falls with m
    assert np.all(table[1] < table[0])  # half the level: a lower nominal level at every look
    assert np.all(np.diff(table[0], axis=1) > 0)  # O'Brien-Fleming: the early looks are strict


def test_no_effect_a_paper_reads_any_claim_held_at_most_five_percent_over_all_looks():
    """4000 studies, a paper of 4 claims with no real effect, looks at 5, 8, 11 and 14 replicates:
    the rate at which any claim is held at any look is at most 5% (+ 3 simulation SEs), and not
    trivially small (the test can fail both ways); the same for "contradicted"; and with claims that
    share a baseline arm (correlated differences)."""
    rng = np.random.default_rng(4201)
    design, studies, k = sq.Design(LOOKS), 4000, 4
    se = math.sqrt(0.05 * 0.95 / studies)
    d = rng.standard_normal((studies, k, LOOKS[-1]))
    p, po = t_pvalues(d)
    held_at, contra_at = sq.sequential_holm(p, design), sq.sequential_holm(po, design)
    for at in (held_at, contra_at):
        rate = float(np.mean((at >= 0).any(-1)))
        assert 0.01 < rate <= 0.05 + 3 * se, rate
    # early stops happen: some claims are decided before the last look
    assert np.any((held_at >= 0) & (held_at < len(LOOKS) - 1))
    # four methods against one baseline: d_i = m_i - b
    arms = rng.standard_normal((studies, k + 1, LOOKS[-1]))
    p, _ = t_pvalues(arms[:, :k] - arms[:, k:])
    rate = float(np.mean((sq.sequential_holm(p, design) >= 0).any(-1)))
    assert 0.01 < rate <= 0.05 + 3 * se, rate


# Power of one claim tested as the first Holm step of a paper's k claims (level 0.05 / k), looks at
# 5, 8, 11, 14 replicates, true effect 1.14 SD of a replicate's difference (the FedDDPM <
# FedAvg); by 200,000 simulated studies (numpy seed 7; docs/claims.md): the paired t procedure, and
# its mean replicate count at stopping. The z column is fedpipe.sequential.power (analytic).
DOCUMENTED_POWER = {1: (0.9884, 9.43), 4: (0.9321, 11.46), 14: (0.8133, 12.67)}


@pytest.mark.parametrize("k", sorted(DOCUMENTED_POWER))
def test_power_at_the_documented_effect_size(k):
    rng = np.random.default_rng(4202 + k)
    draws, effect = 4000, 1.14
    design = sq.Design(LOOKS, alpha=0.05 / k)
    d = rng.normal(effect, 1.0, (draws, 1, LOOKS[-1]))
    at = sq.sequential_holm(t_pvalues(d)[0], design)[:, 0]
    documented, ess = DOCUMENTED_POWER[k]
    rate = float(np.mean(at >= 0))
    assert abs(rate - documented) <= 3 * math.sqrt(documented * (1 - documented) / draws) + 1e-9
    n_stop = np.where(at >= 0, np.array(LOOKS)[np.maximum(at, 0)], LOOKS[-1])
    assert abs(n_stop.mean() - ess) <= 3 * n_stop.std() / math.sqrt(draws)
    # the z procedure (SD known) against the analytic power of the same boundaries
    az = sq.sequential_holm(t_pvalues(d, z=True)[0], design)[:, 0]
    analytic = sq.power(effect, design)
    assert abs(float(np.mean(az >= 0)) - analytic) <= 3 * math.sqrt(analytic * (1 - analytic) / draws)
    # the sequential t procedure loses little against the fixed test at the largest n, same level
    assert documented > claims.power(effect, LOOKS[-1], k) - 0.03


def test_sequential_holm_frees_the_level_of_a_rejected_claim():
    design = sq.Design((5, 10))
    a1, a2 = (design.nominal(0.05 / m) for m in (1, 2))
    # at the last look: claim 0 crosses at alpha/2; claim 1 only at alpha (once claim 0 is out)
    p = np.array([[[0.5, 0.5], [a2[1] * 0.9, a1[1] * 0.9]]])
    assert sq.sequential_holm(p, design).tolist() == [[1, 1]]
    p[0, 1, 0] = a2[1] * 1.1  # claim 0 misses: claim 1 faces alpha/2 and misses too
    assert sq.sequential_holm(p, design).tolist() == [[-1, -1]]
    # a two-sided opposite is tested at half the level
    p = np.array([[[0.5], [a1[1] * 0.9]]])
    assert sq.sequential_holm(p, design, sides=np.array([2])).tolist() == [[-1]]
    assert sq.verdict_codes(np.array([1, -1, 0, -1]), np.array([1, 0, -1, -1])).tolist() == [1, 2, 1, 0]


def _doc(seeds: list[int], effect: float, family: str | None = None) -> dict:
    """A claims.json of two FedDDPM claims over ``seeds``: FedDDPM's FID below FedAvg's by
    ``effect`` (noise SD 1), SCAFFOLD's not different; a third claim's arm missing."""
    rng = np.random.default_rng(7)
    noise = rng.standard_normal((3, 100))
    track = {"fedavg": {}, "fedddpm": {}, "scaffold": {}}
    for s in seeds:
        base = 50 + noise[0, s]
        track["fedavg"][s] = {"fid": base}
        track["fedddpm"][s] = {"fid": base - effect + noise[1, s]}
        track["scaffold"][s] = {"fid": base + noise[2, s]}
    paper = "FedDDPM (test)"
    cs = [claims.Claim(paper, "FedDDPM < FedAvg", "diffusion", "fid", "fedddpm", "fedavg", "lower"),
          claims.Claim(paper, "SCAFFOLD < FedAvg", "diffusion", "fid", "scaffold", "fedavg", "lower"),
          claims.Claim(paper, "MoFedSAM < FedAvg", "diffusion", "fid", "mofedsam", "fedavg", "lower")]
    doc = claims.claims_metrics(claims.judge_all(cs, {"diffusion": track}))
    if family:
        for r in doc["claims"]:
            r["family"] = "ordering" if r["method"] == "scaffold" else family
    return doc


def test_decide_from_the_claims_records():
    design = sq.Design((5, 8, 11))
    history = [sq.rows_from_claims(_doc(list(range(n)), effect=6.0)) for n in design.looks[:2]]
    v = sq.decide(history, design)
    keys = [r.key for r in history[-1]]
    assert v[keys[0]]["status"] == "held" and v[keys[0]]["n_decided"] in (5, 8)
    assert v[keys[1]]["status"] == "open"
    assert v[keys[2]]["status"] == "not evaluated"
    assert not sq.all_decided(history[-1], v)  # SCAFFOLD's claim is open
    # with the other helper's families: an open "ordering" claim does not hold the study back
    history = [sq.rows_from_claims(_doc(list(range(n)), 6.0, family="paper")) for n in design.looks[:2]]
    assert {r.family for r in history[-1]} == {"paper", "ordering"}
    assert sq.all_decided(history[-1], sq.decide(history, design))


def test_look_command_and_seeds():
    assert sq.seeds_for([0, 1, 2, 3, 4], 7) == [0, 1, 2, 3, 4, 5, 6]
    assert sq.seeds_for([3, 1], 4) == [3, 1, 4, 5] and sq.seeds_for([0, 1, 2], 2) == [0, 1]
    cmd = sq.look_command("fedddpm_smoke", [0, 1, 2], True, ["fl.rounds=2"], name="x")
    assert cmd == ["dvc", "exp", "run", "--name", "x", "-S", "study=fedddpm_smoke",
                   "-S", "study.seeds=[0,1,2]", "-S", "study.diffusion_seeds=[0,1,2]",
                   "-S", "fl.rounds=2"]
    assert "study.diffusion_seeds=[0,1]" not in sq.look_command("fednh_smoke", [0, 1], False, [])


@pytest.mark.parametrize("args,message", [
    (["fednh_smoke", "--min", "2", "--max", "8", "--step", "2"], "at least 3 replicates"),
    (["fednh_smoke", "--min", "5", "--max", "4", "--step", "2"], "must be at least --min"),
    (["fednh_smoke", "--min", "5", "--max", "8", "--step", "0"], "--step must be at least 1"),
    (["fednh_smok", "--min", "5", "--max", "8", "--step", "1"], "no study 'fednh_smok'"),
    (["fednh_smoke", "--min", "5", "--max", "8", "--step", "1", "-S", "study.seeds=[0]"],
     "set by the command"),
    (["fednh_smoke", "--min", "5", "--max", "8", "--step", "1", "-S", "fl.roundz=3"], "roundz"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_run(args, message, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedpipe.sequential", *args, "--json",
                           str(tmp_path / "s.json")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "s.json").exists()


def test_design_only_prints_the_boundaries():
    proc = subprocess.run([sys.executable, "-m", "fedpipe.sequential", "fedddpm_smoke", "--min", "5",
                           "--max", "14", "--step", "3", "--design"], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert "looks at [5, 8, 11, 14]" in proc.stdout


# -- under DVC: only the new replicates' stages run at a look ----------------------------------------
# test_replicates' stand-in without fedpipe's torch-importing modules (2 s a stage on this machine):
# each stage writes its declared outputs, named after the stage
LIGHT_STAND_IN = """\
import os, re
from pathlib import Path
import yaml
""" + STAND_IN_OUTPUTS + """
stage = os.environ["DVC_STAGE"]
name, _, rest = stage.partition("@")
spec = yaml.safe_load(Path("dvc.yaml").read_text())["stages"][name]
keys = list(spec.get("matrix") or {})
item = dict(zip(keys, rest.split("-", len(keys) - 1))) if keys else {}
outs = [next(iter(out)) if isinstance(out, dict) else out
        for out in [*spec.get("outs", []), *spec.get("metrics", [])]]
write_outputs(stage, [re.sub(r"\\$\\{item\\.(\\w+)\\}", lambda m: item[m.group(1)], out) for out in outs])
"""

REPORT_STAND_IN = """\
import json, os, runpy
import numpy as np
import yaml
from fedpipe import claims

runpy.run_path("stand_in.py")  # the declared outputs
seeds = yaml.safe_load(open("params.yaml"))["study"]["seeds"]
track = {"fedavg": {}, "fedddpm": {}, "scaffold": {}}
for s in seeds:
    noise = np.random.default_rng(s).standard_normal(3)
    track["fedavg"][s] = {"fid": 50 + noise[0]}
    track["fedddpm"][s] = {"fid": 30 + noise[0] + 0.1 * noise[1]}
    track["scaffold"][s] = {"fid": 50 + noise[0] + noise[2]}
cs = [claims.Claim("FedDDPM (test)", t, "diffusion", "fid", m, "fedavg", "lower")
      for t, m in (("FedDDPM < FedAvg", "fedddpm"), ("SCAFFOLD < FedAvg", "scaffold"))]
doc = claims.claims_metrics(claims.judge_all(cs, {"diffusion": track}))
open("data/report/claims.json", "w").write(json.dumps(doc))
open("data/report/metrics.json", "w").write("{}")
"""

TINY_STUDY = """\
# @package _global_
study:
  name: seq_tiny
  algorithms: [fedavg]
  diffusion_algorithms: [fedavg]
  diffusion_seeds: ${study.seeds}
  server_data_from: partition
  seeds: [0, 1, 2]
  papers: [fedddpm]
"""


@pytest.mark.slow
def test_each_look_runs_only_the_new_replicates_stages(tmp_path):
    """The command on a stand-in pipeline (the project's dvc.yaml, its partition and plan stages
    real, the others writing their outputs; the report a claims.json of two claims): looks at 3 and
    4 replicates through Hydra and ``dvc exp run``; the second look runs the stages of replicate 3
    and the aggregating ones, none of replicates 0-2 (DVC keeps them: the workspace's lock)."""
    from test_replicates import pipeline_copy

    env = pipeline_copy(tmp_path, [0, 1, 2])
    (tmp_path / "stand_in.py").write_text(LIGHT_STAND_IN)
    spec = yaml.safe_load((tmp_path / "dvc.yaml").read_text())
    spec["stages"]["report"]["cmd"] = f"{sys.executable} report_stand_in.py"
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (tmp_path / "report_stand_in.py").write_text(REPORT_STAND_IN)
    for d in ("conf", "hydra_plugins"):
        shutil.copytree(REPO / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "conf/study/seq_tiny.yaml").write_text(TINY_STUDY)
    bindir = Path(sys.executable).parent

    def sh(*cmd: str) -> str:
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    sh("git", "init", "-q")
    sh(str(bindir / "dvc"), "init", "-q")
    with open(tmp_path / ".dvc/config", "a") as f:
        f.write("[hydra]\n    enabled = True\n")
    (tmp_path / ".gitignore").write_text("/data/\n/__pycache__/\n")
    sh("git", "add", "-A")
    sh("git", "commit", "-qm", "copy")
    out = sh(sys.executable, "-m", "fedpipe.sequential", "seq_tiny", "--min", "3", "--max", "4",
             "--step", "1", "--json", "seq.json")
    record = json.loads((tmp_path / "seq.json").read_text())
    first, second = record["looks"]
    assert [first["n"], second["n"]] == [3, 4] and second["seeds"] == [0, 1, 2, 3]
    new = {f"{st}@3" for st in ("partition", "warmup", "generate", "aux_quality", "server_data",
                                "backbone")} | {"federate@fedavg-3", "federate_ddpm@fedavg-3"}
    assert set(second["stages_run"]) == new | {"plan", "evaluate", "report"}
    assert {"partition@0", "federate@fedavg-2"} <= set(first["stages_run"])
    verdicts = {v["claim"]: (v["status"], v["n_decided"]) for v in second["claims"]}
    assert verdicts == {"FedDDPM < FedAvg": ("held", 3), "SCAFFOLD < FedAvg": ("not shown", None)}
    assert record["stopped"] == "maximum replicates reached"
    assert "held (at n = 3)" in out  # the second look's table
