"""The paper presets at their real size (stand-in data) and the cost estimate's arithmetic.

The at-size tests (marker ``at_size``, ``make test-presets``, not in ``make test``) run
:mod:`fedpipe.estimate`'s slice of each paper preset: every stage of the pipeline
once, at the preset's model size, client count, batch sizes and data size (stand-in images of the
real shapes), one replicate, one round; so that a preset takes minutes, not hours, on two CPU cores,
each round trains two clients (the warm-up too), one local step each, on 200 test images. They check
that every stage ran and wrote its outputs, and that the report and the claims say the numbers are
stand-in numbers. The fast tests check the projection against hand-computed numbers
and the estimate's stage order against DVC's own graph of ``dvc.yaml``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fedpipe import estimate as est

REPO = Path(__file__).resolve().parents[1]
DVC = Path(sys.executable).parent / "dvc"

PRESETS = ["fedddpm_mnist", "fedddpm_cifar10", "fedddpm_cifar100", "fedptr_cifar10",
           "fedptr_cifar100", "fedptr_fmnist", "equitable_mnist", "equitable_cifar10",
           "equitable_cifar100", "fednh_cifar10", "fednh_cifar100", "perada_cifar10"]
# Seconds a slice round may take before local steps are cut: the CLI's default, so that a test
# runs the slice that `make estimate` runs.
TEST_BUDGET = est.ROUND_BUDGET


# -- the projection's arithmetic (fast) ---------------------------------------------------------
def _ev(kind, t0, s, ctx=("federated",), round_=0, pid=1, **kw):
    return {"kind": kind, "ctx": list(ctx), "round": round_, "t0": t0, "s": s, "pid": pid, **kw}


def test_round_loop_projection_by_hand():
    """One slice round of two clients (of four, sizes 10/10/20/40) whose local steps were cut to 3,
    projected to 10 rounds, evaluated every 5, checkpointed at the end only, distillation cut to half.
    """
    local = {"epochs": 2, "steps": 3, "batch": 5, "done": 3}
    events = [
        {"kind": "start", "t": 90.0, "pid": 1},
        {"kind": "federated", "ctx": [], "round": None, "t0": 100.0, "s": 20.0, "pid": 1,
         "sizes": [10, 10, 20, 40]},
        {"kind": "round", "r": 0, "t": 101.0, "pid": 1},
        _ev("select", 101.0, 0.5),
        _ev("client", 101.5, 4.0, n=20),
        _ev("local", 101.6, 3.0, ctx=("federated", "client"), n=20, **local),
        _ev("client", 105.5, 2.5, n=40),
        _ev("local", 105.6, 2.0, ctx=("federated", "client"), n=40, **local),
        _ev("aggregate", 108.0, 1.0),
        _ev("server_update", 109.0, 2.0),
        _ev("eval", 111.0, 3.0),
        _ev("ckpt", 114.0, 0.5),
    ]
    plan = est.LoopPlan(rounds=10, eval_every=5, batch=5, cap=3, kd_factor=2.0)
    p = est.project_loop(events, total=30.0, plan=plan)
    # the round's window 120 - 101 = 19 s, its calls 13.5 s: 5.5 s of the round are the engine's own
    # steady time per step 2/3 s (the second call; the first's excess 3 - 3 * 2/3 = 1 s is paid once)
    # client updates: 6.5 - 5 + (2 * 4 + 2 * 8) steps * 2/3 s = 17.5 s, times the sampling weight
    # mean(2, 2, 4, 8) / mean(4, 8) = 2/3: 11.667 s
    per_round = 5.5 + 0.5 + 17.5 * 2 / 3 + 1.0 + 2.0 * 2.0
    assert p.parts["per_round"] == pytest.approx(per_round)
    assert p.parts["evals"] == 2 and p.parts["eval_each"] == pytest.approx(3.0)
    assert p.parts["checkpoints"] == 1
    assert p.fixed == pytest.approx(30.0 - 19.0)
    assert p.projected == pytest.approx(11.0 + 10 * per_round + 2 * 3.0 + 0.5 + 1.0)


def test_server_training_on_the_auxiliary_set_and_sampling_by_hand():
    """FedDDPM+-like: a correction of 4 epochs on A (once per run) and a per-round calibration on A
    (every round), A cut from 1000 to 100 images at batch 50; a curve FID per evaluation, QuickTest
    and the final FID from the seconds per image-step."""
    events = [
        {"kind": "federated", "ctx": [], "round": None, "t0": 0.0, "s": 10.0, "pid": 7, "sizes": [5]},
        {"kind": "round", "r": 0, "t": 0.0, "pid": 7},
        _ev("client", 0.0, 1.0, pid=7, n=5),
        _ev("server_update", 1.0, 6.0, pid=7),
        _ev("local", 1.0, 2.0, ctx=("federated", "server_update"), pid=7, n=100, epochs=1,
            steps=None, batch=50, done=2),
        _ev("local", 3.0, 3.0, ctx=("federated", "server_update"), pid=7, n=100, epochs=4,
            steps=None, batch=50, done=8),
        _ev("eval", 7.0, 2.0, pid=7),
        _ev("sample", 7.5, 1.5, ctx=("federated", "eval"), pid=7, n=10, steps=2),
        _ev("sample", 10.0, 1.0, ctx=(), pid=7, n=10, steps=2),
    ]
    plan = est.LoopPlan(rounds=20, eval_every=10, batch=5, aux=(100, 1000), once_epochs=4,
                        unit=0.05, curve=40, quicktest=(2, 30), final=100)
    p = est.project_loop(events, total=15.0, plan=plan)
    # round: window 10 s, calls 9 s -> 1 s; client 1 s; server: 6 - 2 - 3 = 1 s besides A, the
    # calibration 2 s x ceil(1000/50)/ceil(100/50) = 20 s
    assert p.parts["per_round"] == pytest.approx(1.0 + 1.0 + 1.0 + 20.0)
    assert p.parts["once"] == pytest.approx(3.0 * 10)  # the correction, on the full A, once
    assert p.parts["eval_each"] == pytest.approx((2.0 - 1.5) + 40 * 0.05)
    assert p.parts["quicktest"] == pytest.approx(2 * 30 * 0.05)
    assert p.parts["final_sampling"] == pytest.approx(100 * 0.05)
    assert p.fixed == pytest.approx(15.0 - 10.0 - 1.0)
    assert p.projected == pytest.approx(4.0 + 20 * 23.0 + 2 * 2.5 + 30.0 + 3.0 + 5.0)


def test_clients_and_test_split_cuts_by_hand():
    """--clients 1 of a full run's 10 clients a round, --test-images: a tenth of the test split, a
    distilling server step whose KD steps were cut from 100 to 2. The round's client update and
    aggregation scale by 10; the server step's teachers' logits (one pass per client, once a
    round) by 10 and the rest of it (the student's KD steps) by 50; the evaluation's test reading
    by 10, its personal fine-tuning (a local_train call) not."""
    fine_tune = {"epochs": 1, "steps": None, "batch": 5, "done": 4}
    events = [
        {"kind": "test_cut", "full": 10000, "kept": 1000, "t": 0.0, "pid": 3},
        {"kind": "federated", "ctx": [], "round": None, "t0": 0.0, "s": 12.0, "pid": 3,
         "sizes": [10] * 100},
        {"kind": "round", "r": 0, "t": 0.0, "pid": 3},
        _ev("select", 0.0, 0.1, pid=3),
        _ev("client", 0.1, 2.0, pid=3, n=10),
        _ev("aggregate", 2.1, 0.4, pid=3),
        _ev("server_update", 2.5, 3.0, pid=3),
        _ev("teachers", 2.6, 1.0, ctx=("federated", "server_update"), pid=3, teachers=1, n=500),
        _ev("eval", 5.5, 2.5, pid=3),
        _ev("personal", 8.0, 3.0, pid=3),
        _ev("local", 8.1, 1.0, ctx=("federated", "personal"), pid=3, n=10, **fine_tune),
    ]
    plan = est.LoopPlan(rounds=5, batch=5, clients=10.0, kd_factor=50.0,
                        test=est.test_ratio(events))
    p = est.project_loop(events, total=14.0, plan=plan)
    # the round's window 12 s, its calls 11 s: 1 s of the engine's own; select 0.1; the client
    # 2 s x 10 (every client the same size: sampling weight 1); aggregation 0.4 x 10; the server
    # step: teachers 1 s x 10, the rest 2 s x 50
    assert plan.test == pytest.approx(10.0)
    assert p.parts["per_round"] == pytest.approx(1.0 + 0.1 + 20.0 + 4.0 + 10.0 + 100.0)
    # evaluation: (2.5 + 3.0 - 1.0 of fine-tuning) x 10 + 1.0
    assert p.parts["eval_each"] == pytest.approx(4.5 * 10 + 1.0)
    assert p.projected == pytest.approx(2.0 + 5 * 135.1 + 5 * 46.0)  # evaluated every round
    assert est.test_ratio([]) == 1.0


def test_probe_leaves_the_warmup_clients_past_the_cut_untrained(tmp_path):
    """The probe, loaded as a stage process loads it, with a warm-up cut to 2 clients: client 5's
    training is not run (its initial weights come back, a ``warmup_skip`` event records its size),
    client 1's is (the real function runs)."""
    site = tmp_path / "_site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(est.PROBE)
    (site / "cuts.json").write_text(json.dumps({"test_images": None, "warmup_clients": 2}))
    events = tmp_path / "events"
    events.mkdir()
    code = """
import torch
from fedpipe.pipeline import warmup
model = torch.nn.Linear(3, 2)
cfg = warmup.WarmupConfig(batch_size=4)
w, losses = warmup.train_client_ddpm(model, torch.zeros(7, 3), None, cfg, None, client=5)
assert set(w) == {"weight", "bias"} and torch.equal(w["weight"], model.weight.detach()), w
try:  # client 1 is trained: the real function runs, and fails on this test's bare tensor data
    warmup.train_client_ddpm(model, torch.zeros(7, 3), None, cfg, None, client=1)
except AttributeError as e:
    assert "batches" in str(e), e
else:
    raise AssertionError("client 1 was not trained")
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO / "src")]),
           est.PROBE_ENV: str(events)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
    skips = [e for e in est.read_events(events) if e["kind"] == "warmup_skip"]
    assert [(e["client"], e["n"], e["batch"]) for e in skips] == [(5, 7, 4)]


def test_client_cut_sets_participation_and_leaves_smaller_rounds(tmp_path):
    full = est.compose(REPO, ["study=fednh_cifar10", "dataset.stand_in=true"], tmp_path / "p.yaml")
    cuts = est.slice_cuts(full, clients=2, test_images=500)
    assert "fl.participation=0.02" in cuts.overrides  # 10 of 100 clients a round -> 2
    assert cuts.clients == {"fl": (10, 2)} and cuts.test_images == 500
    assert est.slice_cuts(full, clients=10).clients == {}  # the round trains 10 already: no cut
    assert not any(o.startswith("fl.participation") for o in est.slice_cuts(full).overrides)
    # Equitable-FL clusters a round's clients into C = 3 (CIFAR-100): the slice keeps 3 of 4
    full = est.compose(REPO, ["study=equitable_cifar100", "dataset.stand_in=true"], tmp_path / "e.yaml")
    cuts = est.slice_cuts(full, clients=2)
    assert cuts.clients == {"fl": (4, 3)} and "fl.participation=0.3" in cuts.overrides
    assert "(not 2: algorithms.equitable_fl.num_clusters=3)" in cuts.lines[0]
    back = est.Cuts.from_state(json.loads(json.dumps(est.asdict(cuts))))
    assert back == cuts  # --resume and --project-only read the same cuts
    assert cuts.warmup_clients is None  # no diffusion track
    # FedDDPM: the warm-up trains 2 of 100 clients; the federated DDPM rounds 2 of 15
    full = est.compose(REPO, ["study=fedddpm_mnist", "dataset.stand_in=true"], tmp_path / "d.yaml")
    cuts = est.slice_cuts(full, clients=2)
    assert cuts.warmup_clients == (100, 2) and cuts.clients["diffusion_fl"] == (15, 2)
    assert any(ln.startswith("warm-up: 100 -> 2 clients trained") for ln in cuts.lines)
    assert est.Cuts.from_state(json.loads(json.dumps(est.asdict(cuts)))) == cuts
    assert est.slice_cuts(full).warmup_clients is None


def test_warmup_evaluate_and_schedules_by_hand():
    # two worker processes, three clients each, 10 steps of one epoch; the first call of each
    # process carries its set-up: 0.1 s per step; 50 epochs -> 2,940 steps more over 2 processes
    rows = [{"kind": "local", "ctx": [], "round": None, "pid": pid, "t0": float(i), "s": s,
             "n": 100, "epochs": 1, "steps": None, "batch": 10, "done": 10}
            for pid, times in ((1, (2.0, 1.0, 1.0)), (2, (3.0, 1.2, 0.8)))
            for i, s in enumerate(times)]
    p = est.project_warmup(rows, total=10.0, epochs=50)
    assert p.projected == pytest.approx(10.0 + (3000 - 60) * 0.1 / 2)
    # --clients: two clients of 100 and 25 images the probe left untrained add all their 50 x 10
    # and 50 x 3 steps, at the same 0.1 s per step over the 2 processes
    skipped = [{"kind": "warmup_skip", "client": c, "n": n, "batch": 10, "pid": 1, "t": 0.0}
               for c, n in ((6, 100), (7, 25))]
    p = est.project_warmup(rows + skipped, total=10.0, epochs=50)
    assert p.projected == pytest.approx(10.0 + (3000 + 500 + 150 - 60) * 0.1 / 2)
    assert est.eval_count(10, 5) == 2 and est.eval_count(10, 3) == 4 and est.eval_count(1, 20) == 1
    assert est.checkpoint_count(10, 3, 0, 1.0, 1, 0.0) == 4  # rounds 3, 6, 9 and the last
    assert est.checkpoint_count(10, 0, 25, 10.0, 1, 0.0) == 4  # 30 s apart: 3, 6, 9, the last
    assert est.sampling_weight([10, 20], [20], 10) == pytest.approx(1.5 / 2)
    assert est.sampling_weight([10, 20], [30], 10) == 1.0  # pooled (Centralized)
    assert est.project_part(10.0, 4.0, 30).projected == pytest.approx(6.0 + 120.0)


def test_step_cap_fits_the_budget_and_never_exceeds_a_client():
    fl = {"participation": 0.5, "local": {"epochs": 2, "batch_size": 10, "steps": None}}
    sizes = [100, 100, 200, 200]  # 20 and 40 steps per client, 2 clients a round: 60 steps
    assert est.choose_cap(sizes, fl, 1.0, 100.0) == (None, 30.0)
    assert est.choose_cap(sizes, fl, 1.0, 20.0) == (10, 30.0)
    assert est.choose_cap(sizes, fl, 0.1, 5.0, pooled=True)[0] == 20  # 120 pooled steps: capped
    assert est.choose_cap(sizes, {**fl, "local": {**fl["local"], "steps": 5}}, 1.0, 1.0) == (None, 5.0)
    n, steps = est.fid_slice(1.0, 256, 1000)  # an expensive model: the fewest images and steps
    assert (n, steps) == (est.FID_SAMPLES, est.SAMPLE_STEPS)
    assert est.fid_slice(1e-6, 256, 1000) == (256, 20)


# -- the stage order against DVC (fast) ---------------------------------------------------------
def _dvc_dag(folder: Path) -> tuple[set[str], set[tuple[str, str]]]:
    out = subprocess.run([str(DVC), "dag", "--dot"], cwd=folder, capture_output=True, text=True,
                         env={**os.environ, "DVC_NO_ANALYTICS": "1"}, check=True).stdout
    nodes = {m for m in (ln.strip().rstrip(";").strip('"') for ln in out.splitlines())
             if m and "->" not in m and "{" not in m and "}" not in m}
    edges = set()
    for ln in out.splitlines():
        if "->" in ln:
            a, b = (x.strip().rstrip(";").strip('"') for x in ln.split("->"))
            edges.add((a, b))
    return nodes, edges


def _check_against_dvc(folder: Path, params: dict) -> list[str]:
    dvc_yaml = yaml.safe_load((folder / "dvc.yaml").read_text())
    specs = est.expand_stages(dvc_yaml, params)
    nodes, edges = _dvc_dag(folder)
    assert {s.address for s in specs} == nodes
    assert est.stage_edges(specs) == edges
    order = [s.address for s in est.stage_order(specs)]
    pos = {a: i for i, a in enumerate(order)}
    assert all(pos[a] < pos[b] for a, b in edges)
    return order


def test_stage_order_is_dvc_yamls_dependency_order():
    order = _check_against_dvc(REPO, yaml.safe_load((REPO / "params.yaml").read_text()))
    assert order[0] == "plan" and order[-1] == "report"


@pytest.mark.parametrize("study", ["perada_cifar10", "fedddpm_mnist"])
def test_stage_order_of_a_composed_preset(study, tmp_path):
    """A preset's composed params (a backbone, no diffusion; the diffusion track, three replicates)
    in a scratch DVC project: the same stages and edges as DVC's graph."""
    (tmp_path / "dvc.yaml").write_text((REPO / "dvc.yaml").read_text())
    subprocess.run([str(DVC), "init", "--no-scm", "-q"], cwd=tmp_path, check=True,
                   env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    params = est.compose(REPO, [f"study={study}"], tmp_path / "params.yaml")
    order = _check_against_dvc(tmp_path, params)
    seeds = params["study"]["seeds"]
    assert sum(a.startswith("partition@") for a in order) == len(seeds)


def test_slice_overrides_cut_only_what_they_say(tmp_path):
    full = est.compose(REPO, ["study=fedptr_cifar10", "dataset.stand_in=true"], tmp_path / "p.yaml")
    cuts = est.slice_cuts(full)
    assert "study.seeds=[0]" in cuts.overrides
    assert "fl.rounds=2" in cuts.overrides  # FedPTR's window: its MTT starts in the second round
    assert not any(o.startswith(("model.", "partition.", "dataset.", "fl.local.batch_size"))
                   for o in cuts.overrides)
    full = est.compose(REPO, ["study=perada_cifar10", "dataset.stand_in=true"], tmp_path / "q.yaml")
    cuts = est.slice_cuts(full)
    assert cuts.kd == {"perada": (500, est.KD_STEPS), "feddf": (500, est.KD_STEPS)}
    assert cuts.corruption_pairs == (30, 2) and "fl.rounds=1" in cuts.overrides


def test_the_printed_estimate_fits_120_columns():
    rows = [est.Row("federate_ddpm@fedddpm_plus-12345", "federate_ddpm", 1234.5, 2345.6, 9.9e6, 3,
                    3e7, 123456.0, None, "600r x 1,234, 60ev x 12,345, FID 1,234,567",
                    out_mib=1536.0)]
    e = est.Estimate("fedddpm_cifar100", "cpu (2 cores, torch threads 2)", "/tmp/x", rows,
                     ["fl.local.steps: null -> 3 per client (full: 5 epoch(s), 41.5 steps per client "
                      "on average; one step 0.82 s here, 10 clients per round, budget 60 s)"],
                     [], 9.9e6, 3e7, 1234.5, 3, "federate_ddpm@fedddpm_plus-12345", "x " * 80)
    text = est.report(e)
    assert max(len(line) for line in text.splitlines()) <= 120
    assert "FAILED at stage federate_ddpm@fedddpm_plus-12345" in text
    # 1.5 GiB a replicate, a stage of 3 replicates: 4.5 GiB the study
    assert "wrote 1.50 GiB under data/" in text and "the study about 4.50 GiB" in " ".join(
        text.split())


def test_outputs_are_measured_without_checkpoints_and_raw_data(tmp_path):
    for rel, size in (("data/federate/a/m.bin", 2**20), ("data/report/r.md", 2**19),
                      ("data/checkpoints/federate/c.bin", 2**22), ("raw/x.bin", 2**22)):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"\0" * size)
    (tmp_path / "data/raw").symlink_to(tmp_path / "raw")
    assert est.data_mib(tmp_path) == pytest.approx(1.5)


# -- the presets at size (marker at_size: make test-presets) -------------------------------------
AT_SIZE_CLIENTS = 2
AT_SIZE_TEST_IMAGES = 200


@pytest.mark.at_size
@pytest.mark.parametrize("study", PRESETS)
def test_preset_slice_runs_at_size(study, tmp_path, capsys):
    """One replicate of every stage of the preset, one round, at its model size, client count,
    batch sizes and data size (stand-in images of the real shapes). Cut, so that a preset takes
    minutes on two CPU cores, not hours (each cut printed by the estimate): each round trains
    :data:`AT_SIZE_CLIENTS` clients (the fewest a method accepts; FedDDPM's warm-up trains that
    many and keeps the others' initial weights), one local step a client, the test split
    :data:`AT_SIZE_TEST_IMAGES` images, the distillation :data:`fedpipe.estimate.KD_STEPS` steps,
    a handful of generated and FID images."""
    t0 = time.perf_counter()
    result = est.estimate(study, stand_in=True, scratch=tmp_path / "slice", root=REPO,
                          budget=TEST_BUDGET, local_steps=1, clients=AT_SIZE_CLIENTS,
                          test_images=AT_SIZE_TEST_IMAGES, log=lambda s: None)
    seconds = time.perf_counter() - t0
    with capsys.disabled():
        print(f"\n{study}: slice {seconds:.0f} s; projected one replicate {result.replicate_s:.0f} "
              f"s, study {result.study_s:.0f} s")
    assert result.failed is None, f"{result.failed}: {result.error}"
    scratch = Path(result.scratch)
    params = yaml.safe_load((scratch / "params.yaml").read_text())
    seed = params["study"]["seeds"][0]
    assert params["dataset"]["stand_in"] is True
    ran = [r.address for r in result.rows]
    assert ran == [s.address for s in est.pipeline(REPO, params)]
    for algo in params["study"]["algorithms"]:
        assert (scratch / f"data/federate/{algo}/seed_{seed}/metrics.json").is_file(), algo
    for algo in params["study"]["diffusion_algorithms"]:
        assert (scratch / f"data/federate_ddpm/{algo}/seed_{seed}/metrics.json").is_file(), algo
    from fedpipe.config.dataset import STAND_IN_NOTE

    assert STAND_IN_NOTE in (scratch / "data/report/report.md").read_text()
    assert json.loads((scratch / "data/report/claims.json").read_text()).get("stand_in") == \
        STAND_IN_NOTE
    assert all(r.replicate_s >= r.slice_s * 0.5 for r in result.rows)
    assert result.study_s >= result.replicate_s



@pytest.mark.slow
def test_estimate_with_clients_and_test_split_cut(tmp_path):
    """`python -m fedpipe.estimate` with --clients 2 --test-images 100 on a digits study: each round
    of the slice trains 2 clients (the study: 4), every stage that loads the data sees 100 test
    images, and the projection scales both back; a count below 1 is one line and exit 2."""
    bad = subprocess.run([sys.executable, "-m", "fedpipe.estimate", "perada_smoke", "--clients", "0"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr == "error: --clients 0: a count of at least 1\n"
    scratch = tmp_path / "slice"
    proc = subprocess.run([sys.executable, "-m", "fedpipe.estimate", "perada_smoke",
                           "study.algorithms=[feddf]", "--clients", "2", "--test-images", "100",
                           "--scratch", str(scratch), "--json", str(tmp_path / "e.json")],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "FEDPIPE_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fl.participation: 0.4 -> 0.2 (4 -> 2 clients a round of 10;" in proc.stdout
    fed = est.read_events(scratch / "_probe" / "federate@feddf-0")
    assert [e["n"] for e in fed if e["kind"] == "client"] and \
        len([e for e in fed if e["kind"] == "client"]) == 2  # one round, two clients
    assert [e["teachers"] for e in fed if e["kind"] == "teachers"] == [2]  # FedDF's: timed apart
    for stage in ("partition@0", "federate@feddf-0", "evaluate"):
        cut = [e for e in est.read_events(scratch / "_probe" / stage) if e["kind"] == "test_cut"]
        assert cut and {(e["full"], e["kept"]) for e in cut} == {(450, 100)}, stage
    rows = {r["address"]: r for r in json.loads((tmp_path / "e.json").read_text())["rows"]}
    f = rows["federate@feddf-0"]["parts"]
    assert f["per_round"] > 0 and f["eval_each"] > 0
    assert rows["evaluate"]["parts"]["test_factor"] == pytest.approx(4.5)


def test_resume_refuses_other_cuts_than_the_slice_was_cut_with(tmp_path):
    state = {"study": "fednh_cifar10", "base": ["study=fednh_cifar10", "dataset.stand_in=true"],
             "asked": {"clients": 2, "test_images": None}}
    (tmp_path / est.STATE).write_text(json.dumps(state))
    for kw, line in (({"clients": 3}, "--clients 3: the slice in {} was cut with --clients 2"),
                     ({"test_images": 500}, "--test-images 500: the slice in {} was cut with no "
                                            "such cut")):
        with pytest.raises(est.EstimateError) as e:
            est.estimate("fednh_cifar10", scratch=tmp_path, root=REPO, resume=True, log=lambda s: None,
                         **kw)
        assert str(e.value).startswith(line.format(tmp_path.resolve())), str(e.value)
