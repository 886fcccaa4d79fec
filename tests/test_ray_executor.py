"""The Ray executor (``fl.executor: ray``): bit-identical to the serial executor on CPU, data shipped
once, its config checked before compute."""

import os
import sys
import warnings

import cloudpickle
import pytest
import ray
import torch
from fakes import assert_identical
from torch import nn

from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.config import ConfigError
from fedpipe.config.fl import FLConfig, LocalTrainConfig, RayConfig, fl_config
from fedpipe.data import ClientData
from fedpipe.fl import run_federated
from fedpipe.fl.ray_executor import RayExecutor, connect, pack_data, unpack_data
from fedpipe.tasks import ClassificationTask

N_CLIENTS = 6

# Ray workers cannot import this test module: its model builder travels by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Net(nn.Module):
    """features + head, so FedPer has a personal head."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.features(x))


def model_fn() -> nn.Module:
    g = torch.Generator().manual_seed(0)
    m = Net()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return m


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray instance for the module (start-up costs seconds)."""
    started = not ray.is_initialized()
    warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
    if started:  # the executor's own start-up: a local instance of FEDPIPE_WORKERS = 2 CPUs
        before = os.environ.get("FEDPIPE_WORKERS")
        os.environ["FEDPIPE_WORKERS"] = "2"
        try:
            connect(RayConfig())
        finally:
            if before is None:
                os.environ.pop("FEDPIPE_WORKERS")
            else:
                os.environ["FEDPIPE_WORKERS"] = before
        assert ray.cluster_resources()["CPU"] == 2
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def clients() -> list[ClientData]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(N_CLIENTS):
        n = 20 + 7 * i  # unequal sizes: batches of different counts per client
        x = torch.randn(n, 8, generator=g) + i * 0.1
        out.append(ClientData(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()))
    return out


def run(name, executor, clients, cfg=None, participation=0.5, rounds=3):
    local = LocalTrainConfig(epochs=1, batch_size=8, lr=0.1, momentum=0.5)
    fl = FLConfig(rounds=rounds, participation=participation, local=local, executor=executor)
    s = ALGORITHMS[name](ClassificationTask(), model_fn, local, algorithm_config(name, cfg),
                         num_clients=len(clients))
    return run_federated(s, model_fn(), clients, fl, seed=3, progress=False)


@pytest.mark.parametrize("name, cfg", [
    ("fedavg", None),
    ("scaffold", None),  # server control variate and per-client c_i state
    ("fedper", None),  # personal head kept in the client state
    ("ditto", {"lam": 0.1}),  # a whole personal model per client
    ("pow_d", {"mu": 0.01}),  # client selection probes candidates through the executor
])
def test_ray_equals_serial_bit_for_bit(ray_cluster, clients, name, cfg):
    serial = run(name, "serial", clients, cfg)
    on_ray = run(name, "ray", clients, cfg)
    assert_identical(serial.state.weights, on_ray.state.weights)
    assert_identical(serial.state.extra, on_ray.state.extra)
    assert serial.client_states.keys() == on_ray.client_states.keys()
    for cid in serial.client_states:
        assert_identical(serial.client_states[cid], on_ray.client_states[cid])
    if serial.personal is not None:
        assert serial.personal.keys() == on_ray.personal.keys()
        for cid in serial.personal:
            assert_identical(serial.personal[cid], on_ray.personal[cid])
    assert [h["train_loss"] for h in serial.history] == [h["train_loss"] for h in on_ray.history]
    # the run did something: weights moved from the initial ones
    assert not torch.equal(serial.state.weights["features.0.weight"],
                           model_fn().state_dict()["features.0.weight"])


def test_same_bits_with_two_torch_threads(ray_cluster, clients):
    """The task takes the driver's thread count (results depend on it in the last bits)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        serial = run("fedavg", "serial", clients, participation=1.0, rounds=1)
        on_ray = run("fedavg", "ray", clients, participation=1.0, rounds=1)
    finally:
        torch.set_num_threads(before)
    assert_identical(serial.state.weights, on_ray.state.weights)


def test_client_data_is_shipped_once(ray_cluster, clients):
    ex = RayExecutor()
    s = ALGORITHMS["fedavg"](ClassificationTask(), model_fn, LocalTrainConfig(batch_size=8),
                             num_clients=len(clients))
    state = s.init_server(model_fn())
    refs = []
    for r in range(2):
        payloads = {c: s.payload(state, r, c) for c in (0, 1)}
        ex.run(s, payloads, [(c, {}, clients[c]) for c in (0, 1)], seed=0)
        refs.append({c: ex._data[c][1] for c in (0, 1)})
    assert refs[0] == refs[1]  # the same object-store entries in round 2: nothing re-sent
    key = ex._strategy[0]
    ex.run(s, payloads, [(0, {}, clients[0])], seed=0)
    assert ex._strategy[0] == key  # an unchanged strategy is not shipped again


def test_packed_data_round_trips():
    d = ClientData(torch.arange(12.0).reshape(4, 3), torch.tensor([0, 1, 2, 1]), ("noise", 0.5))
    back = unpack_data(ray.get(ray.put(pack_data(d)))) if ray.is_initialized() else \
        unpack_data(pack_data(d))
    assert torch.equal(back.x, d.x) and torch.equal(back.y, d.y) and back.skew == d.skew
    assert back.x.dtype == d.x.dtype and back.y.dtype == d.y.dtype


@pytest.mark.parametrize("data, key", [
    ({"executor": "dask"}, "fl.executor"),
    ({"executor": "ray", "ray": {"address": "not an address"}}, "fl.ray.address"),
    ({"executor": "ray", "ray": {"address": "head:port"}}, "fl.ray.address"),
    ({"executor": "ray", "ray": {"gpus_per_client": -1}}, "fl.ray.gpus_per_client"),
    ({"executor": "ray", "ray": {"gpus": 1}}, "fl.ray.gpus"),
    ({"executor": "ray", "ray": None}, "fl.ray"),
])
def test_bad_ray_settings_are_one_line_config_errors(data, key):
    with pytest.raises(ConfigError) as e:
        fl_config(data)
    assert e.value.key == key and "\n" not in str(e.value)


def test_good_ray_settings():
    fl = fl_config({"executor": "ray", "ray": {"address": "10.0.0.5:6379", "gpus_per_client": 0.5}})
    assert fl.ray == RayConfig("10.0.0.5:6379", 0.5)
    assert fl_config({"ray": {"address": "ray://head-node:10001"}}).ray.address == "ray://head-node:10001"
    assert fl_config({"ray": {"address": "auto"}}).ray.address == "auto"
    assert fl_config(None).ray == RayConfig(None, 0.0)


def test_local_instance_cpus_follow_fedpipe_workers(monkeypatch):
    from fedpipe.fl.ray_executor import local_cpus

    monkeypatch.setenv("FEDPIPE_WORKERS", "3")
    assert local_cpus() == 3
    monkeypatch.setenv("FEDPIPE_WORKERS", "0")
    with pytest.raises(ConfigError):
        local_cpus()
    monkeypatch.delenv("FEDPIPE_WORKERS")
    assert local_cpus() >= 1


def test_unreachable_cluster_address_is_a_config_error_at_once():
    import socket

    from fedpipe.fl.ray_executor import reachable

    with socket.socket() as s:  # a port that nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(ConfigError) as e:
            reachable(f"127.0.0.1:{port}", timeout=2.0)
    assert e.value.key == "fl.ray.address" and "\n" not in str(e.value)
