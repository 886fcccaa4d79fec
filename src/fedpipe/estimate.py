"""Cost estimate of a study before a long run: one replicate of every stage as a *slice*, measured,
then projected to the whole study.

``python -m fedpipe.estimate <study> [hydra override ...] [--stand-in/--no-stand-in] [--json PATH]``
(``make estimate STUDY=<study> ARGS="..."``).

What runs
---------
The study's params are composed as ``dvc exp run -S study=<study> -S <override> ...`` composes them
(:func:`fedpipe.pipeline.compose.compose_params`, DVC's own Hydra composition, from a copy of the
repository's ``conf/`` and ``hydra_plugins/`` in a scratch folder; the repository's ``params.yaml``
is never touched): these are the *full* params. For a
torchvision dataset ``dataset.stand_in=true`` is added unless ``--no-stand-in`` (stand-in images of
the real shape, classes and sizes: cost and plumbing real, numbers meaningless). The *slice* params
are the full ones with these overrides, nothing else:

- one replicate: ``study.seeds=[s]`` (and ``study.diffusion_seeds=[s]`` when the study has the
  diffusion track), ``s`` the study's first seed;
- ``fl.rounds=1`` and ``fl.eval_every=1`` (evaluated at that round); ``1 + m`` rounds instead when a
  method of the study needs the model of ``m`` rounds back before its server step runs (FedPTR's
  trajectory ``window`` m: its first round has no MTT), ``eval_every`` then the same;
  ``diffusion_fl.rounds=1``, ``diffusion_fl.eval_every=1``;
- the backbone's pretraining one round (``algorithms.<a>.pretrain_rounds=1`` where set; null
  follows ``fl.rounds``), the warm-up one epoch (``warmup.epochs=1``);
- a handful of generated images: ``generate.sampler=ddim`` with ``generate.ddim_steps`` =
  :data:`SAMPLE_STEPS`, and ``generate.ratio`` down to one server batch of images (the auxiliary set
  A, which FedDDPM's calibration, FedDDPM+'s correction and ``aux_only`` train on every round);
  ``fid.sampler`` and ``fid.curve_sampler`` ``ddim``, ``fid.classifier_epochs=1``, and
  ``fid.num_samples`` = ``fid.curve_samples`` and ``fid.ddim_steps`` as many as one sampling call
  of about :data:`SAMPLE_BUDGET` seconds takes (:func:`fid_slice`: at least :data:`FID_SAMPLES`
  images and :data:`SAMPLE_STEPS` steps, at most one ``fid.batch_size`` batch and 20 steps; a cheap
  model samples more, so that a call's set-up does not dominate its time per image-step);
- knowledge distillation (PerAda, FedDF; a method whose ``kd`` is off keeps its value):
  ``algorithms.<a>.kd_steps`` = :data:`KD_STEPS`;
- shift evaluation: one corruption at two severities (``study.corruptions``, ``study.severities``)
  instead of every pair;
- local steps, only where one round would not fit the round budget (``--round-budget``, default
  :data:`ROUND_BUDGET` s): ``fl.local.steps`` (and ``diffusion_fl.local.steps``) = the largest
  count at which the round's clients fit it, from one training step of the study's model timed here
  at the study's batch size, and never more than the smallest client's full steps (no client of the
  slice trains more than in the full run); a method that pools every client's data (Centralized)
  counts as one client of all the data. ``--local-steps N`` sets the cap (0: never cut). The
  warm-up has no step cap in the library: its one epoch runs whole (``warmup.steps`` is used as soon
  as the section has that key);
- only when asked (``--clients K``): each round of the slice trains K clients where the study trains
  more (``fl.participation`` and ``diffusion_fl.participation`` = K / N; the step cap is then chosen
  for K clients a round), and the warm-up trains clients 0 to K-1 only: the probe returns the
  others' initial weights untrained (the generation samples from them at the same cost), and their
  steps are projected at the trained clients' time per step;
- only when asked (``--test-images N``): the test split keeps N of its images, evenly spaced, the
  same in every stage (the probe cuts what ``load_dataset`` returns; the clients' local test sets,
  drawn from it, and the corrupted sets shrink with it).

Model size, client count, batch sizes and data size stay the study's, and so do the clients a round
and the test split unless ``--clients`` / ``--test-images`` cut them. Every cut is printed.
Each stage of ``dvc.yaml`` then runs once, as its own process
(``python stages/<stage>.py`` in the scratch folder, ``DVC_STAGE=<address>``,
``FEDPIPE_TRACKING=off``), in an order that respects every dependency in ``dvc.yaml``
(:func:`stage_order`: a topological sort of the expanded stages, ties in file order); a stage the plan
does not use skips itself as under DVC. Wall time and CPU time are measured from outside
(``os.wait4``); the peak memory is the sum over the stage's processes of each one's own peak RSS
(``VmHWM``, read by the probe: ``ru_maxrss`` would count the estimate's own size, which a child
inherits at ``exec``); on CUDA, the probe also reports ``torch.cuda.max_memory_allocated``. A stage
that fails prints its one-line error and the estimate exits 1 naming it; Ctrl-C stops the running
stage (exit 130). Either way the stages before it are still projected and printed, and the scratch
folder is kept; ``--resume`` with that ``--scratch`` runs the stages from there on.

How the parts are measured
--------------------------
Each stage process loads a small probe (a ``sitecustomize`` on ``PYTHONPATH`` in the scratch folder,
also loaded by the spawned worker processes of the warm-up and the generation; not a file of the
project, so a stage's code check is unaffected). It wraps, where the stage imports them:
the engine's round loop (``run_federated``; each round's client selection, client updates,
aggregation, server step, evaluation, personal models and checkpoints), every ``local_train`` call
(data size, epochs, step cap, batch, steps done), every ``DiffusionTask.sample`` call (images, steps),
the evaluate stage's per-run scoring and its corrupted-set passes, and the stage's ``main`` as
:func:`fedpipe.cli.run_stage` calls it (after the module-level imports; benchmarks/stage_overhead.py
reads it). A stage's *fixed* part is its wall
time less the parts below (start-up, imports, data loading, model set-up, writing outputs): it is
never scaled.

Projection rules (full study from the slice)
--------------------------------------------
Round loops (``federate``, ``backbone``, ``federate_ddpm``), from the slice's last round:

- per round = its client updates + selection + aggregation + server step + the rest of the round;
  times R, the full run's rounds (``fl.rounds``; the backbone's ``pretrain_rounds``, null meaning
  ``fl.rounds``; ``diffusion_fl.rounds``);
- client updates: each ``local_train`` call at its full steps (``epochs x ceil(n / batch)`` for a
  call the cap cut, else the steps it did) times the steady time per step of its kind of call
  (same epochs, cap and batch), taken over its calls but the process's first, whose excess over it
  (torch's lazy set-up, the model's first use) counts once per run, not per round; the other time
  of an update as measured; the round's client time then multiplied by the mean of
  ``ceil(m_i / batch)`` over all clients over its mean over the round's clients (sampling: a round
  of larger clients costs more), unless every client trained or training is pooled (Centralized);
  with ``--clients K``, the client updates and the aggregation also times the full run's clients a
  round over K (not for a method that pools every client's data);
- server steps: KD (``kd_steps`` cut) times ``full / slice kd_steps``, except the teachers' logits
  (one pass of each of the round's local models over the distillation set, once a round: the
  probe times ``teacher_logits``), which with ``--clients K`` scale by the clients a round over K
  instead; a server training on A
  (FedDDPM's calibration, FedDDPM+'s correction, ``aux_only``) at ``ceil(|A_full| / batch) /
  ceil(|A_slice| / batch)`` times its time; FedDDPM+'s correction (the ``correction_epochs``
  training) once per run, not per round; its QuickTest, which a one-round slice never reaches,
  ``floor(R / test_every)`` times ``test_size`` images (an upper bound: no early stop);
- evaluations: the slice's time per evaluation (generic, personalized, the personal models) times
  the full run's evaluated rounds (every ``eval_every``-th and the last); with ``--test-images N``
  its time less the personal models' fine-tuning times the full test split over N (an upper bound
  where a client's local test set has a fixed size, ``partition.local_test_size``); in
  ``federate_ddpm`` its
  FID-curve sampling replaced by ``curve_samples`` images at the curve sampler's steps;
- checkpoints: the slice's time per checkpoint times the full run's count (every
  ``checkpoint_every`` rounds, after a round ending ``checkpoint_seconds`` after the last, the last);
- after the loop (``federate_ddpm``'s final FID): ``num_samples`` images at ``fid.sampler``'s steps.

Sampling, wherever it is: image-steps (images x denoising steps) times the seconds per image-step of
the slice's largest sampling call made in a stage's own process, over all stages (the whole
machine's threads; a small batch costs more per image, so the largest is the closest to the full
run's batches).

- ``warmup``: the slice plus the steps it did not do (every client ``warmup.epochs x
  ceil(m_i / batch)`` in the full run) at the steady time per step of the workers' ``local_train``
  calls (each worker's first call apart, as above), spread over the workers;
- ``generate``: its sampling wall time replaced by ``|A_full| x`` the full sampler's steps
  (``num_train_timesteps`` for ``ddpm``);
- ``feature_extractor``: the FID classifier's training times ``fid.classifier_epochs``;
- ``evaluate``: the corrupted-set passes and the building of the corrupted sets times the full over
  the slice's (corruption, severity) pairs, and with ``--test-images N`` the scoring and the
  corrupted sets times the full test split over N; for the study, its per-run scoring times the
  number of replicates;
- ``plan``, ``partition``, ``server_data``, ``aux_quality``, ``report``: as measured.

A stage of a per-replicate matrix (``partition@<seed>``, ``federate@<algorithm>-<seed>`` ...) counts
once per replicate of the full study (``study.seeds``, or ``study.diffusion_seeds``); ``plan``,
``feature_extractor``, ``evaluate`` and ``report`` once. "one replicate" is the study with one seed.

The projection assumes the slice's throughput holds for the full run (same machine, same load) and
ignores an early stop (FedDDPM+'s QuickTest): it is an estimate of the order of the cost, printed
with the slice it came from, not a promise. The table also shows each stage's CPU time (``wait4``'s
user + system), and the report the cores the slice got on average and the load average around it:
on a machine shared with other work the wall times, and so the projection, grow with that load.
The probe sees client updates through the ``serial`` executor: with ``fl.executor`` batched or ray
the local steps are never cut and a round is projected as one piece.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedpipe.config.core import param_at as get  # params at a dotted key

FID_SAMPLES = 32
"""Generated images per FID of the slice (final and curve)."""
SAMPLE_STEPS = 2
"""DDIM steps of every sampler in the slice."""
KD_STEPS = 2
"""Distillation steps per round in the slice (PerAda, FedDF)."""
ROUND_BUDGET = 60.0
"""Seconds one slice round may take before the local steps are cut (``--round-budget``)."""
TORCHVISION = ("mnist", "fashion_mnist", "cifar10", "cifar100")
CORRUPTION_PAIRS = 2
"""(corruption, severity) pairs the slice keeps of a shift evaluation."""
ONCE_STAGES = ("plan", "feature_extractor", "evaluate", "report")


# -- params --------------------------------------------------------------------------------------
def has(params: dict[str, Any], key: str) -> bool:
    marker = object()
    return get(params, key, marker) is not marker


def override(key: str, value: Any) -> str:
    """A Hydra ``key=value`` override (lists and nulls in YAML flow style)."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, list | tuple):
        text = "[" + ",".join(str(v) for v in value) + "]"
    else:
        text = str(value)
    return f"{key}={text}"


def repo_root() -> Path:
    """The repository whose ``stages/`` and ``conf/`` the estimate uses: the current folder when it
    holds ``dvc.yaml``, else the checkout holding this package (``src/fedpipe``)."""
    here = Path.cwd()
    if (here / "dvc.yaml").is_file() and (here / "conf").is_dir():
        return here
    return Path(__file__).resolve().parents[2]


def compose(root: Path, overrides: Sequence[str], out: Path) -> dict[str, Any]:
    """Compose params as ``dvc exp run -S`` does, into ``out``: ``root``'s ``conf/`` and
    ``hydra_plugins/`` are copied beside ``out`` (``_compose/``) and composed there by
    :func:`fedpipe.pipeline.compose.compose_params`, so that the repository's params.yaml is never
    touched and a DVC run in the repository (which the Hydra plugin guards its params.yaml against)
    does not stop the estimate."""
    from fedpipe.config.core import load_params
    from fedpipe.pipeline.compose import compose_params

    out = out.resolve()
    croot = out.parent / "_compose"
    if croot.exists():
        shutil.rmtree(croot)
    for name in ("conf", "hydra_plugins"):
        if (root / name).is_dir():
            shutil.copytree(root / name, croot / name,
                            ignore=shutil.ignore_patterns("__pycache__"))
    compose_params(croot, list(overrides), output=str(out))  # croot / absolute = absolute
    return load_params(out)


# -- the stages of dvc.yaml ----------------------------------------------------------------------
@dataclass(frozen=True)
class StageSpec:
    name: str
    address: str  # DVC's: name, or name@v1-v2 for a matrix stage
    item: dict[str, Any]
    deps: tuple[str, ...]
    outs: tuple[str, ...]
    per_replicate: str | None  # the params list of its ``seed`` matrix key (study.seeds ...)


_INTERP = re.compile(r"\$\{([^}]+)\}")


def _resolve(text: str, params: dict[str, Any], item: dict[str, Any]) -> Any:
    whole = _INTERP.fullmatch(text.strip())
    if whole:
        key = whole.group(1).strip()
        return item[key[5:]] if key.startswith("item.") else get(params, key)

    def sub(m: re.Match) -> str:
        key = m.group(1).strip()
        return str(item[key[5:]] if key.startswith("item.") else get(params, key))
    return _INTERP.sub(sub, text)


def _paths(entries: Iterable[Any]) -> list[str]:
    out = []
    for e in entries or ():
        out.extend(e.keys() if isinstance(e, dict) else [e])
    return [str(p) for p in out]


def expand_stages(dvc_yaml: dict[str, Any], params: dict[str, Any]) -> list[StageSpec]:
    """Every stage of ``dvc_yaml`` for ``params``, matrices expanded as DVC does (address
    ``name@v1-v2``, values joined by ``-`` in the matrix's key order), in file order."""
    import itertools

    specs = []
    for name, st in (dvc_yaml.get("stages") or {}).items():
        matrix = st.get("matrix")
        items: list[dict[str, Any]] = [{}]
        per_replicate = None
        if matrix:
            keys = list(matrix)
            values = []
            for k in keys:
                v = matrix[k]
                if isinstance(v, str):
                    if k == "seed":
                        per_replicate = _INTERP.fullmatch(v.strip()).group(1).strip()
                    v = _resolve(v, params, {})
                values.append(list(v or []))
            items = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]
        for item in items:
            address = name + ("@" + "-".join(str(item[k]) for k in item) if matrix else "")
            deps = tuple(_resolve(d, params, item) for d in _paths(st.get("deps")))
            outs = tuple(_resolve(o, params, item) for o in
                         _paths(st.get("outs")) + _paths(st.get("metrics")) + _paths(st.get("plots")))
            specs.append(StageSpec(name, address, item, deps, outs, per_replicate))
    return specs


def _under(path: str, folder: str) -> bool:
    p, f = path.rstrip("/"), folder.rstrip("/")
    return p == f or p.startswith(f + "/")


def stage_edges(specs: Sequence[StageSpec]) -> set[tuple[str, str]]:
    """(producer, consumer) address pairs: a dep of the consumer is an output of the producer, lies
    inside one, or is a folder that holds one (``data/federate`` holds every federate run)."""
    edges = set()
    for a in specs:
        for b in specs:
            if a is b:
                continue
            if any(_under(d, o) or _under(o, d) for d in b.deps for o in a.outs):
                edges.add((a.address, b.address))
    return edges


def stage_order(specs: Sequence[StageSpec]) -> list[StageSpec]:
    """``specs`` in an order that respects every dependency (Kahn's algorithm; among the stages
    ready at once, the first in ``dvc.yaml`` first). A cycle is a ValueError."""
    edges = stage_edges(specs)
    pos = {s.address: i for i, s in enumerate(specs)}
    indeg = {s.address: 0 for s in specs}
    for _, b in edges:
        indeg[b] += 1
    by = {s.address: s for s in specs}
    ready = sorted((a for a, d in indeg.items() if d == 0), key=pos.get)
    out = []
    while ready:
        a = ready.pop(0)
        out.append(by[a])
        for x, b in sorted(edges, key=lambda e: pos[e[1]]):
            if x == a:
                indeg[b] -= 1
                if indeg[b] == 0:
                    ready.append(b)
        ready.sort(key=pos.get)
    if len(out) != len(specs):
        raise ValueError("dvc.yaml's stages form a cycle: "
                         + ", ".join(a for a, d in indeg.items() if d > 0))
    return out


def pipeline(root: Path, params: dict[str, Any]) -> list[StageSpec]:
    """The stages of ``root/dvc.yaml`` for ``params``, in dependency order."""
    dvc_yaml = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))
    return stage_order(expand_stages(dvc_yaml, params))


# -- the probe -----------------------------------------------------------------------------------
PROBE_ENV = "FEDPIPE_ESTIMATE_PROBE"
PROBE = r'''
"""Timing probe of `python -m fedpipe.estimate` (written by it; not a file of the project). Loaded as
sitecustomize by each stage process and its spawned workers when FEDPIPE_ESTIMATE_PROBE names a folder:
wraps the pipeline's timed parts where the stage imports them and appends one JSON line per call."""
import os
import sys

_DIR = os.environ.get("FEDPIPE_ESTIMATE_PROBE")


def _chain():  # the sitecustomize this one shadows, if any
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        cand = os.path.join(os.path.abspath(entry or "."), "sitecustomize.py")
        if os.path.dirname(cand) != here and os.path.isfile(cand):
            with open(cand) as f:
                exec(compile(f.read(), cand, "exec"), {"__name__": "sitecustomize", "__file__": cand})
            return


if _DIR:
    import functools
    import json
    import time

    _STACK = []
    _ROUND = [None]

    def _hwm():  # this process image's own peak RSS (ru_maxrss would include its parent's: exec)
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        return None

    def _emit(rec):
        rec["pid"] = os.getpid()
        with open(os.path.join(_DIR, "events.%d.jsonl" % os.getpid()), "a") as f:
            f.write(json.dumps(rec) + "\n")

    def _call(kind, fn, args, kwargs, info=None, after=None):
        ctx, rnd = list(_STACK), _ROUND[0]
        _STACK.append(kind)
        t0, p0 = time.time(), time.perf_counter()
        try:
            out = fn(*args, **kwargs)
        finally:
            _STACK.pop()
        rec = {"kind": kind, "ctx": ctx, "round": rnd, "t0": t0, "s": time.perf_counter() - p0}
        if kind in ("local", "sample"):  # a worker process runs no atexit: its peak so far
            rec["hwm"] = _hwm()
        rec.update(info or {})
        if after is not None:
            try:
                rec.update(after(out))
            except Exception:
                pass
        _emit(rec)
        return out

    def _timed(kind, fn, info=None):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            extra = None
            if info is not None:
                try:
                    extra = info(*a, **k)
                except Exception:
                    extra = None
            return _call(kind, fn, a, k, extra)
        return wrapper

    def _engine(m):
        orig = m.run_federated

        @functools.wraps(orig)
        def run_federated(strategy, model, clients, fl, seed, **kw):
            if kw.get("evaluate") is not None:
                kw["evaluate"] = _timed("eval", kw["evaluate"])
            select = strategy.select_clients

            def select_clients(state, round_, *a, **k):
                _ROUND[0] = int(round_)
                _emit({"kind": "round", "r": int(round_), "t": time.time()})
                return _call("select", select, (state, round_) + a, k)

            strategy.select_clients = select_clients
            strategy.client_update = _timed("client", strategy.client_update,
                                            lambda p, c, data, *a, **k: {"n": len(data)})
            strategy.aggregate = _timed("aggregate", strategy.aggregate)
            strategy.server_update = _timed("server_update", strategy.server_update)
            info = {"name": getattr(strategy, "name", None), "sizes": [len(c) for c in clients],
                    "rounds": fl.rounds, "executor": getattr(fl, "executor", None)}
            try:
                return _call("federated", orig, (strategy, model, clients, fl, seed), kw, info)
            finally:
                _ROUND[0] = None

        m.run_federated = run_federated
        m.personal_models = _timed("personal", m.personal_models)
        m.save_checkpoint = _timed("ckpt", m.save_checkpoint)

    def _local(m):
        orig = m.local_train

        @functools.wraps(orig)
        def local_train(model, data, task, cfg, *a, **k):
            info = {"n": len(data), "epochs": cfg.epochs, "steps": cfg.steps, "batch": cfg.batch_size}
            return _call("local", orig, (model, data, task, cfg) + a, k, info,
                         lambda out: {"done": out.get("steps")})

        m.local_train = local_train

    def _diffusion(m):
        cls = m.DiffusionTask
        orig = cls.sample

        @functools.wraps(orig)
        def sample(self, model, n, **k):
            steps = k.get("steps") or self.num_train_timesteps
            if k.get("sampler", "ddpm") == "ddpm":
                steps = self.num_train_timesteps
            return _call("sample", orig, (self, model, n), k, {"n": int(n), "steps": int(steps)})

        cls.sample = sample

    def _tasks(m):
        cls = m.ClassificationTask
        orig = cls.correct_sets

        @functools.wraps(orig)
        def correct_sets(self, models, sets, *a, **k):
            return _call("correct_sets", orig, (self, models, sets) + a, k,
                         {"sets": len(sets), "models": len(models)})

        cls.correct_sets = correct_sets

    def _evaluate(m):
        m.evaluate_run = _timed("evalrun", m.evaluate_run)
        if hasattr(m, "corrupted_test_sets"):
            m.corrupted_test_sets = _timed("corrupt_build", m.corrupted_test_sets)

    def _cli(m):  # the stage's main as run_stage calls it: after the module-level imports
        orig = m.run_stage

        @functools.wraps(orig)
        def run_stage(main):
            @functools.wraps(main)
            def timed():
                t0, p0 = time.time(), time.perf_counter()
                try:
                    return main()
                finally:
                    _emit({"kind": "main", "stage": os.environ.get("DVC_STAGE"), "t0": t0,
                           "s": time.perf_counter() - p0})
            return orig(timed)

        m.run_stage = run_stage

    def _cut(key):  # a cut the estimate wrote in cuts.json beside this file (None: not cut)
        try:
            with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuts.json")) as f:
                return json.load(f).get(key)
        except (OSError, ValueError):
            return None

    def _datasets(m):  # the slice's test-split cut (--test-images)
        keep = _cut("test_images")
        if not keep:
            return
        orig = m.load_dataset

        @functools.wraps(orig)
        def load_dataset(cfg, *a, **k):
            import dataclasses

            import torch

            ds = orig(cfg, *a, **k)
            full = len(ds.test)
            if full > keep:  # evenly spaced, the same images in every stage
                idx = (torch.arange(keep, dtype=torch.float64, device=ds.test.x.device)
                       * full / keep).long()
                ds = dataclasses.replace(ds, test=type(ds.test)(ds.test.x[idx], ds.test.y[idx]))
            _emit({"kind": "test_cut", "full": full, "kept": len(ds.test), "t": time.time()})
            return ds

        m.load_dataset = load_dataset

    def _warmup(m):  # the warm-up's client cut (--clients)
        keep = _cut("warmup_clients")
        if not keep:
            return
        orig = m.train_client_ddpm

        @functools.wraps(orig)
        def train_client_ddpm(model, data, task, cfg, *a, **k):
            client = k.get("client")
            if client is None or client < keep:
                return orig(model, data, task, cfg, *a, **k)
            # not trained: the initial weights stand for the client's DDPM (the generation samples
            # from them as from a trained one); its steps are projected at the trained clients' time
            _emit({"kind": "warmup_skip", "client": int(client), "n": len(data),
                   "batch": cfg.batch_size, "t": time.time()})
            weights = {key: v.detach().cpu().clone() for key, v in model.state_dict().items()}
            return weights, [1.0]

        m.train_client_ddpm = train_client_ddpm

    def _feddf(m):  # the teachers' logits (FedDF, PerAda): once a round, one pass per teacher
        m.teacher_logits = _timed("teachers", m.teacher_logits,
                                  lambda teachers, x, *a, **k: {"teachers": len(teachers),
                                                                "n": len(x)})

    _PATCH = {"fedpipe.fl.engine": _engine, "fedpipe.fl.local": _local,
              "fedpipe.data.datasets": _datasets, "fedpipe.algorithms.feddf": _feddf,
              "fedpipe.pipeline.warmup": _warmup,
              "fedpipe.tasks.diffusion": _diffusion, "fedpipe.tasks": _tasks,
              "fedpipe.pipeline.evaluate": _evaluate, "fedpipe.cli": _cli}

    import importlib.abc

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name not in _PATCH:
                return None
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            run = spec.loader.exec_module

            def exec_module(module, _run=run, _name=name):
                _run(module)
                try:
                    _PATCH[_name](module)
                except Exception as e:
                    _emit({"kind": "probe_error", "module": _name, "error": repr(e)})

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Finder())
    _emit({"kind": "start", "t": time.time()})

    import atexit

    def _cuda():
        _emit({"kind": "mem", "hwm": _hwm(), "t": time.time()})
        t = sys.modules.get("torch")
        try:
            if t is not None and t.cuda.is_available() and t.cuda.is_initialized():
                _emit({"kind": "cuda", "max_allocated": int(t.cuda.max_memory_allocated())})
        except Exception:
            pass

    atexit.register(_cuda)

_chain()
'''


def read_events(folder: Path) -> list[dict[str, Any]]:
    events = []
    for f in sorted(folder.glob("events.*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:  # a worker killed mid-line
                    pass
    return events


# -- projection ----------------------------------------------------------------------------------
@dataclass
class LoopPlan:
    """What the full run's round loop does, for :func:`project_loop`."""

    rounds: int
    eval_every: int = 1
    checkpoint_every: int = 0
    checkpoint_seconds: float = 0.0
    batch: int = 1                 # the full run's local batch size (client sampling weights)
    cap: int | None = None         # the slice's local step cap (None: not cut)
    kd_factor: float = 1.0         # the server step's time times this (distillation steps cut)
    aux: tuple[int, int] | None = None  # (|A| in the slice, |A| in the full run)
    once_epochs: int | None = None  # server trainings of this many epochs run once per run
    unit: float = 0.0              # seconds per sampled image-step
    curve: int = 0                 # image-steps of one evaluation's sampling (full run)
    quicktest: tuple[int, int] = (0, 0)  # (tests in the full run, image-steps of one)
    final: int = 0                 # image-steps sampled after the loop (full run)
    clients: float = 1.0           # the full run's clients a round over the slice's (--clients)
    test: float = 1.0              # the full test split over the slice's (--test-images)


@dataclass
class Projection:
    slice_s: float
    fixed: float
    projected: float
    parts: dict[str, float] = field(default_factory=dict)
    note: str = ""


def eval_count(rounds: int, every: int) -> int:
    """Evaluated rounds of a run: every ``every``-th and the last."""
    return len({r for r in range(1, rounds + 1) if r % max(every, 1) == 0} | {rounds})


def checkpoint_count(rounds: int, every: int, seconds: float, round_s: float, eval_every: int,
                     eval_s: float) -> int:
    """Checkpoints of a run whose round takes ``round_s`` (``eval_s`` more when evaluated): every
    ``every`` rounds, after a round ending ``seconds`` after the last checkpoint, and the last."""
    n, since = 0, 0.0
    for r in range(1, rounds + 1):
        since += round_s + (eval_s if (r % max(eval_every, 1) == 0 or r == rounds) else 0.0)
        if (every > 0 and r % every == 0) or (seconds > 0 and since >= seconds) or r == rounds:
            n += 1
            since = 0.0
    return n


def _cut_extra(e: dict[str, Any], cap: int | None) -> float:
    """Seconds a ``local_train`` call the step cap cut would take more at its full steps
    (``epochs x ceil(n / batch)``; 0 for a call the cap did not cut)."""
    if cap is None or e.get("steps") != cap:
        return 0.0
    done = e.get("done") or e["steps"]
    full = e["epochs"] * math.ceil(e["n"] / e["batch"])
    return e["s"] * (full / done - 1.0) if done else 0.0


def _full_steps(e: dict[str, Any], cap: int | None) -> float:
    """The steps a ``local_train`` call takes in the full run: ``epochs x ceil(n / batch)`` when the
    slice's cap cut it, else the steps it did."""
    done = e.get("done") or e.get("steps") or 0
    if cap is not None and e.get("steps") == cap:
        return float(e["epochs"] * math.ceil(e["n"] / e["batch"]))
    return float(done)


def steady_steps(rows: Sequence[dict[str, Any]]) -> tuple[dict[tuple, float], float]:
    """({call kind: seconds per step}, one-time seconds) of ``local_train`` calls: a kind is
    (epochs, step cap, batch); its time per step is taken over its calls but the first, whose excess
    over that (torch's lazy set-up, the first use of the model) is paid once, not per call."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for e in sorted(rows, key=lambda e: e["t0"]):
        groups.setdefault((e["epochs"], e.get("steps"), e["batch"]), []).append(e)
    per_step, once = {}, 0.0
    for key, calls in groups.items():
        rest = calls[1:] if len(calls) > 1 else calls
        done = sum((c.get("done") or 0) for c in rest)
        t = sum(c["s"] for c in rest) / done if done else 0.0
        per_step[key] = t
        if len(calls) > 1:
            once += max(calls[0]["s"] - (calls[0].get("done") or 0) * t, 0.0)
    return per_step, once


def _key(e: dict[str, Any]) -> tuple:
    return (e["epochs"], e.get("steps"), e["batch"])


def _category(e: dict[str, Any], root: str) -> str | None:
    """The kind of the call directly under ``root`` that ``e`` ran in (``e``'s own when it is one)."""
    ctx = e.get("ctx") or []
    if root not in ctx:
        return None
    i = ctx.index(root)
    return ctx[i + 1] if i + 1 < len(ctx) else e["kind"]


def sampling_weight(sizes: Sequence[int], trained: Sequence[int], batch: int) -> float:
    """Mean of ``ceil(m / batch)`` over all clients over its mean over the round's ``trained``
    clients (1 when every client trained, or a trained size is no client's: pooled training)."""
    if not trained or not sizes or len(trained) >= len(sizes) or not set(trained) <= set(sizes):
        return 1.0
    steps = [math.ceil(m / batch) for m in sizes]
    took = [math.ceil(m / batch) for m in trained]
    return (sum(steps) / len(steps)) / (sum(took) / len(took))


def project_loop(events: Sequence[dict[str, Any]], total: float, plan: LoopPlan) -> Projection:
    """A round-loop stage's projection (module docstring, "Round loops"): ``events`` are its
    probe's records, ``total`` its slice wall time."""
    feds = [e for e in events if e["kind"] == "federated"]
    if not feds:
        return Projection(total, total, total, note="no round loop ran")
    fed = feds[-1]
    pid = fed["pid"]
    mine = [e for e in events if e.get("pid") == pid]
    marks = sorted((e for e in mine if e["kind"] == "round"), key=lambda e: e["t"])
    end = fed["t0"] + fed["s"]
    samples_after = sum(e["s"] for e in mine if e["kind"] == "sample" and "federated" not in e["ctx"])
    if not marks:
        return Projection(total, total, total, note="no round ran")
    last_r, first_t, last_t = marks[-1]["r"], marks[0]["t"], marks[-1]["t"]
    loop_slice = end - first_t
    direct = [e for e in mine if (e.get("ctx") or [None])[-1] == "federated"]
    nested = [e for e in mine if e["kind"] in ("local", "sample", "teachers")
              and "federated" in e["ctx"]]
    last = [e for e in direct if e["round"] == last_r]

    def total_of(kind: str, rows: Iterable[dict[str, Any]]) -> float:
        return sum(e["s"] for e in rows if e["kind"] == kind)

    other = max((end - last_t) - sum(e["s"] for e in last), 0.0)
    # client updates of the last round: cut calls at their full steps, then client sampling
    last_nested = [e for e in nested if e["round"] == last_r]
    # (each call at the full steps, at the steady time per step of its kind of call: the first
    # call's excess, torch's set-up, counts once)
    client_local = [e for e in nested if e["kind"] == "local" and _category(e, "federated") == "client"]
    per_step, first_once = steady_steps(client_local)
    last_local = [e for e in client_local if e["round"] == last_r]
    client = (total_of("client", last) - sum(e["s"] for e in last_local)
              + sum(_full_steps(e, plan.cap) * per_step[_key(e)] for e in last_local))
    trained = [e["n"] for e in last if e["kind"] == "client" and "n" in e]
    client *= sampling_weight(fed.get("sizes") or [], trained, plan.batch) * plan.clients
    # the server step: sampling (QuickTest) apart, training on A scaled to the full A, once-per-run
    # trainings apart, the rest (distillation) by the kd factor
    server_rows = [e for e in last_nested if _category(e, "federated") == "server_update"]
    server = total_of("server_update", last)
    s_samples = sum(e["s"] for e in server_rows if e["kind"] == "sample")
    once = [e for e in server_rows if e["kind"] == "local" and plan.once_epochs is not None
            and e["epochs"] == plan.once_epochs]
    on_aux = [e for e in server_rows if e["kind"] == "local" and e not in once and plan.aux
              and e["n"] == plan.aux[0] and e.get("steps") is None]

    def aux_factor(e: dict[str, Any]) -> float:
        if not plan.aux or e["n"] != plan.aux[0] or e.get("steps") is not None:
            return 1.0
        return math.ceil(plan.aux[1] / e["batch"]) / math.ceil(plan.aux[0] / e["batch"])

    # the teachers' logits (distillation): one pass per round's client, whatever the KD steps
    teachers = sum(e["s"] for e in server_rows if e["kind"] == "teachers")
    base = (server - s_samples - teachers - sum(e["s"] for e in once)
            - sum(e["s"] for e in on_aux))
    server_round = (max(base, 0.0) * plan.kd_factor + teachers * plan.clients
                    + sum(e["s"] * aux_factor(e) for e in on_aux))
    once_s = sum(e["s"] * aux_factor(e) for e in once) + first_once
    per_round = (other + client + total_of("select", last)
                 + total_of("aggregate", last) * plan.clients + server_round)
    # evaluations and checkpoints over the whole slice loop
    evals = [e for e in direct if e["kind"] == "eval"]
    eval_rows = [e for e in nested if _category(e, "federated") in ("eval", "personal")]
    # what reads the test split times the full split over the slice's; sampling and training
    # (personal models' fine-tuning) apart
    eval_train = sum(e["s"] for e in eval_rows if e["kind"] == "local")
    eval_total = ((total_of("eval", direct) + total_of("personal", direct) - eval_train
                   - sum(e["s"] for e in eval_rows if e["kind"] == "sample")) * plan.test
                  + eval_train
                  + sum(_cut_extra(e, plan.cap) for e in eval_rows if e["kind"] == "local"))
    eval_each = (eval_total / len(evals) + plan.curve * plan.unit) if evals else 0.0
    ckpts = [e for e in direct if e["kind"] == "ckpt"]
    ckpt_each = total_of("ckpt", direct) / len(ckpts) if ckpts else 0.0
    n_eval = eval_count(plan.rounds, plan.eval_every) if evals else 0
    n_ckpt = checkpoint_count(plan.rounds, plan.checkpoint_every, plan.checkpoint_seconds,
                              per_round, plan.eval_every, eval_each) if ckpts else 0
    quick = plan.quicktest[0] * plan.quicktest[1] * plan.unit
    loop = (plan.rounds * per_round + n_eval * eval_each + n_ckpt * ckpt_each + once_s + quick)
    final = plan.final * plan.unit
    fixed = max(total - loop_slice - samples_after, 0.0)
    parts = {"per_round": per_round, "rounds": float(plan.rounds), "eval_each": eval_each,
             "evals": float(n_eval), "ckpt_each": ckpt_each, "checkpoints": float(n_ckpt),
             "once": once_s, "quicktest": quick, "final_sampling": final, "fixed": fixed}
    return Projection(total, fixed, fixed + loop + final, parts)


def test_ratio(events: Sequence[dict[str, Any]]) -> float:
    """The full test split over the slice's (``--test-images``; 1 when the stage loaded it whole)."""
    cut = [e for e in events if e["kind"] == "test_cut" and e.get("kept")]
    return cut[0]["full"] / cut[0]["kept"] if cut else 1.0


def project_part(total: float, part: float, factor: float) -> Projection:
    """A stage whose ``part`` seconds scale by ``factor`` and the rest is fixed."""
    part = min(max(part, 0.0), total)
    return Projection(total, total - part, total - part + part * factor,
                      {"scaled_part": part, "factor": factor})


def project_warmup(events: Sequence[dict[str, Any]], total: float, epochs: int) -> Projection:
    """The warm-up: the slice plus the steps it did not do (each client ``epochs x ceil(n / batch)``
    in the full run; a client the ``--clients`` cut left untrained, a ``warmup_skip`` event, all of
    them) at the steady time per step, spread over the worker processes."""
    rows = [e for e in events if e["kind"] == "local"]
    skipped = [e for e in events if e["kind"] == "warmup_skip"]
    if not rows:
        return Projection(total, total, total, note="no client trained")
    pids = {e["pid"] for e in rows}
    t_steps = []
    for pid in pids:  # each process's first call carries its set-up
        per_step, _ = steady_steps([e for e in rows if e["pid"] == pid])
        t_steps += list(per_step.values())
    t = sum(t_steps) / len(t_steps)
    done = sum((e.get("done") or 0) for e in rows)
    full = sum(epochs * math.ceil(e["n"] / e["batch"]) for e in rows + skipped)
    extra = max(full - done, 0) * t / len(pids)
    return Projection(total, total, total + extra,
                      {"scaled_part": done * t / len(pids), "factor": full / done if done else 1.0})


def workers_wall(events: Sequence[dict[str, Any]], kind: str) -> tuple[float, int]:
    """(wall seconds of the ``kind`` calls spread over their processes, process count)."""
    rows = [e for e in events if e["kind"] == kind]
    pids = {e["pid"] for e in rows}
    return (sum(e["s"] for e in rows) / len(pids), len(pids)) if pids else (0.0, 0)


def sample_unit(events: Sequence[dict[str, Any]], main_pid: int | None = None) -> float | None:
    """Seconds per image-step of the largest sampling call of ``events`` (those of process
    ``main_pid`` when given; None without one)."""
    rows = [e for e in events if e["kind"] == "sample" and e["n"]
            and (main_pid is None or e.get("pid") == main_pid)]
    if not rows:
        return None
    big = max(rows, key=lambda e: (e["n"], e["steps"]))
    return big["s"] / (big["n"] * big["steps"])


# -- the slice -----------------------------------------------------------------------------------
@dataclass
class Cuts:
    """The slice's overrides and, per cut, the printed line."""

    overrides: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    local_cap: int | None = None
    ddpm_cap: int | None = None
    warmup_cap: int | None = None
    slice_rounds: int = 1
    aux_slice_ratio: float | None = None
    kd: dict[str, tuple[int, int]] = field(default_factory=dict)  # algorithm -> (full, slice)
    corruption_pairs: tuple[int, int] | None = None  # (full, slice)
    clients: dict[str, tuple[int, int]] = field(default_factory=dict)  # section -> clients a round
    #   (full, slice) where --clients cut them (fl, diffusion_fl)
    test_images: int | None = None  # the slice's test split (--test-images; the probe cuts it)
    warmup_clients: tuple[int, int] | None = None  # (full, slice) clients the warm-up trains
    #   (--clients; the probe skips the others' training)

    def add(self, key: str, value: Any, line: str | None = None) -> None:
        self.overrides.append(override(key, value))
        if line:
            self.lines.append(line)

    @classmethod
    def from_state(cls, c: dict[str, Any]) -> Cuts:
        """The cuts as :data:`STATE` records them (JSON: tuples came back as lists)."""
        pairs = {"kd": {k: tuple(v) for k, v in (c.get("kd") or {}).items()},
                 "clients": {k: tuple(v) for k, v in (c.get("clients") or {}).items()}}
        tuples = {k: tuple(c[k]) if c.get(k) else None
                  for k in ("corruption_pairs", "warmup_clients")}
        return cls(**{**c, **pairs, **tuples})

    def set(self, key: str, value: Any) -> None:
        """``key=value`` in place of an earlier override of ``key``."""
        self.overrides = [o for o in self.overrides if not o.startswith(key + "=")]
        self.overrides.append(override(key, value))


def algorithm_configs(params: dict[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """Each named method's resolved config (its dataclass, the study's section over its defaults)."""
    from fedpipe.algorithms import algorithm_config

    sections = params.get("algorithms") or {}
    return {n: algorithm_config(n, sections.get(n)) for n in names}


def uses_diffusion(params: dict[str, Any]) -> bool:
    from fedpipe.pipeline.plan import uses_diffusion as plan_uses

    return plan_uses(params)


def train_size(params: dict[str, Any]) -> int:
    from fedpipe.config import dataset_config

    return int(dataset_config(params.get("dataset")).train_size())


def aux_batch(params: dict[str, Any]) -> int:
    """The largest batch a server training on the auxiliary set uses (FedDDPM's, FedDDPM+'s
    ``server_batch_size``, aux_only's ``diffusion_fl.local.batch_size``)."""
    study = params.get("study") or {}
    cfgs = algorithm_configs(params, study.get("diffusion_algorithms") or [])
    sizes = [getattr(c, "server_batch_size", 0) for c in cfgs.values()]
    if "aux_only" in cfgs:
        sizes.append(int(get(params, "diffusion_fl.local.batch_size", 1)))
    return max(sizes + [int(get(params, "diffusion_fl.local.batch_size", 1))])


def clients_a_round(n: int, participation: Any) -> int:
    """Clients a round trains of ``n`` at ``participation``: the engine's rule
    (``FLConfig.clients_per_round``)."""
    from fedpipe.config.fl import FLConfig

    return FLConfig(participation=float(participation)).clients_per_round(n)


def client_cuts(full: dict[str, Any], cuts: Cuts, clients: int) -> None:
    """``--clients K``: each round of the slice trains K clients where the study trains more
    (``<section>.participation = K / N``); its client updates and aggregation, and the teachers'
    logits of a distillation (one teacher per client), are projected times the full run's clients
    a round over K."""
    n = int(get(full, "partition.num_clients", 1))
    study = full.get("study") or {}
    tracks = [("fl", "algorithms"), ("diffusion_fl", "diffusion_algorithms")]
    for section, key in tracks:
        if not study.get(key) or not has(full, f"{section}.participation"):
            continue
        k_full = clients_a_round(n, get(full, f"{section}.participation"))
        k, why = fewest_clients(full, study[key], n, clients, k_full)
        if k_full <= k:
            continue
        p = f"{k / n:.6g}"
        cuts.add(f"{section}.participation", p,
                 f"{section}.participation: {get(full, f'{section}.participation')} -> {p} "
                 f"({k_full} -> {k} clients a round of {n}{why}; client updates, aggregation and "
                 f"the teachers of a distillation projected x{k_full / k:.3g})")
        cuts.clients[section] = (k_full, k)


def fewest_clients(full: dict[str, Any], names: Sequence[str], n: int, k: int, k_full: int
                   ) -> tuple[int, str]:
    """(the fewest clients a round, from ``k`` up, that every method of ``names`` accepts
    (``Strategy.check_clients``: Equitable-FL's C clusters need C clients a round), and why it is
    more than ``k``)."""
    from fedpipe.algorithms import ALGORITHMS
    from fedpipe.config import ConfigError

    cfgs = algorithm_configs(full, names)
    first = None
    for kk in range(max(k, 1), k_full):
        try:
            for name, cfg in cfgs.items():
                ALGORITHMS[name].check_clients(cfg, n, kk)
        except ConfigError as e:
            first = first or f"{e.key}={e.value!r}"
            continue
        return kk, (f" (not {k}: {first})" if first else "")
    return k_full, ""


def slice_cuts(full: dict[str, Any], clients: int | None = None,
               test_images: int | None = None) -> Cuts:
    """The slice's overrides of the full params, except the local step caps (:func:`step_caps`);
    ``clients``: :func:`client_cuts`; ``test_images``: the test split's images in the slice (the
    probe keeps that many, evenly spaced; evaluation projected times the full split over them)."""
    cuts = Cuts()
    if clients:
        client_cuts(full, cuts, clients)
    if test_images:
        cuts.test_images = int(test_images)
        cuts.lines.append(f"test split: every image -> {test_images} images, evenly spaced (the "
                          "evaluations, local test sets and corrupted sets shrink with it; "
                          "evaluation projected times the full split over them)")
    study = full.get("study") or {}
    seeds = list(study.get("seeds") or [0])
    s = seeds[0]
    cuts.add("study.seeds", [s], f"replicates: {len(seeds)} -> 1 (seed {s}); projected x{len(seeds)}")
    diffusion = uses_diffusion(full)
    if study.get("diffusion_seeds"):
        cuts.add("study.diffusion_seeds", [s])
    algos = list(study.get("algorithms") or [])
    cfgs = algorithm_configs(full, algos)
    window = max([int(getattr(c, "window", 0) or 0) for c in cfgs.values()] + [0])
    rounds = 1 + window
    cuts.slice_rounds = rounds
    why = f" (a method needs the model of {window} round(s) back: its server step starts then)" \
        if window else ""
    cuts.add("fl.rounds", rounds, f"fl.rounds: {get(full, 'fl.rounds')} -> {rounds}{why}")
    cuts.add("fl.eval_every", rounds)
    users = [a for a, c in cfgs.items() if getattr(c, "backbone", "none") == "fedavg"]
    for a in users:
        pre = getattr(cfgs[a], "pretrain_rounds", None)
        if pre is not None:
            cuts.add(f"algorithms.{a}.pretrain_rounds", 1)
    if users:
        pre = getattr(cfgs[users[0]], "pretrain_rounds", None)
        full_pre = pre if pre is not None else get(full, "fl.rounds")
        cuts.lines.append(f"backbone pretraining: {full_pre} -> "
                          f"{1 if pre is not None else rounds} round(s)")
    for a, c in cfgs.items():
        kd = getattr(c, "kd_steps", None)
        if kd and kd > KD_STEPS and getattr(c, "kd", True):  # PerAda without KD has kd false
            cuts.add(f"algorithms.{a}.kd_steps", KD_STEPS,
                     f"algorithms.{a}.kd_steps: {kd} -> {KD_STEPS} per round")
            cuts.kd[a] = (kd, KD_STEPS)
    corr, sev = list(study.get("corruptions") or []), list(study.get("severities") or [])
    if corr and len(corr) * len(sev) > CORRUPTION_PAIRS:
        keep_sev = sev[:CORRUPTION_PAIRS] if len(sev) >= CORRUPTION_PAIRS else sev
        keep_corr = corr[:max(1, CORRUPTION_PAIRS // max(len(keep_sev), 1))]
        cuts.add("study.corruptions", keep_corr)
        cuts.add("study.severities", keep_sev)
        kept = len(keep_corr) * len(keep_sev)
        cuts.corruption_pairs = (len(corr) * len(sev), kept)
        cuts.lines.append(f"shift evaluation: {len(corr)} corruptions x {len(sev)} severities -> "
                          f"{', '.join(keep_corr)} x {keep_sev}")
    if diffusion:
        if study.get("diffusion_algorithms"):
            cuts.add("diffusion_fl.rounds", 1,
                     f"diffusion_fl.rounds: {get(full, 'diffusion_fl.rounds')} -> 1")
            cuts.add("diffusion_fl.eval_every", 1)
        cuts.add("warmup.epochs", 1, f"warmup.epochs: {get(full, 'warmup.epochs')} -> 1")
        n = int(get(full, "partition.num_clients", 1))
        if clients and clients < n and study.get("diffusion_seeds"):
            cuts.warmup_clients = (n, int(clients))
            cuts.lines.append(
                f"warm-up: {n} -> {clients} clients trained (clients 0-{clients - 1}); the others keep "
                "their initial weights, and the generation samples from them as from trained ones; "
                "their steps projected at the trained clients' time per step")
        steps = SAMPLE_STEPS
        cuts.add("generate.sampler", "ddim")
        cuts.add("generate.ddim_steps", steps)
        full_gen = _sampler_steps(full, "generate")
        m = train_size(full)
        a_full = round(float(get(full, "generate.ratio")) * m)
        target = aux_batch(full)
        if a_full > target:
            ratio = target / m
            cuts.add("generate.ratio", f"{ratio:.6g}")
            cuts.aux_slice_ratio = float(f"{ratio:.6g}")
        a_slice = round((cuts.aux_slice_ratio or float(get(full, "generate.ratio"))) * m)
        cuts.lines.append(f"auxiliary set: {a_full} images, {full_gen} steps -> {a_slice} images, "
                          f"ddim {steps} steps")
        cuts.add("fid.num_samples", FID_SAMPLES)
        cuts.add("fid.curve_samples", FID_SAMPLES)
        cuts.add("fid.sampler", "ddim")
        cuts.add("fid.curve_sampler", "ddim")
        cuts.add("fid.ddim_steps", steps)
        cuts.add("fid.classifier_epochs", 1)
        cuts.lines.append(f"FID: {get(full, 'fid.num_samples')} final / "
                          f"{get(full, 'fid.curve_samples')} curve images -> {FID_SAMPLES}, ddim "
                          f"{steps} steps; classifier epochs {get(full, 'fid.classifier_epochs')} -> 1")
    return cuts


def _sampler_steps(params: dict[str, Any], section: str, sampler_key: str = "sampler") -> int:
    """Denoising steps of ``<section>.<sampler_key>`` (all T for ``ddpm``, else ``ddim_steps``)."""
    t = int(get(params, "diffusion.num_train_timesteps", 1000))
    if get(params, f"{section}.{sampler_key}") == "ddpm":
        return t
    return min(int(get(params, f"{section}.ddim_steps", 50)), t)


def client_sizes(scratch: Path, seed: Any) -> list[int]:
    """The training-set sizes of the clients of the slice's partition (its ``clients.csv``)."""
    path = scratch / "data" / "partition" / f"seed_{seed}" / "clients.csv"
    with path.open() as f:
        return [int(float(row["size"])) for row in csv.DictReader(f)]


def _threads() -> None:
    """The thread count a stage would run with (``fedpipe.cli.set_threads``)."""
    from fedpipe.cli import set_threads

    set_threads()


def study_device(params: dict[str, Any]):
    """The device the study's stages train on (its ``device`` setting; ``auto``: CUDA when there)."""
    from fedpipe.device import resolve_device

    return resolve_device(str(params.get("device", "auto")))


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def step_seconds_classifier(params: dict[str, Any]) -> float:
    """Seconds of one local training step of the study's classifier at its batch size (random data
    of the dataset's shape; the faster of two steps after a first)."""
    import torch

    from fedpipe.config import dataset_config
    from fedpipe.models import build_model

    _threads()
    ds = dataset_config(params.get("dataset"))
    shape, classes = ds.in_shape(), ds.num_classes()
    dev = study_device(params)
    model = build_model(get(params, "model.name"), shape, classes,
                        **(get(params, "model.kwargs") or {})).to(dev)
    b = int(get(params, "fl.local.batch_size"))
    x, y = torch.randn(b, *shape, device=dev), torch.randint(0, classes, (b,), device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        _sync(dev)
        times.append(time.perf_counter() - t0)
    return min(times[1:])


def step_seconds_unet(params: dict[str, Any], batch: int) -> float:
    """Seconds of one Adam step of the study's DDPM noise predictor at ``batch`` (the second of
    two steps)."""
    import torch

    from fedpipe.config import dataset_config
    from fedpipe.models.unet import build_unet

    _threads()
    ds = dataset_config(params.get("dataset"))
    shape = ds.in_shape()
    cond = ds.num_classes() if get(params, "diffusion.conditional") else None
    dev = study_device(params)
    model = build_unet(get(params, "diffusion.unet"), shape, cond,
                       **(get(params, "diffusion.unet_kwargs") or {})).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(batch, *shape, device=dev)
    t = torch.randint(0, int(get(params, "diffusion.num_train_timesteps", 1000)), (batch,), device=dev)
    y = torch.randint(0, cond, (batch,), device=dev) if cond else None
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        opt.zero_grad()
        out = model(x, t, y) if y is not None else model(x, t)
        torch.nn.functional.mse_loss(out, x).backward()
        opt.step()
        _sync(dev)
        times.append(time.perf_counter() - t0)
    return times[-1]


def full_steps_per_client(sizes: Sequence[int], epochs: int, batch: int) -> float:
    return sum(epochs * math.ceil(m / batch) for m in sizes) / max(len(sizes), 1)


def choose_cap(sizes: Sequence[int], section: dict[str, Any], step_s: float, budget: float,
               pooled: bool = False) -> tuple[int | None, float]:
    """(the step cap that makes a round of ``section`` (fl / diffusion_fl) fit ``budget`` seconds at
    ``step_s`` per step, None when every round fits or the section caps steps already; the full
    run's mean steps per client). ``pooled``: a method of the study trains on every client's data
    pooled (Centralized), one "client" of ``epochs x ceil(sum m / batch)`` steps a round. The cap is
    at most the smallest client's steps, so that no client of the slice trains more than in the
    full run."""
    local = section.get("local") or {}
    batch, epochs = int(local.get("batch_size", 1)), int(local.get("epochs", 1))
    mean_steps = full_steps_per_client(sizes, epochs, batch)
    if local.get("steps") is not None:
        return None, float(local["steps"])
    per_round = clients_a_round(len(sizes), section.get("participation", 1.0))
    heaviest = per_round * mean_steps
    if pooled:
        heaviest = max(heaviest, epochs * math.ceil(sum(sizes) / batch))
    if heaviest * step_s <= budget:
        return None, mean_steps
    smallest = min(epochs * math.ceil(m / batch) for m in sizes if m > 0)
    return max(1, min(int(budget // (per_round * step_s)), smallest)), mean_steps


def pools_clients(names: Iterable[str]) -> bool:
    """Whether a method of ``names`` trains on the clients' data pooled (Centralized)."""
    from fedpipe.algorithms import ALGORITHMS
    from fedpipe.fl.strategy import Strategy

    return any(ALGORITHMS[n].training_clients is not Strategy.training_clients for n in names)


def step_caps(full: dict[str, Any], sizes: Sequence[int], cuts: Cuts, budget: float,
              fixed: int | None, log=print) -> None:
    """Add the local step caps to ``cuts``: ``fixed`` (``--local-steps``; 0 = none) or the largest
    count that fits ``budget`` seconds per round (one step of the model timed here); with the
    diffusion track, also the slice's FID sample count (:func:`fid_slice`)."""
    study = full.get("study") or {}
    unet_step: dict[int, float] = {}

    def unet_seconds(batch: int) -> float:
        if batch not in unet_step:
            log(f"timing one DDPM training step at batch {batch} ...")
            unet_step[batch] = step_seconds_unet(full, batch)
        return unet_step[batch]

    tracks = []
    if study.get("algorithms"):
        tracks.append(("fl", "classifier"))
    if study.get("diffusion_algorithms"):
        tracks.append(("diffusion_fl", "unet"))
    for section, model in tracks:
        sec = full.get(section) or {}
        if section in cuts.clients:  # the slice's round trains fewer clients (--clients)
            sec = {**sec, "participation": cuts.clients[section][1] / max(len(sizes), 1)}
        local = sec.get("local") or {}
        batch = int(local.get("batch_size", 1))
        mean_steps = full_steps_per_client(sizes, int(local.get("epochs", 1)), batch)
        if local.get("steps") is not None:
            continue
        if sec.get("executor", "serial") != "serial":  # the probe sees no client update to scale
            cuts.lines.append(f"{section}.local.steps: not cut ({section}.executor "
                              f"{sec.get('executor')}: the estimate scales the serial executor's)")
            continue
        step_s = None
        if fixed is not None:
            cap = fixed or None
        else:
            if model == "classifier":
                log(f"timing one training step of the classifier at batch {batch} ...")
                step_s = step_seconds_classifier(full)
            else:
                step_s = unet_seconds(batch)
            names = study.get("algorithms" if section == "fl" else "diffusion_algorithms") or []
            cap, _ = choose_cap(sizes, sec, step_s, budget, pools_clients(names))
        if cap is None:
            continue
        per_round = clients_a_round(len(sizes), sec.get("participation", 1.0))
        timed = (f"; one step {step_s:.2f} s here, {per_round} clients per round, budget "
                 f"{budget:.0f} s" if step_s is not None else "")
        cuts.add(f"{section}.local.steps", cap,
                 f"{section}.local.steps: null -> {cap} per client (full: {local.get('epochs')} "
                 f"epoch(s), {mean_steps:.1f} steps per client on average{timed})")
        if section == "fl":
            cuts.local_cap = cap
        else:
            cuts.ddpm_cap = cap
    if not study.get("diffusion_seeds"):
        return
    if has(full, "warmup.steps") and get(full, "warmup.steps") is None and fixed != 0:
        cap = fixed or 1
        cuts.add("warmup.steps", cap, f"warmup.steps: null -> {cap} per client")
        cuts.warmup_cap = cap
    elif fixed != 0:
        b = int(get(full, "warmup.batch_size", 1))
        steps = sum(math.ceil(m / b) for m in sizes)
        cuts.lines.append(f"warm-up: no step cap in the library (warmup.steps): its one epoch runs "
                          f"whole, {steps} steps over {len(sizes)} clients")
    if fixed is None:
        batch = int(get(full, "diffusion_fl.local.batch_size", 32))
        n, steps = fid_slice(unet_seconds(batch) / (3 * batch), int(get(full, "fid.batch_size", 256)),
                             int(get(full, "diffusion.num_train_timesteps", 1000)))
        cuts.set("fid.num_samples", n)
        cuts.set("fid.curve_samples", n)
        cuts.set("fid.ddim_steps", steps)
        cuts.lines = [ln for ln in cuts.lines if not ln.startswith("FID:")]
        cuts.lines.append(f"FID: {get(full, 'fid.num_samples')} final / "
                          f"{get(full, 'fid.curve_samples')} curve images, "
                          f"{_sampler_steps(full, 'fid')} / {_sampler_steps(full, 'fid', 'curve_sampler')}"
                          f" steps -> {n} images, ddim {steps} steps (one sampling call about "
                          f"{SAMPLE_BUDGET:.0f} s here); classifier epochs "
                          f"{get(full, 'fid.classifier_epochs')} -> 1")


SAMPLE_BUDGET = 10.0
"""Seconds one sampling call of the slice may take: a call of a cheap model samples more images
and steps, so that its per-call set-up does not dominate the time per image-step."""


def fid_slice(image_forward_s: float, batch: int, timesteps: int) -> tuple[int, int]:
    """(images, DDIM steps) of one FID sampling call in the slice: images up to one sampling batch,
    then steps, within :data:`SAMPLE_BUDGET` at ``image_forward_s`` per image and step; at least
    :data:`FID_SAMPLES` images and :data:`SAMPLE_STEPS` steps."""
    per = max(image_forward_s, 1e-9)
    n = int(min(batch, max(FID_SAMPLES, SAMPLE_BUDGET // (SAMPLE_STEPS * per))))
    steps = int(min(20, timesteps, max(SAMPLE_STEPS, SAMPLE_BUDGET // (n * per))))
    return n, steps


# -- running the stages --------------------------------------------------------------------------
@dataclass
class StageRun:
    address: str
    name: str
    seconds: float
    peak_mib: float
    rc: int
    error: str = ""
    gpu_mib: float | None = None
    log: str = ""
    cpu_s: float = 0.0
    out_mib: float = 0.0  # what the stage wrote under data/ (its outputs; resume checkpoints apart)


def data_mib(scratch: Path) -> float:
    """MiB of the files under ``scratch/data`` but its resume checkpoints and the linked raw data."""
    data = scratch / "data"
    total = 0
    for d, dirs, files in os.walk(data):
        if Path(d) == data:
            dirs[:] = [x for x in dirs if x not in ("checkpoints", "raw")]
        total += sum((Path(d) / f).lstat().st_size for f in files)
    return total / 2**20


def setup_scratch(root: Path, scratch: Path, stand_in: bool) -> Path:
    """The scratch folder the stages run in: ``stages`` linked to the repo's (the plan stage hashes
    their code), ``data/raw`` linked when real data is read, the probe as ``_site/sitecustomize.py``;
    returns the probe's folder."""
    scratch.mkdir(parents=True, exist_ok=True)
    for name in ("stages", "dvc.yaml"):  # the plan hashes stages/; a skipped stage reads dvc.yaml
        link = scratch / name
        if not link.exists():
            link.symlink_to(root / name, target_is_directory=name == "stages")
    (scratch / "data").mkdir(exist_ok=True)
    raw = root / "data" / "raw"
    if not stand_in and raw.is_dir() and not (scratch / "data" / "raw").exists():
        (scratch / "data" / "raw").symlink_to(raw, target_is_directory=True)
    site = scratch / "_site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(PROBE.lstrip())
    return site


def last_error(text: str) -> str:
    """A failed stage's one line: its ``error:`` line, else its last non-empty line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("error:"):
            return ln
    return lines[-1] if lines else "(no output)"


def run_stage_process(root: Path, scratch: Path, site: Path, spec: StageSpec) -> StageRun:
    """Run one stage as DVC would (its own process, ``DVC_STAGE`` set, in ``scratch``); measure its
    wall time and peak RSS."""
    probe = scratch / "_probe" / spec.address
    if probe.exists():
        shutil.rmtree(probe)
    probe.mkdir(parents=True)
    logs = scratch / "_logs"
    logs.mkdir(exist_ok=True)
    log_path = logs / f"{spec.address}.log"
    env = dict(os.environ)
    env.update({"DVC_STAGE": spec.address, "FEDPIPE_TRACKING": "off", PROBE_ENV: str(probe),
                "PYTHONPATH": os.pathsep.join([str(site), str(root / "src")]
                                              + [p for p in [env.get("PYTHONPATH")] if p])})
    cmd = [sys.executable, str(root / "stages" / f"{spec.name}.py")]
    with log_path.open("w") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=scratch, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except KeyboardInterrupt:  # stop the stage as a Ctrl-C would, then let the caller report
            import signal

            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        seconds = time.perf_counter() - t0
    rc = os.waitstatus_to_exitcode(status)
    proc.returncode = rc  # reaped by wait4
    text = log_path.read_text(errors="replace")
    events = read_events(probe)
    gpu = [e["max_allocated"] for e in events if e["kind"] == "cuda"]
    peak = tree_peak(events)
    return StageRun(spec.address, spec.name, seconds,
                    peak / 2**20 if peak else usage.ru_maxrss / 1024.0, rc,
                    last_error(text) if rc else "", max(gpu) / 2**20 if gpu else None, str(log_path),
                    usage.ru_utime + usage.ru_stime)


def tree_peak(events: Sequence[dict[str, Any]]) -> int | None:
    """Bytes: the sum over the stage's processes (the stage and its workers) of each one's own
    peak RSS (``VmHWM``, the largest the probe saw), an upper bound of the tree's peak; None
    without a reading (then ``wait4``'s ``ru_maxrss``, which counts the parent's size at ``exec``)."""
    peaks: dict[int, int] = {}
    for e in events:
        if e.get("hwm"):
            peaks[e["pid"]] = max(peaks.get(e["pid"], 0), int(e["hwm"]))
    return sum(peaks.values()) if peaks else None


# -- the estimate --------------------------------------------------------------------------------
@dataclass
class Row:
    address: str
    name: str
    slice_s: float
    cpu_s: float
    replicate_s: float
    multiplier: int
    study_s: float
    peak_mib: float
    gpu_mib: float | None
    note: str
    parts: dict[str, float] = field(default_factory=dict)
    out_mib: float = 0.0  # the stage's outputs in the slice (model files at their full size)


@dataclass
class Estimate:
    study: str
    device: str
    scratch: str
    rows: list[Row]
    cuts: list[str]
    overrides: list[str]
    replicate_s: float
    study_s: float
    slice_s: float
    seeds: int
    failed: str | None = None
    error: str = ""
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average when the slice began and ended


def _events(scratch: Path, address: str) -> list[dict[str, Any]]:
    return read_events(scratch / "_probe" / address)


def _main_pid(events: Sequence[dict[str, Any]]) -> int | None:
    starts = sorted((e for e in events if e["kind"] == "start"), key=lambda e: e["t"])
    return starts[0]["pid"] if starts else None


def project_stage(run: StageRun, spec: StageSpec, full: dict[str, Any], cuts: Cuts,
                  events: Sequence[dict[str, Any]], unit: float | None, sizes: Sequence[int],
                  n_seeds: int) -> tuple[Projection, Projection | None]:
    """(the one-replicate projection of a stage, and for ``evaluate`` the whole study's)."""
    name, total = spec.name, run.seconds
    study = full.get("study") or {}
    if name in ("federate", "backbone", "federate_ddpm"):
        ddpm = name == "federate_ddpm"
        sec = full.get("diffusion_fl" if ddpm else "fl") or {}
        algo = spec.item.get("algorithm", "fedavg")
        rounds = int(sec.get("rounds", 1))
        if name == "backbone":
            users = [a for a, c in algorithm_configs(full, study.get("algorithms") or []).items()
                     if getattr(c, "backbone", "none") == "fedavg"]
            pre = getattr(algorithm_configs(full, users[:1]).get(users[0]), "pretrain_rounds",
                          None) if users else None
            rounds = int(pre) if pre is not None else rounds
        plan = LoopPlan(rounds=rounds, eval_every=int(sec.get("eval_every", 1)),
                        checkpoint_every=int(sec.get("checkpoint_every", 0) or 0),
                        checkpoint_seconds=float(sec.get("checkpoint_seconds", 0) or 0),
                        batch=int((sec.get("local") or {}).get("batch_size", 1)),
                        cap=cuts.ddpm_cap if ddpm else cuts.local_cap, unit=unit or 0.0)
        if algo in cuts.kd and name == "federate":
            plan.kd_factor = cuts.kd[algo][0] / cuts.kd[algo][1]
        section = "diffusion_fl" if ddpm else "fl"
        if section in cuts.clients and not pools_clients([algo]):
            k_full, k_slice = cuts.clients[section]
            plan.clients = k_full / k_slice
        plan.test = test_ratio(events)
        if ddpm:
            m = sum(sizes)
            a_full = round(float(get(full, "generate.ratio")) * m)
            a_slice = round(cuts.aux_slice_ratio * m) if cuts.aux_slice_ratio else a_full
            plan.aux = (a_slice, a_full) if a_slice != a_full else None
            cfg = algorithm_configs(full, [algo])[algo]
            if hasattr(cfg, "correction_epochs"):
                plan.once_epochs = int(cfg.correction_epochs)
            if hasattr(cfg, "test_size") and hasattr(cfg, "test_every"):
                plan.quicktest = (rounds // int(cfg.test_every),
                                  int(cfg.test_size) * _sampler_steps(full, "fid"))
            plan.curve = int(get(full, "fid.curve_samples")) * _sampler_steps(full, "fid",
                                                                              "curve_sampler")
            plan.final = int(get(full, "fid.num_samples")) * _sampler_steps(full, "fid")
        return project_loop(events, total, plan), None
    if name == "warmup":
        return project_warmup(events, total, int(get(full, "warmup.epochs", 1))), None
    if name == "generate":
        wall, _ = workers_wall(events, "sample")
        rows = [e for e in events if e["kind"] == "sample"]
        img_steps = sum(e["n"] * e["steps"] for e in rows)
        if not rows:
            return project_part(total, 0.0, 1.0), None
        u = unit if unit else wall / img_steps
        a_full = round(float(get(full, "generate.ratio")) * sum(sizes))
        full_part = a_full * _sampler_steps(full, "generate") * u
        wall = min(wall, total)
        return Projection(total, total - wall, total - wall + full_part,
                          {"sampling": wall, "sampling_full": full_part}), None
    if name == "feature_extractor":
        rows = [e for e in events if e["kind"] == "local"]
        e_full = int(get(full, "fid.classifier_epochs", 1))
        part = sum(e["s"] for e in rows)
        factor = e_full / rows[0]["epochs"] if rows else 1.0
        return project_part(total, part, factor), None
    if name == "evaluate":
        f = (cuts.corruption_pairs[0] / cuts.corruption_pairs[1]) if cuts.corruption_pairs else 1.0
        kept = cuts.corruption_pairs[1] if cuts.corruption_pairs else None
        corr = [e for e in events if e["kind"] == "correct_sets" and "evalrun" in e["ctx"]
                and kept is not None and e["sets"] == kept]
        build = sum(e["s"] for e in events if e["kind"] == "corrupt_build")
        runs = sum(e["s"] for e in events if e["kind"] == "evalrun")
        t = test_ratio(events)  # scoring and the corrupted sets read the test split
        fixed = total - runs - build
        per_run = (runs + sum(e["s"] for e in corr) * (f - 1.0)) * t
        one = fixed + per_run + build * f * t
        p1 = Projection(total, fixed, one, {"per_replicate_scoring": per_run,
                                            "corrupted_factor": f, "test_factor": t})
        pn = Projection(total, fixed, one + per_run * (n_seeds - 1),
                        {"per_replicate_scoring": per_run, "replicates": float(n_seeds)})
        return p1, pn
    return Projection(total, total, total), None


def _fmt_s(s: float) -> str:
    return f"{s:,.0f}" if s >= 100 else f"{s:,.1f}"


def human(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def note_of(spec: StageSpec, p: Projection) -> str:
    parts = p.parts
    if "per_round" in parts:  # rounds x s per round + evaluations x s each + QuickTest + final FID
        bits = [f"{parts['rounds']:.0f}r x {_fmt_s(parts['per_round'])}"]
        if parts.get("evals"):
            bits.append(f"{parts['evals']:.0f}ev x {_fmt_s(parts['eval_each'])}")
        sampled = parts.get("quicktest", 0.0) + parts.get("final_sampling", 0.0)
        if sampled:
            bits.append(f"FID {_fmt_s(sampled)}")
        return ", ".join(bits)
    if "factor" in parts and parts["factor"] != 1.0:
        return f"{_fmt_s(parts['scaled_part'])} x {parts['factor']:.4g}"
    if "sampling_full" in parts:
        return f"sampling {_fmt_s(parts['sampling'])} -> {_fmt_s(parts['sampling_full'])}"
    if "corrupted_factor" in parts and parts["corrupted_factor"] != 1.0:
        return f"corrupted x {parts['corrupted_factor']:.4g}"
    return "as measured"


def table(est: Estimate) -> str:
    """The estimate as text within 120 columns: per stage its slice's wall and CPU seconds, its
    projection for one replicate, the replicates it runs in the study (x), the study's seconds, its
    peak memory and what was scaled (``200r x 38.5, 10ev x 112``: 200 rounds of 38.5 s and 10
    evaluations of 112 s; ``FID``: the final FID's and QuickTest's sampling, s; ``a x f``: a part
    of ``a`` s times ``f``)."""
    gpu = any(r.gpu_mib is not None for r in est.rows)
    head = (f"{'stage':<28} {'slice s':>9} {'cpu s':>7} {'replicate s':>13} {'x':>3} "
            f"{'study s':>13} "
            f"{'peak MiB':>9}{' GPU MiB' if gpu else ''}  scaled (s)")
    lines = [head, "-" * min(len(head) + 20, 120)]
    for r in est.rows:
        g = f" {r.gpu_mib:>7.0f}" if gpu and r.gpu_mib is not None else (" " * 8 if gpu else "")
        line = (f"{r.address[:28]:<28} {_fmt_s(r.slice_s):>9} {_fmt_s(r.cpu_s):>7} "
                f"{_fmt_s(r.replicate_s):>13} "
                f"{r.multiplier:>3} {_fmt_s(r.study_s):>13} {r.peak_mib:>9.0f}{g}  {r.note}")
        lines.append(line[:120])
    lines.append("-" * min(len(head) + 20, 120))
    lines.append(f"{'total':<28} {_fmt_s(est.slice_s):>9} {_fmt_s(sum(r.cpu_s for r in est.rows)):>7} "
                 f"{_fmt_s(est.replicate_s):>13} "
                 f"{'':>3} {_fmt_s(est.study_s):>13} "
                 f"{max((r.peak_mib for r in est.rows), default=0):>9.0f}")
    return "\n".join(lines)


def device_line(full: dict[str, Any]) -> str:
    import torch

    want = str(full.get("device", "auto"))
    cuda = torch.cuda.is_available() and want != "cpu"
    if cuda:
        return f"cuda ({torch.cuda.get_device_name(0)})"
    from fedpipe.cli import DEFAULT_THREADS, THREADS_ENV

    threads = os.environ.get(THREADS_ENV, "").strip() or str(DEFAULT_THREADS)  # as a stage sets it
    return f"cpu ({os.cpu_count()} cores, torch threads {threads})"


class EstimateError(Exception):
    """A request the estimate cannot serve (one line, exit code 2)."""


STATE = "_estimate.json"
"""The slice's record in its scratch folder (params, cuts, each stage's measurements), from which
:func:`project_scratch` projects it again (``--project-only``)."""


def _save_state(scratch: Path, state: dict[str, Any]) -> None:
    tmp = scratch / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(scratch / STATE)


def estimate(study: str, overrides: Sequence[str] = (), stand_in: bool | None = None,
             scratch: Path | None = None, root: Path | None = None, local_steps: int | None = None,
             budget: float = ROUND_BUDGET, log=print, resume: bool = False,
             clients: int | None = None, test_images: int | None = None) -> Estimate:
    """Run the slice of ``study`` in ``scratch`` (a new temporary folder if None; kept) and project
    it. ``stand_in`` None: on for a torchvision dataset. ``resume``: ``scratch`` holds a slice of
    the same study and overrides that stopped (a failure, Ctrl-C, a killed process): its
    finished stages are kept and the others run."""
    from fedpipe.config.core import load_params

    root = (root or repo_root()).resolve()
    scratch = Path(scratch or tempfile.mkdtemp(prefix=f"fedpipe-estimate-{study}-")).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    base = [f"study={study}", *overrides]
    state: dict[str, Any] | None = None
    if resume and (scratch / STATE).is_file():
        state = json.loads((scratch / STATE).read_text())
        if state["study"] != study or state["base"][:len(base)] != base:
            raise EstimateError(f"{scratch} holds a slice of {' '.join(state['base'])}, not of "
                             f"{' '.join(base)}: --resume needs the same study and overrides")
        asked = state.get("asked")  # None: recorded before the flags were
        for flag, value in (("clients", clients), ("test_images", test_images)):
            was = asked.get(flag) if asked is not None else value
            if value is not None and value != was:
                raise EstimateError(
                    f"--{flag.replace('_', '-')} {value}: the slice in {scratch} was cut with "
                    + (f"--{flag.replace('_', '-')} {was}" if was is not None else "no such cut")
                    + "; --resume keeps its cuts (leave the flag out, or start a new slice)")
    if state is not None:
        log(f"resuming the slice in {scratch}")
        base = state["base"]
        full = load_params(scratch / "params.full.yaml")
        cuts = Cuts.from_state(state["cuts"])
        slice_params = load_params(scratch / "params.yaml")
        state["runs"] = [r for r in state["runs"] if r["rc"] == 0]
        state["failed"], state["error"] = None, ""
    else:
        log(f"composing {study} (as dvc exp run -S study={study}"
            f"{''.join(' -S ' + o for o in overrides)}) in {scratch}")
        full = compose(root, base, scratch / "params.full.yaml")
        name = get(full, "dataset.name")
        if stand_in is None:
            stand_in = name in TORCHVISION
        if stand_in and name in TORCHVISION and not get(full, "dataset.stand_in", False):
            base.append("dataset.stand_in=true")
            full = compose(root, base, scratch / "params.full.yaml")
        cuts = slice_cuts(full, clients, test_images)
        slice_params = compose(root, base + cuts.overrides, scratch / "params.yaml")
    site = setup_scratch(root, scratch, bool(get(full, "dataset.stand_in", False)))
    (site / "cuts.json").write_text(json.dumps(  # the probe's
        {"test_images": cuts.test_images,
         "warmup_clients": cuts.warmup_clients[1] if cuts.warmup_clients else None}))
    specs = pipeline(root, slice_params)
    dev = device_line(full)
    log(f"device: {dev}; dataset {get(full, 'dataset.name')}"
        f"{' (stand-in)' if get(full, 'dataset.stand_in') else ''}")
    if state is None:
        state = {"study": study, "root": str(root), "base": base, "device": dev,
                 "cuts": asdict(cuts), "asked": {"clients": clients, "test_images": test_images},
                 "sizes": [], "runs": [], "load": [os.getloadavg()[0], 0.0],
                 "failed": None, "error": ""}
    done = {r["address"] for r in state["runs"]}
    first_seed = (get(slice_params, "study.seeds") or [0])[0]
    size = data_mib(scratch)  # the outputs so far: each stage's own are what it adds
    for i, spec in enumerate(specs, 1):
        if spec.address in done:
            continue
        log(f"[{i}/{len(specs)}] {spec.address} ...")
        try:
            run = run_stage_process(root, scratch, site, spec)
        except KeyboardInterrupt:  # the stages so far are still projected
            state["failed"], state["error"] = spec.address, "interrupted (Ctrl-C)"
            log(f"[{i}/{len(specs)}] {spec.address}: interrupted; projecting the stages before it")
            break
        now = data_mib(scratch)
        run.out_mib, size = max(now - size, 0.0), now
        # a finished stage's resume checkpoints are not read again: at paper size they are as large
        # as its outputs (FedDDPM's warm-up: one UNet per client, 100 of them)
        shutil.rmtree(scratch / "data" / "checkpoints", ignore_errors=True)
        state["runs"].append(asdict(run))
        state["load"][1] = os.getloadavg()[0]
        _save_state(scratch, state)
        log(f"[{i}/{len(specs)}] {spec.address}: {run.seconds:.1f} s, peak {run.peak_mib:.0f} MiB"
            + (f", exit {run.rc}: {run.error}" if run.rc else ""))
        if run.rc:
            state["failed"], state["error"] = spec.address, run.error
            break
        if spec.name == "partition" and not state["sizes"]:  # the sizes decide the step caps
            state["sizes"] = client_sizes(scratch, first_seed)
            step_caps(full, state["sizes"], cuts, budget, local_steps, log)
            compose(root, base + cuts.overrides, scratch / "params.yaml")
            state["cuts"] = asdict(cuts)
            for line in cuts.lines:
                log(f"  slice: {line}")
    state["load"][1] = os.getloadavg()[0]
    _save_state(scratch, state)
    return project_scratch(scratch)


def project_scratch(scratch: Path) -> Estimate:
    """The estimate of the slice recorded in ``scratch`` (:data:`STATE`): every stage that ran,
    projected by the rules of this module."""
    scratch = Path(scratch).resolve()
    state = json.loads((scratch / STATE).read_text())
    root = Path(state["root"])
    from fedpipe.config.core import load_params

    full = load_params(scratch / "params.full.yaml")
    slice_params = load_params(scratch / "params.yaml")
    cuts = Cuts.from_state(state["cuts"])
    specs = {s.address: s for s in pipeline(root, slice_params)}
    order = {a: i for i, a in enumerate(specs)}  # the stages' order, also after a --resume
    runs = sorted((StageRun(**r) for r in state["runs"]), key=lambda r: order.get(r.address, 0))
    per = {s.per_replicate for s in expand_stages(yaml.safe_load((root / "dvc.yaml").read_text()),
                                                   full) if s.per_replicate}
    seeds = {k: len(get(full, k) or []) for k in per}
    n_seeds = len(get(full, "study.seeds") or [])
    sizes = state["sizes"] or (client_sizes(scratch, (get(slice_params, "study.seeds") or [0])[0])
                               if (scratch / "data" / "partition").is_dir() else [])
    # one cost per image-step for the study's sampling: its largest call in a stage's own process
    main_samples = []
    for run in runs:
        ev = _events(scratch, run.address)
        pid = _main_pid(ev)
        main_samples += [e for e in ev if e["kind"] == "sample" and e.get("pid") == pid]
    unit = sample_unit(main_samples, None)
    rows = []
    for run in runs:
        spec = specs[run.address]
        if run.rc:  # a failed stage: as measured, nothing to project
            p1, pn = Projection(run.seconds, run.seconds, run.seconds), None
        else:
            p1, pn = project_stage(run, spec, full, cuts, _events(scratch, run.address), unit,
                                   sizes, n_seeds)
        mult = seeds.get(spec.per_replicate, 1) if spec.per_replicate else 1
        study_s = pn.projected if pn is not None else p1.projected * mult
        rows.append(Row(run.address, run.name, run.seconds, run.cpu_s, p1.projected, mult, study_s,
                        run.peak_mib, run.gpu_mib, note_of(spec, p1), p1.parts, run.out_mib))
    return Estimate(state["study"], state["device"], str(scratch), rows, cuts.lines,
                    state["base"] + cuts.overrides, sum(r.replicate_s for r in rows),
                    sum(r.study_s for r in rows), sum(r.slice_s for r in rows), n_seeds,
                    state["failed"], state["error"], tuple(state["load"]))


def _wrap(text: str, indent: str = "") -> list[str]:
    import textwrap

    return textwrap.wrap(text, 120, initial_indent=indent, subsequent_indent=indent + "    ",
                         break_on_hyphens=False)


def report(est: Estimate) -> str:
    """The estimate as printed: the cuts, the table, the totals (every line within 120 columns)."""
    lines = [f"estimate of study {est.study} on {est.device}", "slice (only these cut):"]
    for c in est.cuts:
        lines += _wrap(c, "  ")
    lines.append(table(est))
    tail = []
    tail.append(f"slice: {human(est.slice_s)}; projected: one replicate {human(est.replicate_s)}, "
                f"the whole study ({est.seeds} replicates) {human(est.study_s)}")
    cpu = sum(r.cpu_s for r in est.rows)
    tail.append(f"the slice's processes used {cpu / max(est.slice_s, 1e-9):.2f} of {os.cpu_count()} "
                f"cores on average (load average {est.load[0]:.1f} at its start, {est.load[1]:.1f} at "
                "its end): the projection is this machine's wall time at this load")
    out = sum(r.out_mib for r in est.rows)
    if out:
        study_out = sum(r.out_mib * r.multiplier for r in est.rows)
        tail.append(f"outputs: the slice's stages wrote {out / 1024:.2f} GiB under data/ (model files "
                    f"at full size: a replicate about as much, the study about {study_out / 1024:.2f} "
                    "GiB), and a running stage's resume checkpoints (data/checkpoints) up to as much "
                    "again")
    if est.failed:
        tail.append(f"FAILED at stage {est.failed}: {est.error} (the projection covers the stages "
                    "before it only)")
    for t in tail:
        lines += _wrap(t)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fedpipe.estimate",
        description="Cost estimate of a study before a long run: one replicate of every stage as a "
                    "slice, measured, then projected to the whole study (the rules: the module's "
                    "docstring).")
    ap.add_argument("study", help="a study preset of conf/study (as -S study=<study>)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, as dvc exp run -S key=value")
    ap.add_argument("-S", "--set-param", dest="more", action="append", default=[],
                    metavar="KEY=VALUE", help="an override, as dvc exp run -S (repeatable)")
    ap.add_argument("--stand-in", dest="stand_in", action=argparse.BooleanOptionalAction,
                    default=None, help="stand-in data for a torchvision dataset (default: on)")
    ap.add_argument("--json", type=Path, help="also write the estimate as JSON here")
    ap.add_argument("--scratch", type=Path, help="run in this folder and keep it (default: a "
                    "temporary folder, removed unless a stage failed)")
    ap.add_argument("--root", type=Path, default=None,
                    help="the checkout whose conf/, stages/ and src/ run (default: this one)")
    ap.add_argument("--local-steps", type=int, default=None,
                    help="cap every client's local steps in the slice at N (0: never cut; default: "
                    "only where a round would exceed --round-budget)")
    ap.add_argument("--clients", type=int, default=None, metavar="K",
                    help="train K clients a round in the slice where the study trains more "
                    "(participation K/N; projected times the full count; default: not cut)")
    ap.add_argument("--test-images", type=int, default=None, metavar="N",
                    help="evaluate on N of the test split's images in the slice, evenly spaced "
                    "(projected times the full split; default: not cut)")
    ap.add_argument("--resume", action="store_true",
                    help="continue the slice kept in --scratch (same study and overrides) from its "
                    "first stage that did not finish")
    ap.add_argument("--project-only", action="store_true",
                    help="run nothing: project again the slice recorded in --scratch (after an "
                    "interruption, or to see a rule's effect)")
    ap.add_argument("--round-budget", type=float, default=ROUND_BUDGET,
                    help=f"seconds a slice round may take before local steps are cut ({ROUND_BUDGET:.0f})")
    args = ap.parse_args(argv)
    for flag, value in (("--clients", args.clients), ("--test-images", args.test_images)):
        if value is not None and value < 1:
            print(f"error: {flag} {value}: a count of at least 1", file=sys.stderr)
            return 2
    keep = args.scratch is not None
    from fedpipe.config import ConfigError
    from fedpipe.errors import CompositionError

    if args.project_only:
        if args.scratch is None or not (args.scratch / STATE).is_file():
            print(f"error: --project-only needs --scratch, a folder holding a slice's {STATE}",
                  file=sys.stderr)
            return 2
        est = project_scratch(args.scratch)
        print(report(est), flush=True)
        if args.json:
            args.json.write_text(json.dumps(asdict(est), indent=2) + "\n")
        return 0
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix=f"fedpipe-estimate-{args.study}-"))
    try:
        est = estimate(args.study, [*args.overrides, *args.more], args.stand_in, scratch, args.root,
                       local_steps=args.local_steps, budget=args.round_budget, resume=args.resume,
                       log=lambda s: print(s, flush=True), clients=args.clients,
                       test_images=args.test_images)
    except (ConfigError, CompositionError, EstimateError) as e:  # it does not compose / resume
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report(est), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(asdict(est), indent=2) + "\n")
    if est.failed:
        print(f"error: stage {est.failed} failed: {est.error} (its log: "
              f"{Path(est.scratch) / '_logs' / (est.failed + '.log')})", file=sys.stderr)
        return 130 if est.error.startswith("interrupted") else 1
    if not keep:
        shutil.rmtree(est.scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
