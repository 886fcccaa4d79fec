"""The method contract: every registered method (``sorted(ALGORITHMS)``) passes every check here by
being registered; no list of methods is kept by hand (DESIGN.md section 2, docs/extending.md).

Per method, on a tiny problem (four clients of 10-14 images 1x8x8, four classes with label skew; a
classifier whose state has BatchNorm's float and integer buffers, ResNet-8 for PerAda and FedBN, the
digits_small UNet for the FedDDPM family; three rounds of two local SGD steps, three of the four
clients per round, the engine's evaluation every round, the method's settings small where its
paper's are long: ``test_device_clean.SMALL``):

1. **same seed, same result**: two runs are bit for bit the same in the global weights, the server's
   other state (``extra`` and ``meta``), every client's state, the personal models, the history and
   the per-client evaluation rows, and the run trained something (:func:`check_same_seed_same_result`);
2. **kill and resume**: a run killed at the end of round 2, before that round's checkpoint (an
   exception from ``on_round``, where a killed process would leave it: round 1's checkpoint on disk,
   a client not yet seen), run again on the same folder, resumes from round 1 and ends bit for bit
   as the uninterrupted run in all of the above (:func:`check_kill_and_resume`);
3. **batched = serial** for every method the batched executor trains
   (``fedpipe.fl.strategy.batches``): the batched run, under the device harness and without falling
   back, equals the serial one to the executor's documented tolerance (``fedpipe.fl.batched.ATOL``,
   ``RTOL``; losses to 1e-5 relative) (:func:`check_batched_equals_serial`); checks 1 and 2 run on
   the batched executor too. Batched runs use the classifier without BatchNorm, which the executor
   does not vectorise;
4. **device-clean**: the recorded run of tests/test_device_clean.py (two rounds, every client)
   under :class:`device_harness.DeviceHarness` makes no tensor without ``device=`` and mixes no
   devices, and computes what tests/fixtures/device_digests.json records for the method, if it has
   a record (:func:`check_device_clean`);
5. **params**: the method's config dataclass holds its defaults (an empty or absent section gives
   them, and so do the defaults written out as params), and a wrong section is refused with one
   line naming the key: an unknown key, each key with a value of the wrong type, a wrong init key
   (:func:`check_params`);
6. **reference equivalence**: :data:`EQUIVALENCE` maps every registered method to the test that
   compares it with a reference implementation (``file::test``, which must exist and name the
   method) or to a one-line reason why none exists (:func:`check_equivalence_entry`).

:data:`VARIANTS` adds settings under which a method keeps state its defaults do not make (FedDC's
all-client drift mean), for checks 1 and 2; :data:`WITHOUT_BATCHNORM` names the methods that cannot
train a model with BatchNorm (they run on the MLP without it); :data:`KNOWN_FAILURES` marks, with
the reason, a check a method fails today (a finding in src; strict xfail, so the fix shows).
Every test runs with what its numbers depend on pinned (one torch thread, float32:
``test_device_clean.pinned_numerics``), so the verdict is the same under ``make test``, a plain
pytest of this file, or any core count. About 50 s on one core.

Each check can fail: :func:`test_a_method_that_breaks_the_contract_fails_it` registers, for the test
only, methods that each break one rule (a client step drawing from the global RNG, a server counter
kept outside the server state, a batchable flag on a client step the batched executor does not run,
a tensor made without a device, a hyperparameter of no checkable type, no row in the table) and
runs the check on it.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from device_harness import PACKAGE, DeviceHarness
from fakes import assert_identical
from test_device_clean import (
    BATCHED,
    CLASSES,
    SHAPE,
    SMALL,
    assert_summaries_match,
    expected,
    mlp,
    model_factory,
    pinned_numerics,
    result_summaries,
    run_method,
    run_strategy,
)
from torch import nn

from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.algorithms.registry import _LOADED
from fedpipe.config import ConfigError
from fedpipe.fl import ClientUpdate, ServerState, Strategy
from fedpipe.fl.batched import ATOL, RTOL
from fedpipe.models import Classifier

TESTS = Path(__file__).resolve().parent
METHODS = sorted(ALGORITHMS)
SEED = 5
ROUNDS = 3  # FedPTR's first MTT is in round index 2
PARTICIPATION = 0.75  # three of the four clients a round
KILLED_IN = 2  # the run dies at the end of round 2, before its checkpoint: resumed from round 1
SIZES = (10, 14, 11, 12)  # at batch size 8, no BatchNorm batch of one sample
FINGERPRINT = "contract"

MTT_NO_BATCHNORM = ("FedPTR's MTT differentiates through the model with torch.func, and BatchNorm's "
                    "in-place statistics update in train mode fails there (aten::add_ on a captured "
                    "tensor) at the first MTT round")
WITHOUT_BATCHNORM = {"fedptr": MTT_NO_BATCHNORM, "fedptr_fixed": MTT_NO_BATCHNORM,
                     "fedptr_s": MTT_NO_BATCHNORM, "fedptr_s_once": MTT_NO_BATCHNORM,
                     "fedprox_syn": MTT_NO_BATCHNORM}
"""Methods that cannot train a model with BatchNorm, and why: their contract runs use the MLP
without it."""
VARIANTS: dict[str, list[dict[str, Any]]] = {
    "feddc": [{"drift_average": "all_clients"}],  # the server keeps every client's drift (hsum)
}
"""Settings (beyond the small defaults) under which a method keeps state its defaults do not."""


@pytest.fixture(autouse=True)
def pinned():
    with pinned_numerics():
        yield


# -- the reference-equivalence table --------------------------------------------------------------
@dataclass(frozen=True)
class Reference:
    """The test (``file::function``, under tests/) comparing the method with a reference
    implementation on stored inputs and outputs (tests/fixtures/equivalence/)."""

    test: str


@dataclass(frozen=True)
class NoReference:
    """Why the method has no reference-equivalence test."""

    reason: str


FEDNH_REF = "test_equivalence_fednh_ref.py"
FLBENCH_REF = "test_equivalence_flbench_ref.py"
PERADA_REF = "test_equivalence_perada_ref.py"
NO_PUBLIC_CODE = "{paper} publishes no code (docs/papers/{doc}.md); nothing to compare against"
NO_FAIRNESS_REF = ("no reference: FL-bench, PFLlib and Flower's core strategies implement none of "
                   "the fairness baselines (docs/papers/baselines.md)")
MTT_ONLY = ("the paper has no official code (docs/papers/fedptr.md); its MTT step is checked "
            f"against the MTT authors' code by {FLBENCH_REF}::"
            "test_mtt_matching_loss_gradients_and_update_against_the_authors_code")

EQUIVALENCE: dict[str, Reference | NoReference] = {
    "apfl": NoReference("no usable reference: FL-bench's and PFLlib's APFL are not the paper's "
                        "update, the official code is not stored (docs/papers/baselines.md)"),
    "aux_only": NoReference(NO_PUBLIC_CODE.format(paper="FedDDPM's paper", doc="fedddpm")),
    "centralized": NoReference("not a federated method: the pooled-data reference row, checked "
                               "against a hand-computed SGD step (test_equitable_centralized.py)"),
    "cluster2": NoReference(NO_FAIRNESS_REF),
    "creff": Reference(f"{FEDNH_REF}::"
                       "test_creff_client_gradients_fedavg_and_feature_matching_match_reference"),
    "ditto": Reference(f"{FEDNH_REF}::test_ditto_matches_reference_with_the_papers_proximal_centre"),
    "equitable_fl": NoReference(NO_PUBLIC_CODE.format(paper="Equitable-FL's paper",
                                                      doc="equitable_fl")),
    "fairfed": NoReference(NO_FAIRNESS_REF),
    "fedalt": Reference(f"{FLBENCH_REF}::test_partial_personalization_against_the_authors_code"),
    "fedavg": Reference(f"{FEDNH_REF}::test_fedavg_matches_reference"),
    "fedavg_ft": NoReference("FedAvg (checked: test_fedavg_matches_reference) plus local fine-tuning "
                             "for evaluation; no stored reference implements the pair"),
    "fedbabu": Reference(f"{FEDNH_REF}::test_fedbabu_matches_reference"),
    "fedbn": Reference(f"{FLBENCH_REF}::test_personal_layers_client_and_server_against_pfllib"),
    "feddc": Reference(f"{FLBENCH_REF}::"
                       "test_feddc_client_drift_control_variates_and_server_against_the_authors_code"),
    "fedddpm": NoReference(NO_PUBLIC_CODE.format(paper="FedDDPM's paper", doc="fedddpm")),
    "fedddpm_plus": NoReference(NO_PUBLIC_CODE.format(paper="FedDDPM's paper", doc="fedddpm")),
    "feddf": NoReference("no reference: neither FL-bench nor PFLlib implements FedDF and no official "
                         "code is stored; its distillation step is PerAda's, checked against "
                         "NVlabs/PerAda (docs/papers/baselines.md)"),
    "feddyn": Reference(f"{FLBENCH_REF}::test_feddyn_client_and_server_against_the_authors_code"),
    "fednh": Reference(f"{FEDNH_REF}::test_fednh_matches_reference"),
    "fedper": Reference(f"{FEDNH_REF}::test_personal_head_methods_match_reference"),
    "fedproto": Reference(f"{FEDNH_REF}::test_fedproto_matches_reference"),
    "fedprox": Reference(f"{FLBENCH_REF}::test_fedprox_client_and_flower_aggregation"),
    "fedprox_syn": NoReference(MTT_ONLY),
    "fedptr": NoReference(MTT_ONLY),
    "fedptr_fixed": NoReference(MTT_ONLY),
    "fedptr_noproj": NoReference(MTT_ONLY),
    "fedptr_s": NoReference(MTT_ONLY),
    "fedptr_s_once": NoReference(MTT_ONLY),
    "fedrep": Reference(f"{FEDNH_REF}::test_personal_head_methods_match_reference"),
    "fedrod": Reference(f"{FEDNH_REF}::test_fedrod_matches_reference"),
    "fedsim": Reference(f"{FLBENCH_REF}::test_partial_personalization_against_the_authors_code"),
    "gifair": NoReference(NO_FAIRNESS_REF),
    "lg_fedavg": Reference(f"{FLBENCH_REF}::test_personal_layers_client_and_server_against_pfllib"),
    "local": Reference(f"{FEDNH_REF}::test_local_matches_reference"),
    "mofedsam": Reference(f"{FLBENCH_REF}::"
                          "test_mofedsam_sam_steps_momentum_and_server_against_fl_simulator"),
    "perada": Reference(f"{PERADA_REF}::test_clients_and_server_match_reference"),
    "perada_nokd": Reference(f"{PERADA_REF}::test_clients_and_server_match_reference"),
    "pfedme": Reference(f"{FLBENCH_REF}::"
                        "test_pfedme_personal_and_local_models_and_server_against_the_authors_code"),
    "pow_d": NoReference(NO_FAIRNESS_REF),
    "scaffold": Reference(f"{FLBENCH_REF}::test_scaffold_client_control_variates_and_server_step"),
}
"""Every registered method: its reference-equivalence test, or why it has none."""


# -- the tiny problem ------------------------------------------------------------------------------
def bn_mlp() -> nn.Module:
    """A classifier whose state has float and integer buffers (BatchNorm's statistics and count)."""
    body = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(SHAPE), 16), nn.BatchNorm1d(16), nn.ReLU())
    return Classifier(SHAPE, CLASSES, body)


@dataclass(frozen=True)
class Case:
    """A method with the section of params it runs with (``algorithms.<name>``) and the executor
    (``batched``: on the model without BatchNorm, under the device harness)."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()
    executor: str = "serial"

    @property
    def cls(self) -> type:
        return ALGORITHMS[self.name]

    @property
    def cfg(self):
        return algorithm_config(self.name, {**SMALL.get(self.name, {}), **dict(self.params)})

    def __str__(self) -> str:
        extra = ",".join([f"{k}={v}" for k, v in self.params]
                         + ([self.executor] if self.executor != "serial" else []))
        return f"{self.name}[{extra}]" if extra else self.name


CASES = ([Case(n) for n in METHODS]
         + [Case(n, tuple(sorted(p.items()))) for n in METHODS for p in VARIANTS.get(n, [])]
         + [Case(n, executor="batched") for n in BATCHED])
"""Checks 1 and 2 run on these: every method, its variants, and every batchable one batched."""

KNOWN_FAILURES: dict[tuple[str, str], str] = {}
"""(check, case): why the case fails the check today (a finding in src, marked strict xfail)."""


def cases(check: str, items) -> list:
    return [pytest.param(c, id=str(c), marks=pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[
        (check, str(c))])) if (check, str(c)) in KNOWN_FAILURES else pytest.param(c, id=str(c))
        for c in items]


def contract_run(case: Case, *, executor: str | None = None, **kw):
    """The contract's run of ``case`` (module docstring), with ``case.executor`` unless
    ``executor`` says (a serial run of a batched case: on the same model, outside the harness);
    ``kw``: to :func:`run_strategy` and the engine."""
    executor = executor or case.executor
    with DeviceHarness() if executor == "batched" else contextlib.nullcontext():
        return run_strategy(case.cls, case.cfg, executor, rounds=ROUNDS,
                            participation=PARTICIPATION, seed=SEED, sizes=SIZES, base=base(case),
                            evaluate=True, checkpoint_every=1, **kw)


def base(case: Case):
    """The classifier of ``case``: run_strategy's ResNet-8 for PerAda and FedBN, the MLP without
    BatchNorm for a batched case and :data:`WITHOUT_BATCHNORM`, else :func:`bn_mlp`."""
    if case.name.startswith("perada") or case.name == "fedbn":
        return None
    return mlp if case.executor == "batched" or case.name in WITHOUT_BATCHNORM else bn_mlp


_REFERENCE_RUNS: dict[str, Any] = {}


def reference_run(case: Case):
    """The uninterrupted contract run of ``case``, made once per test process."""
    key = f"{case}:{id(case.cls)}"
    if key not in _REFERENCE_RUNS:
        _REFERENCE_RUNS[key] = contract_run(case)
    return _REFERENCE_RUNS[key]


class Killed(Exception):
    """The stand-in for a killed process."""


def kill_in(round_: int):
    def on_round(record: dict[str, float]) -> None:
        if record["round"] == round_:
            raise Killed(f"killed at the end of round {round_}, before its checkpoint")
    return on_round


def canonical(obj) -> str:
    """JSON text of ``obj`` (a run's server meta: what a checkpoint stores of it)."""
    return json.dumps(obj, sort_keys=True, default=repr)


def assert_same_run(a, b, what: str) -> None:
    """``a`` and ``b`` bit for bit the same: weights, extra, meta, client states, personal models,
    history, per-client rows, rounds."""
    assert a.rounds_done == b.rounds_done, f"{what}: {a.rounds_done} vs {b.rounds_done} rounds"
    for part, x, y in (("weights", a.state.weights, b.state.weights),
                       ("extra", a.state.extra, b.state.extra),
                       ("client states", a.client_states, b.client_states),
                       ("personal models", a.personal or {}, b.personal or {})):
        try:
            assert_identical(x, y)
        except AssertionError as e:
            raise AssertionError(f"{what}: {part} differ ({e or 'other keys'})") from None
    assert (a.personal is None) == (b.personal is None), f"{what}: personal models made once only"
    assert canonical(a.state.meta) == canonical(b.state.meta), f"{what}: server meta differs"
    assert a.history == b.history, f"{what}: history differs"
    assert a.client_history == b.client_history, f"{what}: per-client rows differ"


def assert_close(a: dict, b: dict, what: str) -> None:
    """Named tensors (or groups of them) equal to the batched executor's documented tolerance."""
    assert a.keys() == b.keys(), f"{what}: other keys"
    for k in a:
        if isinstance(a[k], dict):
            assert_close(a[k], b[k], f"{what}/{k}")
        else:
            torch.testing.assert_close(b[k], a[k], atol=ATOL, rtol=RTOL,
                                       msg=lambda m, k=k: f"{what}/{k}: {m}")


def assert_close_runs(serial, batched, samples: int) -> None:
    """The batched run equals the serial one to the documented tolerance; losses to 1e-5
    relative; an accuracy may differ by a sample whose prediction the rounding flips."""
    assert serial.rounds_done == batched.rounds_done
    assert_close(serial.state.weights, batched.state.weights, "weights")
    assert_close(serial.state.extra, batched.state.extra, "extra")
    assert_close({str(c): s for c, s in serial.client_states.items()},
                 {str(c): s for c, s in batched.client_states.items()}, "client states")
    assert_close({str(c): w for c, w in (serial.personal or {}).items()},
                 {str(c): w for c, w in (batched.personal or {}).items()}, "personal models")
    for rows_s, rows_b in ((serial.history, batched.history),
                           (serial.client_history, batched.client_history)):
        assert len(rows_s) == len(rows_b)
        for hs, hb in zip(rows_s, rows_b, strict=True):
            assert hs.keys() == hb.keys()
            for k, v in hs.items():
                tol = {"abs": 1.0 / samples + 1e-9} if "accuracy" in k else {"rel": 1e-5, "abs": 1e-9}
                assert hb[k] == pytest.approx(v, **tol), (k, hs["round"])


# -- the checks ------------------------------------------------------------------------------------
def initial_weights(case: Case) -> dict[str, torch.Tensor]:
    return model_factory(case.cls, case.cfg, base=base(case))().state_dict()


def check_same_seed_same_result(case: Case) -> None:
    first = reference_run(case)
    assert first.rounds_done >= KILLED_IN and len(first.history) == first.rounds_done
    start = initial_weights(case)
    trained = [first.state.weights, *(first.personal or {}).values()]
    assert any(not torch.equal(w[k], v) for w in trained for k, v in start.items() if k in w
               and v.is_floating_point()), f"{case}: no model moved from its initial weights"
    assert_same_run(first, contract_run(case), f"{case}: two runs with seed {SEED}")


def check_kill_and_resume(case: Case, folder: Path) -> None:
    full = reference_run(case)
    with pytest.raises(Killed):
        contract_run(case, checkpoint_dir=folder, fingerprint=FINGERPRINT,
                     on_round=kill_in(KILLED_IN))
    resumed = contract_run(case, checkpoint_dir=folder, fingerprint=FINGERPRINT)
    assert resumed.resumed_from == KILLED_IN - 1, f"{case}: resumed from {resumed.resumed_from}"
    assert_same_run(full, resumed, f"{case}: killed in round {KILLED_IN} and resumed")


def check_batched_equals_serial(name: str) -> None:
    case = Case(name, executor="batched")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("fedpipe.fl.batched")
    logger.addHandler(handler)
    try:
        batched = contract_run(case)  # under the device harness
    finally:
        logger.removeHandler(handler)
    fallbacks = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    assert not fallbacks, f"{case}: the batched executor fell back to serial: {fallbacks}"
    assert_close_runs(contract_run(case, executor="serial"), batched, sum(SIZES))


def check_device_clean(name: str) -> None:
    with DeviceHarness():
        result = run_method(name)
    assert result.rounds_done >= 1
    recorded = expected("methods", name)
    if recorded is not None:  # a method registered after the record: the harness run only
        assert_summaries_match(result_summaries(result), recorded, name)


def _refused(name: str, section: dict[str, Any], key: str) -> None:
    """``algorithms.<name>`` = ``section`` is refused with one line naming ``key``."""
    try:
        algorithm_config(name, section)
    except ConfigError as e:
        assert e.key == key, f"algorithms.{name}={section!r}: the error names {e.key}, not {key}"
        assert "\n" not in str(e) and key in str(e), str(e)
        return
    except Exception as e:  # noqa: BLE001 (anything else is the failure)
        raise AssertionError(f"algorithms.{name}={section!r}: {type(e).__name__}: {e}, not a "
                             f"ConfigError naming {key}") from None
    raise AssertionError(f"algorithms.{name}={section!r} accepted; {key} should be refused")


def _accepted(name: str, section: dict[str, Any] | None):
    try:
        return algorithm_config(name, section)
    except Exception as e:  # noqa: BLE001 (a valid section refused, or a crash: the failure)
        raise AssertionError(f"algorithms.{name}={section!r}: {type(e).__name__}: {e}") from None


def check_params(name: str) -> None:
    cls = ALGORITHMS[name]
    assert dataclasses.is_dataclass(cls.config_class), f"{name}: config_class is not a dataclass"
    defaults = cls.config_class()
    assert _accepted(name, {}) == defaults and _accepted(name, None) == defaults
    written = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(defaults)}
    assert _accepted(name, written) == defaults, f"{name}: its defaults written out differ"
    _refused(name, {"no_such_key": 1}, f"algorithms.{name}.no_such_key")
    for f in dataclasses.fields(defaults):
        wrong = ["x"] if "dict" in str(f.type) else {"not": "this"}
        _refused(name, {f.name: wrong}, f"algorithms.{name}.{f.name}")
    _refused(name, {"backbone": 3}, f"algorithms.{name}.backbone")


@functools.cache
def _test_functions(path: Path) -> dict[str, str]:
    """The test functions of ``path``: name -> source (decorators included)."""
    text = path.read_text()
    return {node.name: "\n".join(ast.get_source_segment(text, d) for d in node.decorator_list)
            + ast.get_source_segment(text, node)
            for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def check_equivalence_entry(name: str) -> None:
    entry = EQUIVALENCE.get(name)
    assert entry is not None, (f"{name} is not in EQUIVALENCE: name its reference-equivalence test "
                               "(file::test) or say in one line why it has none")
    if isinstance(entry, Reference):
        file, _, test = entry.test.partition("::")
        assert (TESTS / file).is_file(), f"{name}: {file} does not exist"
        tests = _test_functions(TESTS / file)
        assert test in tests, f"{name}: {entry.test} does not exist"
        assert f'"{name}"' in tests[test], f"{name}: {entry.test} does not name the method"
    else:
        assert entry.reason.strip() and "\n" not in entry.reason, f"{name}: a one-line reason"


# -- every registered method -----------------------------------------------------------------------
@pytest.mark.parametrize("case", cases("same seed", CASES))
def test_same_seed_same_result(case):
    check_same_seed_same_result(case)


@pytest.mark.parametrize("case", cases("resume", CASES))
def test_killed_and_resumed_run_is_the_uninterrupted_run(case, tmp_path):
    check_kill_and_resume(case, tmp_path)


@pytest.mark.parametrize("name", BATCHED)
def test_batched_equals_serial(name):
    check_batched_equals_serial(name)


@pytest.mark.parametrize("name", METHODS)
def test_device_clean(name):
    check_device_clean(name)


@pytest.mark.parametrize("name", METHODS)
def test_params_refused_with_one_line(name):
    check_params(name)


@pytest.mark.parametrize("name", METHODS)
def test_reference_equivalence_or_reason(name):
    check_equivalence_entry(name)


def test_tables_name_registered_methods_only():
    assert set(EQUIVALENCE) <= set(METHODS), sorted(set(EQUIVALENCE) - set(METHODS))
    for table in (VARIANTS, SMALL, WITHOUT_BATCHNORM):
        assert set(table) <= set(METHODS), sorted(set(table) - set(METHODS))


# -- each check can fail ---------------------------------------------------------------------------
class GlobalRng(Strategy):
    """Adds noise from torch's global RNG to its update (the rule: every draw from ``gen``)."""

    def client_update(self, payload, client_state, data, gen, client_id=0):
        update, client_state, metrics = super().client_update(payload, client_state, data, gen,
                                                              client_id)
        noisy = {k: v + 1e-3 * torch.randn(v.shape) if v.is_floating_point() else v
                 for k, v in update.weights.items()}
        return (ClientUpdate(update.client_id, update.num_samples, noisy, update.extra, metrics),
                client_state, metrics)


class Forgetful(Strategy):
    """Counts rounds on the instance, not in the server state: a resumed run starts it again."""

    def server_update(self, state: ServerState, rnd) -> ServerState:
        self.rounds_seen = getattr(self, "rounds_seen", 0) + 1
        step = 1.0 / self.rounds_seen
        w = {k: v * (1 - 0.1 * step) if v.is_floating_point() else v for k, v in state.weights.items()}
        return ServerState(w, state.extra, state.meta)


class FalselyBatchable(Strategy):
    """Declares ``batchable`` on a client step of its own, which the batched executor does not run."""

    batchable = True

    def client_update(self, payload, client_state, data, gen, client_id=0):
        update, client_state, metrics = super().client_update(payload, client_state, data, gen,
                                                              client_id)
        halved = {k: payload.weights[k] + 0.5 * (v - payload.weights[k]) if v.is_floating_point()
                  else v for k, v in update.weights.items()}
        return (ClientUpdate(update.client_id, update.num_samples, halved, update.extra, metrics),
                client_state, metrics)


_UNCLEAN: dict[str, Any] = {}
exec(compile("def server_update(self, state, rnd):\n"  # a line of fedpipe's code, for the harness
             "    state.extra['count'] = {'n': torch.zeros(1)}\n"
             "    return state\n", str(Path(PACKAGE) / "algorithms" / "contract_fake.py"), "exec"),
     {"torch": torch}, _UNCLEAN)


class DeviceUnclean(Strategy):
    """Its server step makes a tensor without ``device=`` (compiled as a line of a method module of
    fedpipe's, so that the harness holds it to fedpipe's rules)."""

    server_update = _UNCLEAN["server_update"]


@dataclass(frozen=True)
class UncheckableConfig:
    scale: Any = 1.0  # a type the config machinery cannot check


class Uncheckable(Strategy):
    """A hyperparameter of no checkable type: a wrong value is not refused with one line."""

    config_class = UncheckableConfig


class Unlisted(Strategy):
    """Has no row in EQUIVALENCE."""


BROKEN = [(GlobalRng, "same seed"), (Forgetful, "resume"), (FalselyBatchable, "batched"),
          (DeviceUnclean, "device"), (Uncheckable, "params"), (Unlisted, "equivalence")]


def register_for_test(monkeypatch, cls: type) -> str:
    """Register ``cls`` as method ``contract_<class name>`` for this test only."""
    name = f"contract_{cls.__name__.lower()}"
    monkeypatch.setattr(cls, "name", name, raising=False)
    monkeypatch.setitem(ALGORITHMS.index, name, __name__)
    monkeypatch.setitem(_LOADED, name, cls)
    return name


@pytest.mark.parametrize(("cls", "check"), BROKEN, ids=[c for _, c in BROKEN])
def test_a_method_that_breaks_the_contract_fails_it(cls, check, monkeypatch, tmp_path):
    name = register_for_test(monkeypatch, cls)
    assert name in ALGORITHMS and ALGORITHMS[name] is cls
    run = {"same seed": lambda: check_same_seed_same_result(Case(name)),
           "resume": lambda: check_kill_and_resume(Case(name), tmp_path),
           "batched": lambda: check_batched_equals_serial(name),
           "device": lambda: check_device_clean(name),
           "params": lambda: check_params(name),
           "equivalence": lambda: check_equivalence_entry(name)}
    with pytest.raises(AssertionError):
        run[check]()
    if cls is Forgetful:  # deterministic: only the resume check sees what it does
        run["same seed"]()
