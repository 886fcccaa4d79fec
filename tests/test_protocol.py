"""Round protocol v2: strategy-owned selection (with probes), per-client payloads, the round's view in
the server hooks, personal parameters (FedPer, FedRep, Local, FedAvg+FT) against hand-computed steps,
and per-client state files."""

from __future__ import annotations

import torch
from fakes import (
    B0,
    DT,
    FULL_BATCH,
    H0,
    LR,
    REGRESSION_CLIENTS,
    MSETask,
    TwoLayer,
    grad_body,
    grad_head,
    residual,
    two_layer_strategy,
)

from fedpipe.config.fl import FLConfig, LocalTrainConfig
from fedpipe.fl import ClientStore, RoundInfo, ServerData, Strategy, run_federated, sample_clients
from fedpipe.fl.engine import CLIENTS_DIR, load_checkpoint
from fedpipe.fl.local import local_train
from fedpipe.rng import numpy_rng, torch_generator

CLIENTS = list(REGRESSION_CLIENTS)


def make(name: str, cfg=None, local: LocalTrainConfig = FULL_BATCH):
    return two_layer_strategy(name, cfg, local, num_clients=len(CLIENTS))


# -- personalization -----------------------------------------------------------------------------
def test_fedper_keeps_the_head_on_the_client_and_averages_the_body():
    fl = FLConfig(rounds=2, participation=1.0, local=FULL_BATCH, checkpoint_every=10)
    res = run_federated(make("fedper"), TwoLayer(), CLIENTS, fl, seed=0, progress=False)
    # round 1: every client does one full-batch step from (B0, H0)
    B1 = [B0 - LR * grad_body(B0, H0, d) for d in CLIENTS]
    h1 = [H0 - LR * grad_head(B0, H0, d) for d in CLIENTS]
    n = torch.tensor([len(d) for d in CLIENTS], dtype=DT)
    avg1 = sum(w * b for w, b in zip(n / n.sum(), B1, strict=True))
    # round 2: from the averaged body and the client's own head
    B2 = [avg1 - LR * grad_body(avg1, h, d) for h, d in zip(h1, CLIENTS, strict=True)]
    h2 = [h - LR * grad_head(avg1, h, d) for h, d in zip(h1, CLIENTS, strict=True)]
    avg2 = sum(w * b for w, b in zip(n / n.sum(), B2, strict=True))
    torch.testing.assert_close(res.state.weights["body.weight"], avg2, rtol=0, atol=1e-14)
    assert torch.equal(res.state.weights["head.weight"], H0)  # the global model keeps the initial head
    for cid, h in enumerate(h2):
        torch.testing.assert_close(res.client_states[cid]["personal"]["head.weight"], h, rtol=0,
                                   atol=1e-14)
        # the personal model: the shared body with the client's own head
        torch.testing.assert_close(res.personal[cid]["head.weight"], h, rtol=0, atol=1e-14)
        assert torch.equal(res.personal[cid]["body.weight"], res.state.weights["body.weight"])


def test_fedrep_trains_the_head_then_the_body():
    s = make("fedrep", {"head_epochs": 1, "body_epochs": 1}, LocalTrainConfig(batch_size=64, lr=LR))
    d = CLIENTS[1]
    payload = s.payload(s.init_server(TwoLayer()), 0, 1)
    update, state, metrics = s.client_update(payload, {}, d, torch_generator(0, "t"), 1)
    h1 = H0 - LR * grad_head(B0, H0, d)  # step 1: the head, body fixed
    B1 = B0 - LR * grad_body(B0, h1, d)  # step 2: the body, with the new head fixed
    torch.testing.assert_close(state["personal"]["head.weight"], h1, rtol=0, atol=1e-14)
    torch.testing.assert_close(update.weights["body.weight"], B1, rtol=0, atol=1e-14)
    assert set(update.weights) == {"body.weight"}  # only the body is uploaded
    assert metrics["head_steps"] == 1 and metrics["body_steps"] == 1
    assert all(p.requires_grad for p in s.scratch_model_instance().parameters())  # flags restored


def test_local_trains_each_client_alone_for_the_rounds_it_is_selected():
    local = LocalTrainConfig(epochs=1, batch_size=2, lr=LR)
    fl = FLConfig(rounds=3, participation=0.5, local=local, checkpoint_every=10)
    res = run_federated(make("local", local=local), TwoLayer(), CLIENTS, fl, seed=3, progress=False)
    assert torch.equal(res.state.weights["body.weight"], B0)  # nothing is uploaded or averaged
    rounds_of = {c: [r for r in range(3) if c in sample_clients(4, 2, 3, r)] for c in range(4)}
    assert sorted(sum(rounds_of.values(), [])) != sorted(range(3)) * 4  # not every client each round
    for cid, d in enumerate(CLIENTS):
        model = TwoLayer()
        for r in rounds_of[cid]:
            local_train(model, d, MSETask(), local, r, torch_generator(3, "client-update", r, cid))
        for k, v in model.state_dict().items():
            assert torch.equal(res.personal[cid][k], v), (cid, k)


def test_fedavg_ft_fine_tunes_the_global_model_for_evaluation():
    local = LocalTrainConfig(epochs=1, batch_size=2, lr=LR)
    fl = FLConfig(rounds=2, participation=1.0, local=local, checkpoint_every=10)
    ft = run_federated(make("fedavg_ft", {"ft_epochs": 2}, local), TwoLayer(), CLIENTS, fl, seed=0,
                       progress=False)
    plain = run_federated(make("fedavg", local=local), TwoLayer(), CLIENTS, fl, seed=0, progress=False)
    for k in plain.state.weights:  # the global model is FedAvg's
        assert torch.equal(ft.state.weights[k], plain.state.weights[k])
    for cid, d in enumerate(CLIENTS):
        model = TwoLayer()
        model.load_state_dict(plain.state.weights)
        local_train(model, d, MSETask(), LocalTrainConfig(epochs=2, batch_size=2, lr=LR), 0,
                    torch_generator(0, "personalize", 1, cid))
        for k, v in model.state_dict().items():
            assert torch.equal(ft.personal[cid][k], v), (cid, k)
    assert plain.personal is None and not make("fedavg").personalizes


def test_evaluate_sees_the_personal_models_every_eval_round():
    seen = []

    def evaluate(state, personal):
        seen.append(sorted(personal))
        return {"accuracy": 0.0, "per_client": [float(c) for c in range(len(CLIENTS))]}

    fl = FLConfig(rounds=3, participation=0.5, eval_every=2, local=FULL_BATCH, checkpoint_every=10)
    res = run_federated(make("fedper"), TwoLayer(), CLIENTS, fl, seed=0, evaluate=evaluate,
                        progress=False)
    assert seen == [[0, 1, 2, 3]] * 2  # after rounds 2 and 3 (the last), every client
    assert [(r["round"], r["client"], r["per_client"]) for r in res.client_history][:4] == [
        (2, c, float(c)) for c in range(4)]
    assert "test_accuracy" in res.history[1] and "test_accuracy" not in res.history[0]


# -- selection, payloads, the round in the server hooks ----------------------------------------
class PowerOfChoice(Strategy):
    """Test double: d = 3 uniform candidates, keep the 2 with the highest local loss."""

    picked: list[list[int]]

    def select_clients(self, state, round_, available, per_round, rng, probe=None):
        candidates = sorted(rng.choice(available, size=3, replace=False).tolist())
        losses = probe(candidates)
        chosen = sorted(sorted(candidates, key=lambda c: -losses[c]["loss"])[:per_round])
        self.picked = [*getattr(self, "picked", []), chosen]
        return chosen


def test_selection_hook_with_probes_runs_through_the_executor():
    s = PowerOfChoice(MSETask(), TwoLayer, FULL_BATCH, num_clients=4)
    fl = FLConfig(rounds=2, participation=0.5, local=FULL_BATCH, checkpoint_every=10)
    res = run_federated(s, TwoLayer(), CLIENTS, fl, seed=7, progress=False)
    state = Strategy(MSETask(), TwoLayer, FULL_BATCH, num_clients=4).init_server(TwoLayer())
    cands = sorted(numpy_rng(7, "client-sampling", 0).choice(4, size=3, replace=False).tolist())
    losses = {c: float(residual(B0, H0, CLIENTS[c]).pow(2).mean()) for c in cands}  # by hand
    probe = s.probe(s.payload(state, 0, cands[0]), {}, CLIENTS[cands[0]], torch_generator(0, "p"))
    assert abs(probe["loss"] - losses[cands[0]]) < 1e-12 and probe["num_samples"] == len(CLIENTS[cands[0]])
    expected = sorted(sorted(cands, key=lambda c: -losses[c])[:2])
    assert res.history[0]["clients"] == 2 and s.picked[0] == expected


def test_default_selection_is_todays_uniform_sampling():
    s = Strategy(MSETask(), TwoLayer, FULL_BATCH, num_clients=100)
    for r in range(3):
        got = s.select_clients(None, r, list(range(100)), 15, numpy_rng(4, "client-sampling", r))
        assert got == sample_clients(100, 15, 4, r)


class Recorder(Strategy):
    """Sends each client its id in the payload; records what the server hooks see."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen_payloads, self.rounds = [], []

    def payload(self, state, round_, client_id=0):
        p = super().payload(state, round_, client_id)
        return type(p)(p.round, p.weights, {"id": {"c": torch.tensor([float(client_id)])}}, client_id)

    def client_update(self, payload, client_state, data, gen, client_id=0):
        self.seen_payloads.append((client_id, float(payload.extra["id"]["c"])))
        return super().client_update(payload, client_state, data, gen, client_id)

    def server_update(self, state, rnd: RoundInfo):
        self.rounds.append((rnd.index, [u.client_id for u in rnd.updates], rnd.server_data,
                            torch.rand(2, generator=rnd.generator())))
        return state


def test_per_client_payloads_and_the_round_in_the_server_hooks():
    s = Recorder(MSETask(), TwoLayer, FULL_BATCH, num_clients=4)
    sd = ServerData("aux", CLIENTS[0], True, "test")
    fl = FLConfig(rounds=2, participation=0.75, local=FULL_BATCH, checkpoint_every=10)
    run_federated(s, TwoLayer(), CLIENTS, fl, seed=5, server_data=sd, progress=False)
    assert all(cid == got for cid, got in s.seen_payloads)
    for r, (index, ids, data_seen, draw) in enumerate(s.rounds):
        assert index == r and ids == sample_clients(4, 3, 5, r) and data_seen is sd
        assert torch.equal(draw, torch.rand(2, generator=torch_generator(5, "server-update", r)))


# -- per-client state files -------------------------------------------------------------------
def test_client_state_is_one_file_per_client_loaded_when_needed(tmp_path):
    s = make("scaffold", local=LocalTrainConfig(steps=1, batch_size=64, lr=LR))
    fl = FLConfig(rounds=3, participation=0.5, local=s.local, checkpoint_every=1)
    res = run_federated(s, TwoLayer(), CLIENTS, fl, seed=2, checkpoint_dir=tmp_path, fingerprint="f",
                        progress=False)
    files = sorted(f.name for f in (tmp_path / CLIENTS_DIR).iterdir())
    ids = sorted(res.client_states)
    # one file per client that has state, at the version of the last round it trained in
    assert [f.split("-")[0] for f in files] == [str(c) for c in ids]
    last = {c: max(r for r in range(3) if c in sample_clients(4, 2, 2, r)) + 1 for c in ids}
    assert files == sorted(f"{c}-r{last[c]}.safetensors" for c in ids)
    meta, _, store = load_checkpoint(tmp_path)
    assert isinstance(store, ClientStore) and store.states == {}  # nothing loaded yet
    for c in ids:
        assert torch.equal(store.get(c)["c_i"]["body.weight"], res.client_states[c]["c_i"]["body.weight"])
    assert meta["round"] == 3
