"""The one ``device`` setting (fedpipe.config.device, fedpipe.device): its resolution and refusals,
the CPU path bit for bit as it was (training written out as the code did before the setting
existed), the device noise streams, and CUDA-only switches that stay off on the CPU."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
import yaml
from fakes import assert_identical, default_params
from torch import nn

import fedpipe.device as dev
from fedpipe.config import ConfigError
from fedpipe.config.device import device_config
from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.data.skew import epoch_order
from fedpipe.fl.engine import groups_to
from fedpipe.fl.local import local_train, make_optimizer
from fedpipe.models.unet import build_unet
from fedpipe.pipeline.common import train_config
from fedpipe.pipeline.diffusion import diffusion_stage_config
from fedpipe.rng import torch_generator, torch_seed
from fedpipe.tasks import ClassificationTask
from fedpipe.tasks.diffusion import DiffusionTask

REPO = Path(__file__).resolve().parents[1]
PARAMS = default_params()


def with_top(**top) -> dict:
    return {**yaml.safe_load(yaml.safe_dump(PARAMS)), **top}


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(dev, "cuda_available", lambda: False)


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(dev, "cuda_available", lambda: True)


# -- resolution and refusals --------------------------------------------------------------------
def test_auto_and_cpu_resolve(no_cuda):
    assert device_config({"device": "auto"}).resolved == "cpu"
    assert device_config({}).resolved == "cpu"  # auto by default
    cfg = device_config({"device": "cpu", "accel": {"compile": True}})
    assert (cfg.name, cfg.resolved, cfg.accel.bf16_autocast, cfg.accel.compile) == (
        "cpu", "cpu", True, True)


def test_auto_and_cuda_resolve_to_cuda_where_there_is_one(fake_cuda):
    assert device_config({"device": "auto"}).resolved == "cuda"
    assert device_config({"device": "cuda"}).resolved == "cuda"
    assert device_config({"device": "cpu"}).resolved == "cpu"


def test_cuda_without_cuda_is_one_line_naming_the_key(no_cuda):
    with pytest.raises(ConfigError) as info:
        device_config({"device": "cuda"})
    msg = str(info.value)
    assert info.value.key == "device" and "device='cuda'" in msg and "auto or cpu" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("params,key", [
    ({"device": "tpu"}, "device"),
    ({"device": None}, "device"),
    ({"accel": {"bf16": True}}, "accel.bf16"),
    ({"accel": {"compile": "yes"}}, "accel.compile"),
    ({"accel": None}, "accel"),
])
def test_bad_device_params(params, key):
    with pytest.raises(ConfigError) as info:
        device_config(params)
    assert info.value.key == key and "\n" not in str(info.value)


def test_every_stage_refuses_cuda_before_any_compute(no_cuda):
    params = with_top(device="cuda")
    for build in (lambda: train_config(params, "fedavg"),
                  lambda: diffusion_stage_config(params, "warmup")):
        with pytest.raises(ConfigError) as info:
            build()
        assert info.value.key == "device"


@pytest.mark.parametrize("section", ["diffusion", "fid"])
def test_old_section_device_keys_are_refused_naming_the_top_level_key(section):
    params = with_top()
    params[section] = {**params[section], "device": "cpu"}
    with pytest.raises(ConfigError) as info:
        diffusion_stage_config(params, "warmup")
    assert info.value.key == f"{section}.device" and "top-level `device`" in str(info.value)


def test_stages_record_the_device_they_use(no_cuda):
    cfg = train_config(with_top(device="auto"), "fedavg")
    assert cfg.device.resolved == "cpu" and cfg.params_read["device"] == "cpu"
    assert cfg.params_read["accel"] == PARAMS["accel"]
    d = diffusion_stage_config(with_top(), "generate")
    assert d.params_read["device"] == "cpu" and d.device.torch == torch.device("cpu")


# -- the CPU path is the one of before ----------------------------------------------------------
def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 3))


def test_classification_cpu_path_is_bit_identical_to_the_old_loop():
    """local_train through ClassificationTask (autocast and compile asked for: CUDA-only) against
    the loop as written before the device setting: CPU randperm, model(x), unfused SGD."""
    g = torch.Generator().manual_seed(1)
    data = ClientData(torch.rand(20, 1, 4, 4, generator=g), torch.randint(0, 3, (20,), generator=g))
    cfg = LocalTrainConfig(epochs=2, batch_size=8, optimizer="sgd", lr=0.1, momentum=0.9)
    new = _mlp()
    local_train(new, data, ClassificationTask(bf16_autocast=True, compile=True), cfg, 0,
                torch_generator(0, "client-update", 0, 3))
    old = _mlp()
    gen = torch_generator(0, "client-update", 0, 3)
    opt = torch.optim.SGD(old.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        order = torch.randperm(20, generator=gen)
        for s in range(0, 20, 8):
            idx = order[s:s + 8]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(old(data.x[idx]), data.y[idx]).backward()
            opt.step()
    assert_identical(new.state_dict(), old.state_dict())


def _unet() -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build_unet("digits_small", (1, 8, 8))


def test_diffusion_cpu_path_is_bit_identical_to_the_old_loop():
    """Three Adam steps of the DDPM loss: t and eps drawn from the caller's CPU generator in that
    order, as before (no derived generator, no autocast, no fused Adam on the CPU)."""
    task = DiffusionTask(num_train_timesteps=50, bf16_autocast=True, compile=True)
    g = torch.Generator().manual_seed(2)
    data = ClientData(torch.rand(12, 1, 8, 8, generator=g), torch.zeros(12, dtype=torch.long))
    cfg = LocalTrainConfig(epochs=1, batch_size=4, optimizer="adam", lr=1e-3)
    new = _unet()
    local_train(new, data, task, cfg, 0, torch_generator(0, "warmup", 1))
    old = _unet()
    gen = torch_generator(0, "warmup", 1)
    opt = torch.optim.Adam(old.parameters(), lr=1e-3)
    order = torch.randperm(12, generator=gen)
    for s in range(0, 12, 4):
        x0 = data.x[order[s:s + 4]] * 2 - 1
        t = torch.randint(0, 50, (4,), generator=gen)
        eps = torch.randn(x0.shape, generator=gen)
        opt.zero_grad(set_to_none=True)
        F.mse_loss(old(task.scheduler.add_noise(x0, eps, t), t, None), eps).backward()
        opt.step()
    assert_identical(new.state_dict(), old.state_dict())


def test_cpu_data_and_state_stay_where_they_are():
    data = ClientData(torch.rand(3, 1, 2, 2), torch.zeros(3, dtype=torch.long))
    assert data.to("cpu") is data
    groups = {"c": {"w": torch.ones(2)}}
    assert groups_to(groups, torch.device("cpu")) is groups and groups_to(groups, None) is groups


# -- device noise streams -----------------------------------------------------------------------
def test_generator_on_its_own_device_is_the_generator_itself():
    gen = torch_generator(0, "x")
    assert dev.generator_on(gen, "cpu") is gen


def test_derived_generator_is_seeded_from_the_stream_and_continues():
    gen = torch_generator(0, "client-update", 2, 5)
    before = gen.get_state()
    d = dev.derived_generator(gen, "cpu")
    assert torch.equal(gen.get_state(), before)  # the caller's stream is not consumed
    ref = torch.Generator().manual_seed(torch_seed(gen.initial_seed(), "device-stream"))
    assert torch.equal(torch.randn(5, generator=d), torch.randn(5, generator=ref))
    assert dev.derived_generator(gen, "cpu") is d  # one per stream: later draws continue it
    again = dev.derived_generator(torch_generator(0, "client-update", 2, 5), "cpu")
    assert not torch.equal(torch.randn(5, generator=d), torch.randn(5, generator=again))


class NoWeakrefGenerator:
    """A generator as torch before 2.15 has it: no weak reference can be made to it (the fault of
    the first CUDA run: ``derived_generator`` kept its cache in a ``WeakKeyDictionary``)."""

    __slots__ = ("gen",)

    def __init__(self, gen: torch.Generator):
        self.gen = gen

    def initial_seed(self) -> int:
        return self.gen.initial_seed()


def test_derived_generator_where_generators_take_no_weak_reference():
    import weakref

    gen = NoWeakrefGenerator(torch_generator(0, "client-update", 2, 5))
    with pytest.raises(TypeError):
        weakref.ref(gen)
    d = dev.derived_generator(gen, "cpu")
    ref = torch.Generator().manual_seed(torch_seed(gen.initial_seed(), "device-stream"))
    assert torch.equal(torch.randn(5, generator=d), torch.randn(5, generator=ref))
    assert dev.derived_generator(gen, "cpu") is d  # later draws continue the stream
    other = NoWeakrefGenerator(torch_generator(0, "client-update", 2, 5))
    assert dev.derived_generator(other, "cpu") is not d  # a new generator: a new device stream


@pytest.fixture
def elsewhere(monkeypatch):
    """Every generator counts as on another device: the CUDA code path, run on the CPU."""
    calls = []

    def generator_on(gen, device):
        calls.append(torch.device(device))
        return dev.derived_generator(gen, device)

    for module in ("fedpipe.tasks.diffusion", "fedpipe.data.skew"):
        monkeypatch.setattr(f"{module}.generator_on", generator_on)
    return calls


def test_diffusion_noise_is_drawn_from_the_device_generator(elsewhere):
    task = DiffusionTask(num_train_timesteps=50)
    x = torch.rand(6, 1, 8, 8) * 2 - 1
    gen = torch_generator(0, "warmup", 0)
    before = gen.get_state()
    t, eps = task._noise(x, gen)
    assert elsewhere == [x.device] and torch.equal(gen.get_state(), before)
    ref = torch.Generator().manual_seed(torch_seed(gen.initial_seed(), "device-stream"))
    assert torch.equal(t, torch.randint(0, 50, (6,), generator=ref))
    assert torch.equal(eps, torch.randn(x.shape, generator=ref))


def test_batch_order_from_the_callers_stream_and_sampling_on_the_model_device(elsewhere):
    """An epoch's order is drawn from the caller's own (host) stream, never its device stream
    (fedpipe.data.skew.epoch_order: a CUDA randperm costs far more host time than the copy), and
    lands on the data's device; sampling noise is drawn on the model's device."""
    data = ClientData(torch.rand(5, 1, 8, 8), torch.zeros(5, dtype=torch.long))
    list(data.batches(2, torch_generator(0, "client-update", 0, 0)))
    assert elsewhere == []  # no device stream for the order
    ref = torch_generator(0, "client-update", 0, 0)
    first = next(data.batches(5, torch_generator(0, "client-update", 0, 0)))[0]
    assert torch.equal(first, data.x[torch.randperm(5, generator=ref)])
    meta = epoch_order(5, torch_generator(0, "client-update", 0, 0), torch.device("meta"))
    assert meta.device.type == "meta" and meta.shape == (5,)
    calls = len(elsewhere)
    model = _unet()
    DiffusionTask(num_train_timesteps=4).sample(model, 2, sampler="ddim", steps=2,
                                                generator=torch_generator(0, "s"))
    assert elsewhere[calls:] == [torch.device("cpu")]  # once per call, on the model's device


# -- CUDA-only switches ---------------------------------------------------------------------------
CUDA = torch.device("cuda")  # a device object only: nothing is allocated there


@pytest.mark.parametrize("opt", [torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD])
def test_fused_only_for_cuda_parameters(opt):
    on_cuda = [SimpleNamespace(device=CUDA)] * 2
    assert dev.optimizer_options(on_cuda, opt) == {"fused": True}
    assert dev.optimizer_options([nn.Parameter(torch.zeros(2))], opt) == {}
    assert dev.optimizer_options([], opt) == {}
    assert dev.optimizer_options(on_cuda, torch.optim.RMSprop) == {}


def test_cpu_optimizers_are_not_fused():
    params = list(_mlp().parameters())
    for name in ("adam", "sgd"):
        opt = make_optimizer(params, LocalTrainConfig(optimizer=name), 0.1)
        assert not opt.defaults.get("fused")


def test_autocast_only_for_cuda():
    assert dev.autocast_dtype(CUDA) is torch.bfloat16
    assert dev.autocast_dtype(CUDA, enabled=False) is None
    assert dev.autocast_dtype(torch.device("cpu")) is None
    with dev.autocast(torch.device("cpu")):
        assert not torch.is_autocast_enabled("cpu")


def test_compile_only_for_cuda_once_per_model(monkeypatch):
    made = []

    def fake_compile(model):
        made.append(model)
        return SimpleNamespace(of=model)

    monkeypatch.setattr(torch, "compile", fake_compile)
    model = _mlp()
    keys = list(model.state_dict())
    assert dev.compiled(model, torch.device("cpu"), True) is model
    assert dev.compiled(model, CUDA, False) is model
    wrapper = dev.compiled(model, CUDA, True)
    assert wrapper.of is model and dev.compiled(model, CUDA, True) is wrapper and made == [model]
    assert list(model.state_dict()) == keys  # the wrapper is no submodule
