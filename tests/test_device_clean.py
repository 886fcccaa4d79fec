"""Every method is device-clean, proven on a CPU-only machine (docs/device.md).

Each registered algorithm (``fedpipe.algorithms.ALGORITHMS``: the classification track on a tiny
MLP, or ResNet-8 for PerAda and FedBN; the diffusion track's FedDDPM / FedDDPM+ / aux-only on a
tiny UNet) runs two rounds (three for FedPTR), and the diffusion stages (partition, warm-up,
generation, the FID extractor, a federated round with its FID) and the batched executor run once, under
:class:`device_harness.DeviceHarness`: a ``TorchFunctionMode`` that fails the run at the fedpipe
line that makes a tensor without ``device=``, or at an op that mixes devices.

Why a function mode: ``torch.set_default_device("meta")`` would also move what torch itself makes
(optimizer step counters, module init) and fail where a tensor is used, not where it was made;
``FakeTensorMode`` has no values, and a run branches on values (``.item()``, numpy, k-means). The
mode sees the exact calling frame of each factory, names fedpipe's line and only fedpipe's, and
leaves the computation untouched. What it cannot catch: a tensor put explicitly on the wrong device
(``device="cpu"`` where the run's device was meant; the lint makes such choices visible), mixed
devices (only seen with two real devices, on a GPU), ``torch.from_numpy`` and ``torch.Generator``
calls, modules built in fedpipe (their parameters are made in torch's frames), and paths the tiny
runs do not take.

The same runs are hashed (sha256 of every tensor of the final server state, the client states, and
the stages' outputs) and compared with tests/fixtures/device_digests.json, recorded from the code
before the device fixes: the fixes change where tensors live, never what a CPU run computes. One
digest was recorded again since, after changes meant to alter the numbers: CReFF's, when its
feature-matching distance was aligned with the official code (docs/papers/fednh.md); PerAda's and
PerAda w/o KD's, when a client's personal adapter started from w^0 and each client kept its own
frozen-BN statistics, as the official code does (docs/papers/perada.md).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from device_harness import PACKAGE, DeviceFault, DeviceHarness

from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.config.fl import FLConfig, LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl import run_federated
from fedpipe.fl.strategy import ServerData
from fedpipe.models import build_model
from fedpipe.tasks import ClassificationTask

FIXTURE = Path(__file__).parent / "fixtures" / "device_digests.json"
SHAPE, CLASSES = (1, 8, 8), 4
DIFFUSION = ("fedddpm", "fedddpm_plus", "aux_only")
LOCAL = LocalTrainConfig(steps=2, batch_size=8, lr=0.05)
# small settings of the methods whose server or client steps are long at the paper's values
SMALL = {
    "creff": {"num_features": 4, "feature_epochs": 2, "retrain_epochs": 2, "batch_real": 8},
    "fedptr": {"ipc": 1, "mtt_iterations": 2, "syn_steps": 2, "proj_steps": 2},
    "fedptr_s": {"ipc": 1, "mtt_iterations": 2, "syn_steps": 2, "proj_steps": 2},
    "fedptr_s_once": {"ipc": 1, "mtt_iterations": 2, "syn_steps": 2, "proj_steps": 2},
    "fedptr_fixed": {"ipc": 1, "mtt_iterations": 2, "syn_steps": 2, "proj_steps": 2},
    "feddf": {"kd_steps": 2, "kd_batch_size": 8},
    "perada": {"kd_steps": 2, "kd_batch_size": 8},
    "fedbabu": {"ft_epochs": 1},
    "equitable_fl": {"kmeans_n_init": 1},
    "fedddpm": {"server_batch_size": 8},
    "fedddpm_plus": {"server_batch_size": 8, "test_every": 1, "test_size": 4, "threshold": 1e9,
                     "correction_epochs": 1},
}
CLASSIFIERS = sorted(n for n in ALGORITHMS if n not in DIFFUSION)


def config(name: str):
    return algorithm_config(name, SMALL.get(name, {}))


def clients(shape=SHAPE, sizes=(10, 14, 9, 12), labels: bool = True) -> list[ClientData]:
    g = torch.Generator().manual_seed(0)
    out = []
    for k, n in enumerate(sizes):
        y = torch.randint(0, CLASSES, (n,), generator=g) if labels else torch.zeros(n, dtype=torch.long)
        if labels:
            y[: n // 2] = k % CLASSES  # label skew: every client has a majority class
        out.append(ClientData(torch.rand(n, *shape, generator=g), y))
    return out


def classifier_fn(name: str, device: str = "cpu"):
    cfg = config(name)

    def make() -> torch.nn.Module:
        with torch.random.fork_rng(devices=[]):  # a fixed init, the global RNG left as it was
            torch.manual_seed(1)
            if name.startswith("perada") or name == "fedbn":
                base = build_model("resnet8", SHAPE, CLASSES)
            else:
                base = build_model("mlp", SHAPE, CLASSES, hidden=16)
            return ALGORITHMS[name].adapt_model(base, cfg).to(device)
    return make


def unet_fn(device: str = "cpu"):
    from fedpipe.models.unet import build_unet

    def make() -> torch.nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return build_unet("digits_small", SHAPE).to(device)
    return make


def server_data(kind: str, labelled: bool, device: str = "cpu") -> ServerData | None:
    if kind == "none":
        return None
    g = torch.Generator().manual_seed(3)
    x = torch.rand(8, *SHAPE, generator=g)
    y = torch.zeros(8, dtype=torch.long) if labelled else torch.full((8,), -1, dtype=torch.long)
    return ServerData(kind, ClientData(x, y).to(device), labelled, "test")


def run_method(name: str, executor: str = "serial", device: str = "cpu"):
    """Two rounds of ``name`` (three for FedPTR, whose MTT starts at round index 2), every client
    in every round, so every client state is made; model, client data and server data on
    ``device`` (tests/test_cuda.py runs the same on CUDA)."""
    cfg = config(name)
    if name in DIFFUSION:
        from fedpipe.tasks.diffusion import DiffusionTask

        task, model_fn = DiffusionTask(num_train_timesteps=20), unet_fn(device)
        data, labelled = clients(sizes=(4, 6, 5), labels=False), True
        score = lambda m, n, gen: float(sum(p.detach().double().sum() for p in m.parameters()))  # noqa: E731
    else:
        task, model_fn, data, labelled, score = ClassificationTask(), classifier_fn(name, device), \
            clients(), False, None
    data = [c.to(device) for c in data]
    strategy = ALGORITHMS[name](task, model_fn, LOCAL, cfg, num_clients=len(data))
    strategy.client_groups = (0, 0, 1, 1)[: len(data)]
    fl = FLConfig(rounds=3 if name.startswith("fedptr") else 2, participation=1.0, local=LOCAL,
                  executor=executor)
    return run_federated(strategy, model_fn(), data, fl, 7, progress=False,
                         server_data=server_data(ALGORITHMS[name].server_data_kind(cfg), labelled,
                                                 device),
                         score=score)


def named_tensors(obj, prefix: str = ""):
    """``(path, tensor)`` for every tensor of a (nested) mapping or sequence, mappings in sorted
    key order (``/k/0``: key ``k``, item 0)."""
    if isinstance(obj, dict):
        for k in sorted(obj, key=str):
            yield from named_tensors(obj[k], f"{prefix}/{k}")
    elif isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from named_tensors(v, f"{prefix}/{i}")


def digest(obj) -> str:
    """sha256 over every tensor of a (nested) mapping, in sorted key order."""
    h = hashlib.sha256()
    for path, o in named_tensors(obj):
        t = o.detach().cpu().contiguous()
        h.update(f"{path}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update((t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes())
    return h.hexdigest()


def result_digests(result) -> dict[str, str]:
    return {"weights": digest(result.state.weights), "extra": digest(result.state.extra),
            "clients": digest({str(k): v for k, v in result.client_states.items()})}


# -- the harness itself ---------------------------------------------------------------------------
def in_fedpipe(code: str, **names):
    """Run ``code`` as if it were a line of fedpipe's own module fl/engine.py."""
    exec(compile(code, str(Path(PACKAGE) / "fl" / "engine.py"), "exec"), {"torch": torch, **names})


def test_harness_names_the_line_of_a_factory_without_device():
    with DeviceHarness() as h:
        in_fedpipe("torch.zeros(2, device='cpu')")
        in_fedpipe("torch.zeros_like(x)", x=torch.ones(2))  # not a factory: the device of x
        with pytest.raises(DeviceFault, match=r"fedpipe/fl/engine\.py:2: torch\.randn"):
            in_fedpipe("x = 1\ntorch.randn(3, device=None)")
        torch.randn(3)  # the test's own code is not checked
    assert [s.endswith("fedpipe/fl/engine.py:1") for s in h.sites] == [True]


def test_harness_refuses_an_op_that_mixes_devices():
    cpu = torch.ones(2)
    with DeviceHarness(), pytest.raises(DeviceFault, match=r"fedpipe/fl/engine\.py:1: add mixes"):
        in_fedpipe("torch.add(cpu, torch.ones(2, device='meta'))", cpu=cpu)
    with DeviceHarness():
        in_fedpipe("torch.add(torch.ones(2, device='meta'), torch.tensor(1.0, device='cpu'))")  # 0-dim


def test_harness_lets_data_move_between_devices():
    """Moving a model or a tensor to another device takes one tensor on each side: not a fault
    (the first CUDA run failed every ``model.to("cuda")`` in torch's ``Module._apply``)."""
    with DeviceHarness():
        in_fedpipe("model.to('meta')", model=torch.nn.Linear(2, 2))
        in_fedpipe("torch.empty(2, device='meta').copy_(torch.ones(2, device='cpu'))")
        in_fedpipe("torch.ones(2, device='cpu').to('meta')")


def test_modules_a_method_builds_live_where_its_model_lives():
    """Modules that a method builds beside the model (FedRoD's personal head and hypernetwork)
    go where the model is: the first CUDA run found FedRoD's hypernetwork left on the CPU (the
    harness cannot see module init, which runs in torch's frames). The meta device stands in
    for the GPU."""
    cfg = config("fedrod")
    for head in ("hypernetwork", "linear"):
        strategy = ALGORITHMS["fedrod"](ClassificationTask(), classifier_fn("fedrod", "meta"), LOCAL,
                                        algorithm_config("fedrod", {"personal_head": head}),
                                        num_clients=4)
        ph = strategy.personal_head()
        assert {t.device.type for t in ph.state_dict(keep_vars=True).values()} == {"meta"}, head
        assert ph.pi.device.type == "meta"
    assert cfg.personal_head == "hypernetwork"


# -- the harness runs ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_method_is_device_clean_and_cpu_results_unchanged(name):
    with DeviceHarness():
        result = run_method(name)
    assert result.rounds_done >= 1
    expected = json.loads(FIXTURE.read_text())["methods"].get(name)
    if expected is not None:  # a method registered after the fixture: the harness run only
        assert result_digests(result) == expected


BATCHED = ("fedavg", "fedprox", "scaffold")


@pytest.mark.parametrize("name", BATCHED)
def test_batched_executor_is_device_clean(name):
    with DeviceHarness():
        result = run_method(name, "batched")
    assert result_digests(result) == json.loads(FIXTURE.read_text())["batched"][name]


def run_track(root: Path, device: str = "cpu") -> dict[str, str]:
    """The diffusion track's stages on the digits data (test_federate_ddpm's tiny settings, one
    federated round): partition, warm-up, generation, FID extractor, FedDDPM with its FID score,
    with the ``device`` setting. Returns the digests of what each wrote."""
    from test_diffusion_stages import tiny_params

    from fedpipe.io import load_tensors
    from fedpipe.pipeline.diffusion import client_path, diffusion_stage_config
    from fedpipe.pipeline.feature_extractor import feature_extractor
    from fedpipe.pipeline.federate_ddpm import ddpm_train_config, federate_ddpm, run_dir
    from fedpipe.pipeline.generate import generate
    from fedpipe.pipeline.partition import partition_and_write, partition_stage_config
    from fedpipe.pipeline.warmup import warmup

    params = tiny_params(
        partition={"scheme": "iid", "num_clients": 2}, generate={"ratio": 0.05, "sampler": "ddpm"},
        warmup={"epochs": 1, "batch_size": 64}, fid={"classifier_epochs": 1, "num_samples": 20,
                                                     "curve_samples": 20},
        diffusion_fl={"rounds": 1, "participation": 1.0, "eval_every": 1, "checkpoint_every": 1,
                      "local": {"steps": 2, "batch_size": 32, "optimizer": "adam", "lr": 1e-3}})
    params["algorithms"]["fedddpm"] = {**params["algorithms"]["fedddpm"], "server_batch_size": 16}
    params["device"] = device
    partition_and_write(partition_stage_config(params), root / "partition")
    part = root / "partition" / "partition.safetensors"
    cfg = diffusion_stage_config(params, "aux_quality")
    warmup(cfg, root / "warmup", part, progress=False)
    generate(cfg, root / "gen", root / "warmup", part, progress=False)
    feature_extractor(cfg, root / "fid", progress=False)
    out = federate_ddpm(ddpm_train_config(params, "fedddpm", 0), root / "fed", part,
                  root / "gen" / "aux.safetensors", root / "fid", progress=False)
    read = lambda p: load_tensors(p)  # noqa: E731
    return {"warmup": digest(read(client_path(root / "warmup" / "models", 0))),
            "aux": digest(read(root / "gen" / "aux.safetensors")),
            "fid": digest({p.name: read(p) for p in sorted((root / "fid").glob("*.safetensors"))}),
            "fedddpm": digest(read(run_dir(root / "fed", "fedddpm", 0) / "model.safetensors")),
            "fedddpm_fid": repr(out["final"]["fid"])}


def test_diffusion_track_stages_are_device_clean(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDPIPE_WORKERS", "1")  # in this process: workers would escape the harness
    with DeviceHarness():
        digests = run_track(tmp_path)
    assert digests == json.loads(FIXTURE.read_text())["track"]


def record(root: Path) -> dict:
    """The fixture's contents: every run's digests, from the code as it is (run once, on the code
    before the device fixes: ``python tests/test_device_clean.py``)."""
    return {"methods": {name: result_digests(run_method(name)) for name in sorted(ALGORITHMS)},
            "batched": {name: result_digests(run_method(name, "batched")) for name in BATCHED},
            "track": run_track(root)}


if __name__ == "__main__":
    import tempfile

    os.environ["FEDPIPE_WORKERS"] = "1"  # as under pytest (tests/conftest.py)
    FIXTURE.parent.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        FIXTURE.write_text(json.dumps(record(Path(tmp)), indent=1, sort_keys=True) + "\n")
