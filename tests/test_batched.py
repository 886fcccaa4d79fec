"""The batched executor (``fl.executor: batched``, fedpipe.fl.batched): equal to the serial executor
to its documented tolerance for every method that declares itself batchable (read from the registry),
under SGD with momentum, weight decay and clipping and under Adam, on clients of unequal size;
serial fallback with one log line otherwise; same seed, same result. The method contract
(tests/test_contract.py) runs every batchable method batched on its own track too: equal to serial,
device-clean, and killed and resumed bit for bit."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
import torch.nn.functional as F
from fakes import assert_identical
from torch import nn

from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.config import ConfigError
from fedpipe.config.fl import FLConfig, LocalTrainConfig, fl_config
from fedpipe.data import ClientData
from fedpipe.fl import run_federated
from fedpipe.fl.batched import (
    ADAM_UPDATE_RTOL,
    ATOL,
    RTOL,
    BatchedExecutor,
    _masked_cross_entropy,
    _pad,
    _StackedOptimizer,
    supports_batching,
)
from fedpipe.fl.executors import SerialExecutor
from fedpipe.fl.local import make_optimizer
from fedpipe.fl.strategy import batches
from fedpipe.tasks import ClassificationTask

BATCHED = tuple(n for n in sorted(ALGORITHMS) if batches(ALGORITHMS[n]))
"""The registered methods whose client step the batched executor runs."""
ON_THEIR_OWN = tuple(n for n in BATCHED
                     if ALGORITHMS[n].server_data_kind(ALGORITHMS[n].config_class()) == "none")
"""Those whose server step needs nothing from the pipeline: run here end to end."""
WITH_SERVER_DATA = tuple(n for n in BATCHED if n not in ON_THEIR_OWN)
"""Those whose server step needs the pipeline's server data (FedDDPM's auxiliary set and score): here
one round's client work is compared; the contract runs them end to end on their track."""


class Net(nn.Module):
    """A tiny classifier with a ``head`` (FedPer's personal module) on 8x8 inputs."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.ReLU())
        self.head = nn.Linear(12, 4)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)

    def forward(self, x):
        return self.head(self.body(x))


def make_clients(sizes, seed: int = 0) -> list[ClientData]:
    g = torch.Generator().manual_seed(seed)
    return [ClientData(torch.rand(n, 1, 4, 4, generator=g), torch.randint(0, 4, (n,), generator=g))
            for n in sizes]


SIZES = (5, 23, 11, 40, 17, 8)  # unequal: different step counts and short last batches
LOCALS = {
    "sgd": LocalTrainConfig(epochs=2, batch_size=8, lr=0.1, momentum=0.9, weight_decay=1e-3,
                            grad_clip=1.0),
    "adam": LocalTrainConfig(steps=4, batch_size=8, optimizer="adam", lr=1e-2, weight_decay=1e-3),
}


def run(name: str, executor: str, local: LocalTrainConfig, seed: int = 3, sizes=SIZES,
        cfg: dict | None = None, model_fn=Net):
    clients = make_clients(sizes)
    fl = FLConfig(rounds=2, participation=0.7, local=local, executor=executor)
    strategy = ALGORITHMS[name](ClassificationTask(), model_fn, local,
                                algorithm_config(name, cfg or {}), num_clients=len(clients))
    return run_federated(strategy, model_fn(), clients, fl, seed, progress=False)


def assert_close(a, b):
    """Equal to the batched executor's documented tolerance: weights or named groups of them."""
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            assert_close(a[k], b[k])
        else:
            torch.testing.assert_close(b[k], a[k], atol=ATOL, rtol=RTOL, msg=k)


def with_proximal_term(name: str) -> dict | None:
    """A proximal weight large enough to matter, for a method that has one (FedProx and the methods
    built on it)."""
    fields = {f.name for f in dataclasses.fields(ALGORITHMS[name].config_class)}
    return {"mu": 0.5} if "mu" in fields else None


@pytest.mark.parametrize("opt", ["sgd", "adam"])
@pytest.mark.parametrize("name", ON_THEIR_OWN)
def test_batched_equals_serial(name, opt, caplog):
    cfg = with_proximal_term(name)
    with caplog.at_level(logging.WARNING, logger="fedpipe.fl.batched"):
        serial = run(name, "serial", LOCALS[opt], cfg=cfg)
        batched = run(name, "batched", LOCALS[opt], cfg=cfg)
    assert not caplog.records  # batched for real, no fallback
    assert_close(serial.state.weights, batched.state.weights)
    assert_close(serial.state.extra, batched.state.extra)  # SCAFFOLD's c
    assert serial.client_states.keys() == batched.client_states.keys()
    for cid in serial.client_states:  # SCAFFOLD's c_i, FedPer's personal head
        assert_close(serial.client_states[cid], batched.client_states[cid])
    for hs, hb in zip(serial.history, batched.history, strict=True):
        assert hs["clients"] == hb["clients"]
        assert hb["train_loss"] == pytest.approx(hs["train_loss"], rel=1e-5)
    moved = max(float((serial.state.weights[k] - Net().state_dict()[k]).abs().max())
                for k in serial.state.weights)
    assert moved > 100 * ATOL  # the tolerance is far below what training changes


def test_scaffold_option2_and_all_clients_of_unequal_steps():
    """Every client in every round, step counts 1..6 (epochs of batch 8 over 3..41 samples)."""
    local = LocalTrainConfig(epochs=1, batch_size=8, lr=0.2)
    sizes = (3, 41, 8, 9, 30)

    def go(ex):
        clients = make_clients(sizes, seed=1)
        fl = FLConfig(rounds=2, participation=1.0, local=local, executor=ex)
        s = ALGORITHMS["scaffold"](ClassificationTask(), Net, local,
                                   algorithm_config("scaffold", {"control_variate": "option2"}),
                                   num_clients=len(sizes))
        return run_federated(s, Net(), clients, fl, 0, progress=False)

    a, b = go("serial"), go("batched")
    assert_close(a.state.weights, b.state.weights)
    assert_close(a.state.extra, b.state.extra)
    for cid in range(len(sizes)):
        assert_close(a.client_states[cid], b.client_states[cid])


@pytest.mark.parametrize("name", WITH_SERVER_DATA)
def test_client_step_of_a_method_with_server_data_batched_equals_serial(name):
    """FedDDPM(+) train clients as FedAvg (their server steps need the pipeline's aux data and
    score, so the executors are compared on one round's client work directly)."""
    local = LOCALS["adam"]
    s = ALGORITHMS[name](ClassificationTask(), Net, local, algorithm_config(name, {}),
                         num_clients=len(SIZES))
    state = s.init_server(Net())
    clients = make_clients(SIZES)
    payloads = {c: s.payload(state, 1, c) for c in range(len(SIZES))}
    jobs = [(c, s.init_client(c), clients[c]) for c in range(len(SIZES))]
    assert supports_batching(s)
    serial = SerialExecutor().run(s, payloads, jobs, 7)
    batched = BatchedExecutor().run(s, payloads, jobs, 7)
    for (us, _, ms), (ub, _, mb) in zip(serial, batched, strict=True):
        assert us.client_id == ub.client_id and us.num_samples == ub.num_samples
        assert_close(us.weights, ub.weights)
        assert mb["steps"] == ms["steps"] and mb["loss"] == pytest.approx(ms["loss"], rel=1e-5)


def test_same_seed_same_result_other_seed_differs():
    a, b = run("fedprox", "batched", LOCALS["sgd"]), run("fedprox", "batched", LOCALS["sgd"])
    c = run("fedprox", "batched", LOCALS["sgd"], seed=4)
    assert_identical(a.state.weights, b.state.weights)
    assert a.history == b.history
    assert any(not torch.equal(a.state.weights[k], c.state.weights[k]) for k in a.state.weights)


def test_unsupported_method_falls_back_to_serial_with_one_log_line(caplog):
    with caplog.at_level(logging.INFO, logger="fedpipe.fl.batched"):
        batched = run("fedrep", "batched", LOCALS["sgd"])
    serial = run("fedrep", "serial", LOCALS["sgd"])
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines  # once per run, not once per round
    assert "fedrep" in lines[0] and "serially" in lines[0]
    assert_identical(serial.state.weights, batched.state.weights)  # it ran the serial executor


def test_flag_is_not_inherited_by_a_subclass_with_its_own_client_step():
    """EquitableFL subclasses FedProx (batchable) but overrides client_update: serial."""
    local = LOCALS["sgd"]
    make = lambda name: ALGORITHMS[name](ClassificationTask(), Net, local,  # noqa: E731
                                         algorithm_config(name, {}), num_clients=2)
    assert supports_batching(make("fedprox")) and supports_batching(make("pow_d"))
    assert not supports_batching(make("equitable_fl"))
    assert not supports_batching(make("ditto"))  # stateful personal model: default False


def test_model_with_batchnorm_falls_back(caplog):
    def bn_net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.BatchNorm1d(8), nn.Linear(8, 4))

    with caplog.at_level(logging.WARNING, logger="fedpipe.fl.batched"):
        batched = run("fedavg", "batched", LOCALS["sgd"], model_fn=bn_net, sizes=(6, 12, 20))
    serial = run("fedavg", "serial", LOCALS["sgd"], model_fn=bn_net, sizes=(6, 12, 20))
    assert len(caplog.records) == 1 and "BatchNorm" in caplog.records[0].getMessage()
    assert_identical(serial.state.weights, batched.state.weights)


def test_executor_is_validated():
    assert fl_config({"executor": "batched"}).executor == "batched"
    with pytest.raises(ConfigError, match="fl.executor"):
        fl_config({"executor": "vectorised"})


# -- the pieces, against torch's own ------------------------------------------------------------
def test_padded_masked_loss_is_each_clients_batch_mean():
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(n, 3, generator=g), torch.randint(0, 5, (n,), generator=g))
               for n in (4, 1, 3)]
    (x, y), mask = _pad(batches)
    assert x.shape == (3, 4, 3) and mask.sum(1).tolist() == [4.0, 1.0, 3.0]
    w = torch.randn(3, 5, generator=g)
    for j, (xb, yb) in enumerate(batches):
        expected = F.cross_entropy(xb @ w, yb)
        torch.testing.assert_close(_masked_cross_entropy(x[j] @ w, y[j], mask[j]), expected)


@pytest.mark.parametrize("cfg", [
    LocalTrainConfig(lr=0.1, momentum=0.9, weight_decay=0.01),
    LocalTrainConfig(optimizer="adam", lr=0.01, weight_decay=0.01),
])
def test_stacked_optimizer_matches_torch_with_a_shrinking_prefix(cfg):
    """Client 0 takes 3 steps, client 1 two, client 2 one: each as its own torch optimizer."""
    g = torch.Generator().manual_seed(0)
    start = torch.randn(3, 2, 3, generator=g)
    grads = torch.randn(3, 3, 2, 3, generator=g)  # [step, client, ...]
    stacked = {"w": start.clone()}
    opt = _StackedOptimizer(cfg, cfg.lr, stacked)
    for s, a in enumerate((3, 2, 1)):
        opt.step({"w": grads[s, :a].clone()}, a)
    for c, steps in enumerate((3, 2, 1)):
        w = nn.Parameter(start[c].clone())
        ref = make_optimizer([w], cfg, cfg.lr)
        for s in range(steps):
            w.grad = grads[s, c].clone()
            ref.step()
        torch.testing.assert_close(stacked["w"][c], w.detach(), atol=1e-7, rtol=1e-6)


# -- the diffusion task -----------------------------------------------------------------------
@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_diffusion_task_batched_equals_serial(opt):
    """FedAvg on the DDPM loss (digits_small UNet): the task's t and eps come from each client's
    stream in the serial order. SGD agrees to the tolerance; under Adam, coordinates whose gradient
    is round-off sized get full-size normalised steps, so the check is on the whole update's norm."""
    from fedpipe.models.unet import build_unet
    from fedpipe.tasks.diffusion import DiffusionTask

    def unet():
        torch.manual_seed(0)
        return build_unet("digits_small", (1, 8, 8))

    g = torch.Generator().manual_seed(0)
    clients = [ClientData(torch.rand(n, 1, 8, 8, generator=g), torch.zeros(n, dtype=torch.long))
               for n in (6, 13, 9)]
    local = (LocalTrainConfig(steps=2, batch_size=8, lr=0.05, momentum=0.9) if opt == "sgd" else
             LocalTrainConfig(steps=2, batch_size=8, lr=1e-3, optimizer="adam"))
    task = DiffusionTask(num_train_timesteps=50)
    out = {}
    for ex in ("serial", "batched"):
        fl = FLConfig(rounds=2, participation=1.0, local=local, executor=ex)
        s = ALGORITHMS["fedavg"](task, unet, local, algorithm_config("fedavg", {}), num_clients=3)
        out[ex] = run_federated(s, unet(), clients, fl, 0, progress=False)
    a, b = out["serial"].state.weights, out["batched"].state.weights
    for hs, hb in zip(out["serial"].history, out["batched"].history, strict=True):
        assert hb["train_loss"] == pytest.approx(hs["train_loss"], rel=1e-5)
    if opt == "sgd":
        assert_close(a, b)
        return
    w0 = unet().state_dict()
    diff = sum(float(((a[k] - b[k]) ** 2).sum()) for k in a) ** 0.5
    update = sum(float(((a[k] - w0[k]) ** 2).sum()) for k in a) ** 0.5
    assert diff < ADAM_UPDATE_RTOL * update, (diff, update)  # measured 2.4e-3


@pytest.mark.parametrize("local", [LocalTrainConfig(epochs=2, batch_size=4),
                                   LocalTrainConfig(steps=7, batch_size=3),
                                   LocalTrainConfig(steps=2, batch_size=16)])
def test_gathered_batches_are_the_serial_executors(local):
    """The one-gather path (classification, no feature skew) hands each active client, at each
    step, exactly the batch ``iterate_batches`` draws from the same stream: same rows, same order,
    padded with mask-0 rows only; clients of unequal size, epochs cycling, a batch wider than a
    client."""
    from fedpipe.fl.batched import _Gather, num_steps
    from fedpipe.fl.local import iterate_batches
    from fedpipe.rng import torch_generator

    sizes = [11, 9, 5, 2]  # sorted by steps, longest first, as train_clients orders them
    datas = [ClientData(torch.arange(n * 2, dtype=torch.float32).view(n, 2) + 100 * j,
                        torch.arange(n) + 10 * j) for j, n in enumerate(sizes)]
    steps = [num_steps(n, local) for n in sizes]
    gather = _Gather(datas, steps, [torch_generator(0, "t", j) for j in range(4)], local,
                     torch.device("cpu"))
    iters = [iterate_batches(d, local, torch_generator(0, "t", j)) for j, d in enumerate(datas)]
    for s in range(max(steps)):
        a = sum(1 for st in steps if st > s)
        (x, y), mask = gather.step(s, a)
        for j in range(a):
            bx, by = next(iters[j])
            m = mask[j].bool()
            assert int(m.sum()) == len(by) and bool(m[:len(by)].all())
            assert torch.equal(x[j][m], bx) and torch.equal(y[j][m], by)
            assert not x[j][~m].any() and not y[j][~m].any()
    for j, it in enumerate(iters):
        assert next(it, None) is None, f"client {j} has batches the gather never handed out"
