"""The FL engine: FedAvg = centralised SGD for one client, determinism, which checkpoint is resumed,
sampling, guard. Every method's determinism and kill-and-resume: tests/test_contract.py."""

import numpy as np
import pytest
import torch
from torch import nn

from fedpipe.config import dataset_config, partition_config
from fedpipe.config.fl import FLConfig, LocalTrainConfig
from fedpipe.data import ClientData, load_dataset, make_partition
from fedpipe.fl import DivergenceError, Strategy, run_federated, sample_clients, weighted_average
from fedpipe.fl.local import make_optimizer
from fedpipe.rng import torch_generator
from fedpipe.tasks import ClassificationTask


def tiny_model(seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    m = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return m


@pytest.fixture(scope="module")
def digits():
    return load_dataset(dataset_config({"name": "digits"}))


def clients_from(ds, scheme: dict, seed: int = 0) -> list[ClientData]:
    part = make_partition(ds.train.y.numpy(), ds.test.y.numpy(), 10,
                          partition_config(scheme), seed)
    return [ClientData(ds.train.x[torch.from_numpy(i)], ds.train.y[torch.from_numpy(i)])
            for i in part.train]


def fedavg(local: LocalTrainConfig, n: int = 1) -> Strategy:
    return Strategy(ClassificationTask(), tiny_model, local, num_clients=n)


def test_fedavg_one_client_equals_centralised_sgd(digits):
    data = ClientData(digits.train.x[:300], digits.train.y[:300])
    local = LocalTrainConfig(epochs=1, batch_size=32, lr=0.1, momentum=0.9, weight_decay=1e-4)
    fl = FLConfig(rounds=1, participation=1.0, local=local)
    res = run_federated(fedavg(local), tiny_model(), [data], fl, seed=5, progress=False)

    # plain PyTorch: same init, same generator stream for shuffling, same optimizer
    model = tiny_model()
    opt = make_optimizer(model.parameters(), local, local.lr)
    gen = torch_generator(5, "client-update", 0, 0)
    for idx in torch.randperm(300, generator=gen).split(32):
        opt.zero_grad()
        nn.functional.cross_entropy(model(data.x[idx]), data.y[idx]).backward()
        opt.step()
    for k, v in model.state_dict().items():
        assert torch.equal(res.state.weights[k], v), k


def run(ds, seed: int, rounds: int = 4, **kw):
    local = LocalTrainConfig(epochs=1, batch_size=32, lr=0.1)
    fl = FLConfig(rounds=rounds, participation=0.5, local=local, checkpoint_every=2)
    task = ClassificationTask()

    def evaluate(state, personal=None):
        m = tiny_model()
        m.load_state_dict(state.weights)
        return task.evaluate(m, ds.test.x, ds.test.y)

    clients = clients_from(ds, {"scheme": "dirichlet", "num_clients": 10, "alpha": 0.5})
    return run_federated(fedavg(local, 10), tiny_model(), clients, fl, seed, evaluate=evaluate,
                         progress=False, **kw)


def test_same_seed_same_metrics_other_seed_differs(digits):
    a, b, c = run(digits, 1), run(digits, 1), run(digits, 2)
    assert a.history == b.history
    assert a.history != c.history
    for k in a.state.weights:
        assert torch.equal(a.state.weights[k], b.state.weights[k])


def test_a_checkpoint_of_other_params_is_not_resumed(digits, tmp_path):
    """A checkpoint is resumed only under the fingerprint it was written with (the same params and
    data). That a resumed run ends bit for bit as the uninterrupted one is the method contract's
    check, for every method (tests/test_contract.py)."""
    first = run(digits, 3, rounds=5, checkpoint_dir=tmp_path, fingerprint="x", stop_after=3)
    assert first.rounds_done == 3
    other = run(digits, 3, rounds=5, checkpoint_dir=tmp_path, fingerprint="y")
    assert other.resumed_from == 0 and other.rounds_done == 5
    assert run(digits, 3, rounds=5, checkpoint_dir=tmp_path, fingerprint="y").resumed_from == 5


def test_sample_clients():
    assert sample_clients(10, 10, 0, 3) == list(range(10))
    s = sample_clients(100, 15, 7, 2)
    assert len(s) == 15 == len(set(s)) and s == sorted(s) and s == sample_clients(100, 15, 7, 2)
    assert s != sample_clients(100, 15, 7, 3)
    assert FLConfig(participation=0.15).clients_per_round(100) == 15
    assert FLConfig(participation=0.01).clients_per_round(10) == 1


def test_weighted_average_hand_computed():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    out = weighted_average([a, b], [1, 3])  # 0.25 * a + 0.75 * b
    assert torch.allclose(out["w"], torch.tensor([2.5, 5.0]))
    assert int(out["n"]) == 3  # integer buffers: first item's value
    single = weighted_average([a], [17])
    assert torch.equal(single["w"], a["w"])


def test_divergence_guard_names_round_and_client(digits):
    local = LocalTrainConfig(epochs=1, batch_size=32, lr=0.1)
    fl = FLConfig(rounds=3, participation=1.0, local=local)
    clients = clients_from(digits, {"scheme": "iid", "num_clients": 3})
    bad_x = clients[1].x.clone()
    bad_x[5, 0, 3, 3] = float("inf")  # one corrupt pixel on client 1
    clients[1] = ClientData(bad_x, clients[1].y)
    with pytest.raises(DivergenceError, match=r"round 1, client 1: non-finite"):
        run_federated(fedavg(local, 3), tiny_model(), clients, fl, 0, progress=False)


def test_fedavg_iid_digits_reaches_90_percent(digits):
    from fedpipe.models import build_model

    local = LocalTrainConfig(epochs=2, batch_size=32, lr=0.05)
    fl = FLConfig(rounds=20, participation=1.0, local=local)
    clients = clients_from(digits, {"scheme": "iid", "num_clients": 10})
    task = ClassificationTask()

    def model_fn():
        torch.manual_seed(0)
        return build_model("mlp", (1, 8, 8), 10, mean=digits.meta.mean, std=digits.meta.std)

    res = run_federated(Strategy(task, model_fn, local, num_clients=10), model_fn(), clients, fl,
                        0, progress=False)
    m = model_fn()
    m.load_state_dict(res.state.weights)
    acc = task.evaluate(m, digits.test.x, digits.test.y)["accuracy"]
    assert acc >= 0.90, acc


def test_steps_mode_runs_exact_number_of_steps(digits):
    from fedpipe.fl.local import local_train

    data = ClientData(digits.train.x[:50], digits.train.y[:50])
    cfg = LocalTrainConfig(steps=7, batch_size=16, lr=0.01)
    out = local_train(tiny_model(), data, ClassificationTask(), cfg, 0, torch_generator(0, "t"))
    assert out["steps"] == 7.0 and np.isfinite(out["loss"])


def test_step_hook_runs_once_after_each_step(digits):
    from fedpipe.fl.local import local_train

    data = ClientData(digits.train.x[:50], digits.train.y[:50])
    cfg = LocalTrainConfig(epochs=2, batch_size=16, lr=0.1)
    model = tiny_model()
    seen: list[torch.Tensor] = []  # the first weight matrix as each call sees it
    out = local_train(model, data, ClassificationTask(), cfg, 0, torch_generator(0, "t"),
                      step_hook=lambda m: seen.append(m[1].weight.detach().clone()))
    assert len(seen) == out["steps"] == 8  # 2 epochs x ceil(50 / 16)
    assert not torch.equal(seen[0], tiny_model()[1].weight)  # after the first step...
    assert torch.equal(seen[-1], model[1].weight)  # ...and after the last


@pytest.mark.parametrize("opt", [{"momentum": 0.9, "weight_decay": 1e-3}, {"optimizer": "adam"}])
def test_reused_optimizer_starts_from_a_fresh_state(digits, opt):
    """The optimizer reused for a model (its momentum / Adam state cleared) gives bit for bit the
    result of a new one."""
    from fedpipe.fl.local import local_train

    first = ClientData(digits.train.x[:40], digits.train.y[:40])
    second = ClientData(digits.train.x[40:90], digits.train.y[40:90])
    cfg = LocalTrainConfig(epochs=2, batch_size=16, lr=0.01, **opt)
    task = ClassificationTask()
    used = tiny_model(1)
    local_train(used, first, task, cfg, 0, torch_generator(0, "a"))  # leaves its optimizer behind
    used.load_state_dict(tiny_model().state_dict())
    out_used = local_train(used, second, task, cfg, 3, torch_generator(0, "b"))
    new = tiny_model()
    out_new = local_train(new, second, task, cfg, 3, torch_generator(0, "b"))
    assert out_used == out_new
    for a, b in zip(used.parameters(), new.parameters(), strict=True):
        assert torch.equal(a, b)


def test_fixed_parameters_follow_requires_grad(digits):
    from fedpipe.fl.local import fix_parameters, local_train

    data = ClientData(digits.train.x[:50], digits.train.y[:50])
    cfg = LocalTrainConfig(epochs=1, batch_size=16, lr=0.1)
    model = tiny_model()
    fix_parameters(model)
    model[1].weight.requires_grad_(False)
    local_train(model, data, ClassificationTask(), cfg, 0, torch_generator(0, "t"))
    assert torch.equal(model[1].weight, tiny_model()[1].weight)  # frozen: not trained
    assert not torch.equal(model[3].weight, tiny_model()[3].weight)


def test_training_only_trains_the_named_parameters_and_restores_every_flag(digits):
    from fedpipe.fl.local import local_train, training_only

    data = ClientData(digits.train.x[:50], digits.train.y[:50])
    cfg = LocalTrainConfig(epochs=1, batch_size=16, lr=0.1)
    model = tiny_model()
    model[1].bias.requires_grad_(False)  # frozen before: stays frozen though named
    with training_only(model, {"1.weight", "1.bias"}):
        assert [p.requires_grad for p in model.parameters()] == [True, False, False, False]
        local_train(model, data, ClassificationTask(), cfg, 0, torch_generator(0, "t"))
    assert [p.requires_grad for p in model.parameters()] == [True, False, True, True]
    before = tiny_model()
    assert not torch.equal(model[1].weight, before[1].weight)
    for trained, initial in ((model[1].bias, before[1].bias), (model[3].weight, before[3].weight),
                             (model[3].bias, before[3].bias)):
        assert torch.equal(trained, initial)
    with pytest.raises(RuntimeError, match="stop"), training_only(model, set()):
        assert not any(p.requires_grad for p in model.parameters())
        raise RuntimeError("stop")
    assert [p.requires_grad for p in model.parameters()] == [True, False, True, True]


def test_client_weights_are_not_changed_by_later_clients(digits):
    """A client's update holds the tensors the scratch model trained in; the next client gets new
    ones, so the first update stays as it was."""
    local = LocalTrainConfig(epochs=1, batch_size=16, lr=0.1)
    s = fedavg(local, 2)
    clients = clients_from(digits, {"scheme": "iid", "num_clients": 2})
    payload = s.payload(s.init_server(tiny_model()), 0, 0)
    initial = tiny_model().state_dict()
    first, _, _ = s.client_update(payload, {}, clients[0], torch_generator(0, "a"), 0)
    kept = {k: v.clone() for k, v in first.weights.items()}
    second, _, _ = s.client_update(payload, {}, clients[1], torch_generator(0, "b"), 1)
    for k, v in kept.items():
        assert torch.equal(first.weights[k], v), k
        assert not torch.equal(second.weights[k], v), k
        assert not torch.equal(initial[k], v), k  # trained...
        assert torch.equal(payload.weights[k], initial[k]), k  # ...from an untouched payload


def test_all_finite_checks_every_element():
    from fedpipe.fl.state import all_finite

    assert all_finite({}) and all_finite({"w": torch.ones(3), "n": torch.tensor(7)})
    assert all_finite({"w": torch.full((4,), 3e38)})  # the norm overflows, the values are finite
    assert not all_finite({"w": torch.ones(3), "v": torch.tensor([1.0, float("inf")])})
    assert not all_finite({"w": torch.tensor([float("nan")], dtype=torch.float64)})


def test_tied_weights_stay_tied_and_are_returned_under_each_name(digits):
    """A tensor the model holds under two names: the scratch model keeps one (tied) tensor, and the
    update holds the trained value under both names, as separate tensors."""

    def shared() -> nn.Module:
        torch.manual_seed(0)
        m = nn.Sequential(nn.Flatten(), nn.Linear(64, 10), nn.ReLU(), nn.Linear(10, 10), nn.ReLU(),
                          nn.Linear(10, 10))
        m[5].weight = m[3].weight  # tied
        return m

    local = LocalTrainConfig(epochs=1, batch_size=16, lr=0.1)
    s = Strategy(ClassificationTask(), shared, local)
    payload = s.payload(s.init_server(shared()), 0, 0)
    data = ClientData(digits.train.x[:50], digits.train.y[:50])
    update, _, _ = s.client_update(payload, {}, data, torch_generator(0, "t"))
    model = s._scratch
    assert model[5].weight is model[3].weight  # still tied after loading new tensors
    assert torch.equal(update.weights["3.weight"], model[3].weight)
    assert torch.equal(update.weights["5.weight"], model[3].weight)
    assert update.weights["3.weight"].data_ptr() != update.weights["5.weight"].data_ptr()
    assert not torch.equal(update.weights["3.weight"], payload.weights["3.weight"])


@pytest.mark.parametrize("on_device", [None, True])
def test_loss_mean_hand_computed_on_both_paths(on_device):
    from fedpipe.fl.local import LossMean

    meter = LossMean(on_device=on_device)
    assert meter.value() == 0.0
    for v in (0.5, 1.25, 3.0):
        meter.add(torch.tensor(v, requires_grad=True) * 1.0)  # a loss still attached to a graph
    assert meter.count == 3
    assert meter.value() == pytest.approx((0.5 + 1.25 + 3.0) / 3, abs=1e-12)
    assert bool(meter.kept) is bool(on_device)  # CPU losses are read as they come, not kept


def test_local_loss_is_the_mean_of_the_batch_losses(digits):
    from fedpipe.fl.local import local_train

    data = clients_from(digits, {"scheme": "iid", "num_clients": 4})[0]
    local = LocalTrainConfig(epochs=1, batch_size=16, lr=1e-12)  # every batch sees the same model
    model = tiny_model()
    out = local_train(model, data, ClassificationTask(), local, 0, torch_generator(0, "t"))
    gen = torch_generator(0, "t")
    with torch.no_grad():
        expected = [float(nn.functional.cross_entropy(model(x), y))
                    for x, y in data.batches(16, gen)]
    assert out["steps"] == len(expected)
    assert out["loss"] == pytest.approx(sum(expected) / len(expected), rel=1e-6)
