"""Early stopping by a strategy (FedDDPM+'s QuickTest): the engine ends the run after the round in
which ``state.meta["stopped_at"]`` is set, checkpoints it, and a resumed run does not train further."""

import torch
from fakes import assert_identical
from torch import nn

from fedpipe.config.fl import FLConfig, LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl import ServerState, Strategy, run_federated
from fedpipe.tasks import ClassificationTask


def tiny_model() -> nn.Module:
    torch.manual_seed(0)  # test-local model factory; the engine never seeds the global RNG
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 3))


class StopAtThree(Strategy):
    def server_update(self, state: ServerState, rnd) -> ServerState:
        round_ = rnd.index
        if round_ + 1 == 3:
            return ServerState(state.weights, state.extra, {**state.meta, "stopped_at": round_ + 1})
        return state


def data(n: int = 12) -> ClientData:
    g = torch.Generator().manual_seed(1)
    return ClientData(torch.randn(n, 1, 2, 2, generator=g), torch.randint(0, 3, (n,), generator=g))


def test_strategy_stops_training_and_resume_does_not_continue(tmp_path):
    local = LocalTrainConfig(epochs=1, batch_size=4, lr=0.1)
    fl = FLConfig(rounds=10, participation=1.0, local=local, checkpoint_every=100)
    clients = [data(), data(8)]
    strategy = StopAtThree(ClassificationTask(), tiny_model, local, num_clients=2)
    res = run_federated(strategy, tiny_model(), clients, fl, seed=0, checkpoint_dir=tmp_path,
                        progress=False)
    assert res.rounds_done == 3 and [h["round"] for h in res.history] == [1.0, 2.0, 3.0]
    assert res.state.meta["stopped_at"] == 3
    assert (tmp_path / "server.safetensors").is_file()  # the stop round is checkpointed
    again = run_federated(StopAtThree(ClassificationTask(), tiny_model, local, num_clients=2),
                          tiny_model(), clients, fl, seed=0, checkpoint_dir=tmp_path, progress=False)
    assert again.resumed_from == 3 and again.rounds_done == 3 and again.history == res.history
    assert_identical(res.state.weights, again.state.weights)  # nothing trained after the stop
    assert_identical(res.state.extra, again.state.extra)
    assert again.state.meta == res.state.meta
    assert_identical(res.client_states, again.client_states)


def test_the_stop_round_is_evaluated_even_between_eval_rounds():
    """A stop before the first ``eval_every`` round still scores the model it ends with (a FedDDPM+
    run that stopped at round 4 with ``eval_every`` 5 had no test entry and its stage crashed)."""
    local = LocalTrainConfig(epochs=1, batch_size=4, lr=0.1)
    fl = FLConfig(rounds=10, participation=1.0, local=local, eval_every=5, checkpoint_every=100)
    scored = []

    def evaluate(state, personal=None):
        scored.append(state.meta.get("stopped_at"))
        return {"loss": 1.0}

    strategy = StopAtThree(ClassificationTask(), tiny_model, local, num_clients=2)
    res = run_federated(strategy, tiny_model(), [data(), data(8)], fl, seed=0, evaluate=evaluate,
                        progress=False)
    assert res.rounds_done == 3 and scored == [3]
    assert [("test_loss" in h) for h in res.history] == [False, False, True]
    interrupted = run_federated(StopAtThree(ClassificationTask(), tiny_model, local, num_clients=2),
                                tiny_model(), [data(), data(8)], fl, seed=0, evaluate=evaluate,
                                stop_after=2, progress=False)
    assert interrupted.rounds_done == 2 and scored == [3]  # an interruption is not scored
