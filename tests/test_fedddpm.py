"""FedDDPM (Algorithm 1) and FedDDPM+ (Algorithms 2, 3) on a tiny linear model: QuickTest on
hand-computed score sequences, the server calibration against local_train on the auxiliary set done by
hand, the trigger / correction / stop bookkeeping, resumption, configs and the ctx contract.

The model is w in R^2 (no bias), the loss the mean squared error on (x, y) pairs, in float64."""

from __future__ import annotations

import json
import math

import pytest
import torch
from fakes import MSETask
from torch import nn

from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.algorithms.fedddpm import QuickTest, QuickTestEntry, uses_labels
from fedpipe.config import ConfigError
from fedpipe.config.fl import FLConfig, LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl import (
    ClientUpdate,
    RoundInfo,
    SerialExecutor,
    ServerData,
    ServerState,
    local_train,
    run_federated,
)
from fedpipe.fl.engine import sample_clients
from fedpipe.rng import torch_generator
from fedpipe.tasks import ClassificationTask, DiffusionTask

DT = torch.float64
SEED = 11
W0 = [0.5, -0.25]
LOCAL = LocalTrainConfig(steps=2, batch_size=2, lr=0.1, optimizer="sgd")


def linear_model() -> nn.Module:
    m = nn.Linear(2, 1, bias=False).to(DT)
    with torch.no_grad():
        m.weight.copy_(torch.tensor([W0], dtype=DT))
    return m


def W(v) -> dict[str, torch.Tensor]:
    return {"weight": torch.tensor([v], dtype=DT)}


def dataset(n: int, seed: int) -> ClientData:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g, dtype=DT)
    return ClientData(x, x @ torch.tensor([[1.0], [-2.0]], dtype=DT) + 0.1 * torch.randn(n, 1, generator=g,
                                                                                       dtype=DT))


AUX = dataset(5, 0)  # |A| = 5: ceil(5 / 2) = 3 batches of B = 2 per epoch


def server_data(aux: ClientData = AUX) -> ServerData:
    return ServerData("aux", aux, bool((aux.y >= 0).all()))


def rnd(index: int, aux: ClientData | None = AUX, total: int = 10, score=None, updates=()
        ) -> RoundInfo:
    """The server hooks' view of round ``index`` (the pipeline's server data and score)."""
    return RoundInfo(index=index, total=total, seed=SEED, updates=tuple(updates),
                     server_data=None if aux is None else server_data(aux), score=score)


def make(name, cfg=None, task=None, aggregation="uniform"):
    return ALGORITHMS[name](task or MSETask(), linear_model, LOCAL, algorithm_config(name, cfg),
                            aggregation=aggregation, num_clients=3)


def hand_server_step(weights, round_, *, epochs, lr, batch_size=2, optimizer="adam"):
    """The server step written out: local_train on A from ``weights`` with the server generator."""
    model = linear_model()
    model.load_state_dict(weights)
    cfg = LocalTrainConfig(epochs=epochs, batch_size=batch_size, optimizer=optimizer, lr=lr)
    metrics = local_train(model, AUX, MSETask(), cfg, round_, torch_generator(SEED, "server-update", round_))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics


def assert_identical(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# -- QuickTest (Algorithm 3) --------------------------------------------------------------------------
def test_quicktest_fires_when_the_score_is_within_threshold_of_the_previous_ema():
    q = QuickTest(gamma=0.4, threshold=0.2)
    fired = [q(s) for s in (10.0, 8.0, 7.9, 8.6, 8.0)]
    assert fired == [False, False, False, True, False]
    # EMA: 10 -> 0.4*8 + 0.6*10 = 9.2 -> 0.4*7.9 + 0.6*9.2 = 8.68; a firing call leaves it unchanged;
    # 8.0: |8.68 - 8| = 0.68 > 0.2 -> 0.4*8 + 0.6*8.68 = 8.408
    expected = [(10.0, None, False), (8.0, 10.0, False), (7.9, 9.2, False), (8.6, 8.68, True),
                (8.0, 8.68, False)]
    for entry, (score, before, fire) in zip(q.trace, expected, strict=True):
        assert isinstance(entry, QuickTestEntry)
        assert entry.score == score and entry.fired == fire
        assert entry.ema_before == (None if before is None else pytest.approx(before, abs=1e-12))
    assert q.ema == pytest.approx(8.408, abs=1e-12)


def test_quicktest_threshold_is_inclusive_and_never_fires_on_the_first_score():
    q = QuickTest(gamma=0.5, threshold=0.25)
    assert not q(10.0)  # the first score only initialises the EMA, whatever the threshold
    assert q(10.25)  # |10 - 10.25| = 0.25 <= 0.25 (exact in binary)
    assert QuickTest(0.4, 0.0)(3.0) is False


def test_quicktest_never_fires_on_a_steadily_falling_score():
    q = QuickTest(0.4, 0.2)
    assert not any(q(s) for s in (50.0, 40.0, 30.0, 20.0, 10.0))
    ema = 50.0
    for s, entry in zip((40.0, 30.0, 20.0, 10.0), q.trace[1:], strict=True):
        assert entry.ema_before == pytest.approx(ema, abs=1e-12)
        ema = 0.4 * s + 0.6 * ema
    assert q.ema == pytest.approx(ema, abs=1e-12)


def test_quicktest_resumed_from_its_ema_continues_identically():
    scores = [10.0, 8.0, 7.9, 8.6]
    whole = QuickTest(0.4, 0.2)
    out = [whole(s) for s in scores]
    first = QuickTest(0.4, 0.2)
    out_a = [first(s) for s in scores[:2]]
    second = QuickTest(0.4, 0.2, ema=json.loads(json.dumps(first.ema)))
    out_b = [second(s) for s in scores[2:]]
    assert out_a + out_b == out and first.trace + second.trace == whole.trace
    assert second.ema == whole.ema


def test_quicktest_refuses_a_non_finite_score():
    with pytest.raises(ValueError, match="finite"):
        QuickTest()(float("nan"))


# -- FedDDPM (Algorithm 1) ------------------------------------------------------------------------------
def test_fedddpm_aggregates_as_fedavg_then_trains_on_the_aux_set():
    s = make("fedddpm", {"server_epochs": 2, "server_lr": 0.01, "server_batch_size": 2})
    start = ServerState(W(W0), meta={"server_steps": 0})
    updates = [ClientUpdate(0, 2, W([1.0, 0.0])), ClientUpdate(2, 6, W([0.0, 1.0]))]
    agg = s.aggregate(start, rnd(4, updates=updates))
    assert_identical(agg.weights, make("fedavg").aggregate(start, rnd(4, updates=updates)).weights)
    torch.testing.assert_close(agg.weights["weight"], torch.tensor([[0.5, 0.5]], dtype=DT), rtol=0, atol=0)
    before = {k: v.clone() for k, v in agg.weights.items()}

    new = s.server_update(agg, rnd(4))
    expected, metrics = hand_server_step(agg.weights, 4, epochs=2, lr=0.01)
    assert_identical(new.weights, expected)  # bit for bit
    assert metrics["steps"] == 2 * math.ceil(5 / 2) == new.meta["server_steps"] == 6
    assert new.meta["server_loss"] == metrics["loss"]
    assert not torch.equal(new.weights["weight"], agg.weights["weight"])
    assert_identical(agg.weights, before)  # the aggregate is not trained in place
    assert new.weights["weight"].data_ptr() != agg.weights["weight"].data_ptr()
    assert start.meta == {"server_steps": 0}  # meta is a new dict

    newer = s.server_update(new, rnd(5))
    assert newer.meta["server_steps"] == 12  # cumulative
    assert_identical(new.weights, expected)  # earlier states never change


def test_fedddpm_sgd_server_step_is_w_minus_eta_grad_on_aux():
    eta = 0.05
    s = make("fedddpm", {"server_optimizer": "sgd", "server_lr": eta, "server_batch_size": 5})
    new = s.server_update(ServerState(W(W0)), rnd(0))
    x, y = AUX.x, AUX.y
    w = torch.tensor([W0], dtype=DT)
    grad = 2 / len(x) * ((x @ w.T - y).T @ x)  # full batch: grad of mean (x.w - y)^2
    torch.testing.assert_close(new.weights["weight"], w - eta * grad, rtol=0, atol=1e-14)
    assert new.meta["server_steps"] == 1


def tiny_fl(rounds):
    return FLConfig(rounds=rounds, participation=0.67, aggregation="uniform", checkpoint_every=100,
                    local=LOCAL)


CLIENTS = [dataset(4, 1), dataset(6, 2), dataset(3, 3)]


def test_fedddpm_through_the_engine_is_fedavg_plus_the_server_step():
    cfg = {"server_epochs": 1, "server_lr": 1e-9, "server_batch_size": 2}  # a tiny, but real, step
    fl = tiny_fl(2)
    got = run_federated(make("fedddpm", cfg), linear_model(), CLIENTS, fl, SEED, progress=False,
                        server_data=server_data())
    fedavg = make("fedavg")
    state = fedavg.init_server(linear_model())
    for r in range(fl.rounds):  # the engine's round, written out, with the hand server step
        selected = sample_clients(3, fl.clients_per_round(3), SEED, r)
        results = SerialExecutor().run(fedavg, {c: fedavg.payload(state, r, c) for c in selected},
                                       [(c, {}, CLIENTS[c]) for c in selected], SEED)
        state = fedavg.aggregate(state, rnd(r, updates=[u for u, _, _ in results]))
        state = ServerState(hand_server_step(state.weights, r, epochs=1, lr=1e-9)[0])
    assert_identical(got.state.weights, state.weights)
    assert got.state.meta["server_steps"] == 2 * 3
    plain = run_federated(make("fedavg"), linear_model(), CLIENTS, fl, SEED, progress=False)
    assert not torch.equal(plain.state.weights["weight"], got.state.weights["weight"])
    torch.testing.assert_close(plain.state.weights["weight"], got.state.weights["weight"], rtol=0,
                               atol=1e-6)


# -- FedDDPM+ (Algorithms 2, 3) ---------------------------------------------------------------------------
class ScriptedFID:
    """quick_fid returning the given scores in turn; records what it was called with."""

    def __init__(self, scores):
        self.scores = list(scores)
        self.calls: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def __call__(self, model, n, gen):
        self.calls.append((n, model.weight.detach().clone(), torch.randn(3, generator=gen, dtype=DT)))
        return self.scores[len(self.calls) - 1]


PLUS = {"test_every": 2, "test_size": 7, "correction_epochs": 3, "correction_lr": 0.01,
        "server_batch_size": 2}


def drive(s, fid, rounds, start=0, state=None, stop=None):
    """``server_update`` after simulated client rounds (w moves by 0.01 per round) until the strategy
    stops (or before 0-based round ``stop``); returns the states before and after each server_update."""
    state = state or s.init_server(linear_model())
    trail = []
    for r in range(start, rounds if stop is None else stop):
        pre = ServerState({"weight": state.weights["weight"] + 0.01}, state.extra, state.meta)
        state = s.server_update(pre, rnd(r, total=rounds, score=fid))
        trail.append((r, pre, state))
        if state.meta.get("stopped_at") is not None:
            break
    return state, trail


def test_fedddpm_plus_fires_corrects_once_and_stops():
    s = make("fedddpm_plus", PLUS)
    fid = ScriptedFID([10.0, 8.0, 7.9, 8.6])  # fires on the 4th test: after round 8
    state, trail = drive(s, fid, rounds=10)
    assert [r for r, _, _ in trail] == list(range(8))
    meta = state.meta
    assert meta["stopped_at"] == 8 and meta["corrected_at"] == 8
    assert meta["server_steps"] == 3 * math.ceil(5 / 2)  # one correction of correction_epochs epochs
    assert [e["round"] for e in meta["quicktest"]] == [2, 4, 6, 8]
    assert [e["fired"] for e in meta["quicktest"]] == [False, False, False, True]
    assert [e["score"] for e in meta["quicktest"]] == [10.0, 8.0, 7.9, 8.6]
    assert meta["quicktest"][0]["ema_before"] is None
    assert meta["quicktest"][3]["ema_before"] == pytest.approx(8.68, abs=1e-12)
    assert meta["quicktest_ema"] == pytest.approx(8.68, abs=1e-12)
    json.dumps(meta)  # checkpointable
    for r, pre, post in trail[:-1]:  # no server training before the trigger
        assert post.weights is pre.weights and post.meta["server_steps"] == 0, r
    _, pre, post = trail[-1]
    expected, _ = hand_server_step(pre.weights, 7, epochs=3, lr=0.01)
    assert_identical(post.weights, expected)
    # QuickTest scored the global model of its round, TestSize samples, with the (quicktest, round) stream
    for (n, w, draw), (r, pre, _) in zip(fid.calls, [t for t in trail if (t[0] + 1) % 2 == 0],
                                         strict=True):
        assert n == 7 and torch.equal(w, pre.weights["weight"])
        assert torch.equal(draw, torch.randn(3, generator=torch_generator(SEED, "quicktest", r), dtype=DT))
    # once stopped: no second correction
    assert s.server_update(state, rnd(9, score=fid)) is state and len(fid.calls) == 4


def test_fedddpm_plus_corrects_after_the_last_round_when_never_triggered():
    s = make("fedddpm_plus", PLUS)
    fid = ScriptedFID([50.0, 40.0, 30.0, 20.0, 10.0])
    state, trail = drive(s, fid, rounds=10)
    assert len(trail) == 10 and len(fid.calls) == 5
    assert state.meta["stopped_at"] is None and state.meta["corrected_at"] == 10
    assert state.meta["server_steps"] == 9
    assert not any(e["fired"] for e in state.meta["quicktest"])
    _, pre, post = trail[-1]
    assert_identical(post.weights, hand_server_step(pre.weights, 9, epochs=3, lr=0.01)[0])

    off = make("fedddpm_plus", {**PLUS, "correct_if_no_trigger": False})
    state, trail = drive(off, ScriptedFID([50.0, 40.0, 30.0, 20.0, 10.0]), rounds=10)
    assert state.meta["server_steps"] == 0 and state.meta["corrected_at"] is None
    assert trail[-1][2].weights is trail[-1][1].weights


def test_fedddpm_plus_trigger_on_the_last_round_corrects_once():
    s = make("fedddpm_plus", PLUS)
    state, _ = drive(s, ScriptedFID([10.0, 10.1]), rounds=4)
    assert state.meta["stopped_at"] == 4 and state.meta["server_steps"] == 9


def test_fedddpm_plus_resumed_from_meta_continues_identically():
    scores = [10.0, 8.0, 7.9, 8.6]
    whole, _ = drive(make("fedddpm_plus", PLUS), ScriptedFID(scores), rounds=10)
    part, _ = drive(make("fedddpm_plus", PLUS), ScriptedFID(scores), rounds=10, stop=5)  # after round 5
    assert part.meta["corrected_at"] is None and len(part.meta["quicktest"]) == 2
    saved = ServerState({k: v.clone() for k, v in part.weights.items()}, {},
                        json.loads(json.dumps(part.meta)))
    resumed, _ = drive(make("fedddpm_plus", PLUS), ScriptedFID(scores[2:]), rounds=10, start=5,
                       state=saved)
    assert_identical(resumed.weights, whole.weights)
    assert resumed.meta == whole.meta


def test_fedddpm_plus_through_the_engine_stops_and_resumes(tmp_path):
    cfg = {**PLUS, "test_every": 1}
    fl = tiny_fl(6)

    def run(scores, **kw):
        return run_federated(make("fedddpm_plus", cfg), linear_model(), CLIENTS, fl, SEED, progress=False,
                             server_data=server_data(), score=ScriptedFID(scores), **kw)

    scores = [10.0, 9.0, 9.5]  # |9.4 - 9.5| <= 0.2: fires after round 3
    full = run(scores)
    assert full.rounds_done == 3 and full.state.meta["stopped_at"] == 3
    assert full.state.meta["server_steps"] == 9
    run(scores, checkpoint_dir=tmp_path, fingerprint="f", stop_after=2)
    resumed = run(scores[2:], checkpoint_dir=tmp_path, fingerprint="f")
    assert resumed.resumed_from == 2 and resumed.rounds_done == 3
    assert_identical(full.state.weights, resumed.state.weights)
    assert full.state.meta == resumed.state.meta


# -- configs, ctx, aux --------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "bad"), [
    ("fedddpm", {"server_lr": -1e-4}), ("fedddpm", {"server_epochs": 0}),
    ("fedddpm", {"server_optimizer": "rmsprop"}), ("fedddpm", {"server_batch_size": 0}),
    ("fedddpm_plus", {"correction_lr": -1.0}), ("fedddpm_plus", {"correction_epochs": 0}),
    ("fedddpm_plus", {"server_optimizer": "lbfgs"}), ("fedddpm_plus", {"gamma": 1.5}),
    ("fedddpm_plus", {"gamma": 0.0}), ("fedddpm_plus", {"threshold": -0.1}),
    ("fedddpm_plus", {"test_every": 0}), ("fedddpm_plus", {"test_size": 1}),
    ("fedddpm_plus", {"server_lr": 1e-4}),  # FedDDPM's key: unknown here
])
def test_invalid_hyperparameters_name_the_key(name, bad):
    with pytest.raises(ConfigError) as err:
        algorithm_config(name, bad)
    assert err.value.key == f"algorithms.{name}.{next(iter(bad))}"


def test_paper_defaults():
    d = algorithm_config("fedddpm", None)
    assert (d.server_epochs, d.server_lr, d.server_optimizer, d.server_batch_size) == (1, 5e-5, "adam", 128)
    p = algorithm_config("fedddpm_plus", None)
    assert (p.test_every, p.test_size, p.gamma, p.threshold) == (10, 500, 0.4, 0.2)
    assert (p.correction_epochs, p.correction_lr, p.correct_if_no_trigger) == (20, 2e-4, True)


def test_a_classifier_refuses_an_unlabelled_aux_set():
    unlabelled = ClientData(AUX.x, torch.full((len(AUX),), -1, dtype=torch.int64))
    for name in ("fedddpm", "fedddpm_plus"):
        s = make(name, task=ClassificationTask())
        with pytest.raises(ValueError, match="unlabelled"):
            s.server_update(ServerState(W(W0)), rnd(0, unlabelled, 3, ScriptedFID([1.0])))
    assert not uses_labels(DiffusionTask(num_train_timesteps=10))  # unconditional: labels unused
    assert uses_labels(DiffusionTask(num_train_timesteps=10, conditional=True))
    unconditional = make("fedddpm", task=DiffusionTask(num_train_timesteps=10))
    with pytest.raises(ValueError, match="empty"):
        unconditional.server_update(ServerState(W(W0)), rnd(0, ClientData(AUX.x[:0], AUX.y[:0])))


def test_missing_server_inputs_are_named():
    with pytest.raises(ValueError, match="server data"):
        make("fedddpm").server_update(ServerState(W(W0)), rnd(0, aux=None))
    with pytest.raises(ValueError, match="score"):
        make("fedddpm_plus").server_update(ServerState(W(W0)), rnd(0, total=3))


def test_the_methods_declare_their_server_data():
    for name in ("fedddpm", "fedddpm_plus"):
        assert ALGORITHMS[name].server_data_kind(algorithm_config(name, None)) == "aux"
    assert ALGORITHMS["fedavg"].server_data_kind(algorithm_config("fedavg", None)) == "none"
    with pytest.raises(ConfigError, match="server_data"):
        algorithm_config("fedddpm", {"server_data": "distill"})
