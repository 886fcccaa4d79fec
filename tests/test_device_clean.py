"""Every method is device-clean, proven on a CPU-only machine (docs/device.md).

This file holds the harness's own tests, the tiny runs (:func:`run_method`, :func:`run_strategy`)
and the reference numbers they are checked against; the per-method runs under the harness are
part of the method contract (tests/test_contract.py: every registered method, and every batchable
one again under the batched executor). Each registered algorithm (the classification track on a
tiny MLP, or ResNet-8 for PerAda and FedBN; the diffusion track's FedDDPM / FedDDPM+ / aux-only on
a tiny UNet) runs two rounds (three for FedPTR) under :class:`device_harness.DeviceHarness`: a
``TorchFunctionMode`` that fails the run at the fedpipe line that makes a tensor without
``device=``, or at an op that mixes devices. Here, the diffusion stages (partition, warm-up,
generation, the FID extractor, a federated round with its FID) run once under it.

Why a function mode: ``torch.set_default_device("meta")`` would also move what torch itself makes
(optimizer step counters, module init) and fail where a tensor is used, not where it was made;
``FakeTensorMode`` has no values, and a run branches on values (``.item()``, numpy, k-means). The
mode sees the exact calling frame of each factory, names fedpipe's line and only fedpipe's, and
leaves the computation untouched. What it cannot catch: a tensor put explicitly on the wrong device
(``device="cpu"`` where the run's device was meant; the lint makes such choices visible), mixed
devices (only seen with two real devices, on a GPU), ``torch.from_numpy`` and ``torch.Generator``
calls, modules built in fedpipe (their parameters are made in torch's frames), and paths the tiny
runs do not take.

**The reference numbers.** The same runs are compared with tests/fixtures/device_digests.json: per
run and per part (the final server weights, the server's other groups, the client states; each of
the track's outputs) the layout (names, dtypes and shapes, hashed: exact) and three numbers over
all the values in float64 (their sum, their L2 norm, and a sum weighted by a fixed +-0.5 sequence),
which must agree to :data:`RTOL` of the part's norm. The numbers were first sha256 digests of the
bits, recorded from the code before the device fixes (src of 37e1f45) at one torch thread: the
fixes change where tensors live, never what a CPU run computes. Bits, however, depend on more than
the code: on torch's thread count (float sums split across threads) and on the CPU (which SIMD
kernels ATen, MKL and oneDNN pick: on one CPU the bits change with ``ATEN_CPU_CAPABILITY`` or
``MKL_CBWR``), and another CPU failed every digest at one thread. The summaries are what a CPU
run computes on any CPU: measured across thread counts and kernel choices on one machine they
differ by at most 2e-5 of the norm (FedDDPM's UNet, FedPTR-S), and a real change (another seed,
a missed step, a lost state) moves them by far more than :data:`RTOL`. They were recorded at one
torch thread from code whose results on that machine are bit for bit those of src 37e1f45 for
every method that existed then, except the three recorded again on purpose: CReFF's (its
feature-matching distance aligned with the official code, docs/papers/fednh.md), PerAda's and
PerAda w/o KD's (a client's personal adapter starts from w^0 and each client keeps its own
frozen-BN statistics, docs/papers/perada.md). Methods registered since have none (the harness run
only). Record again only for a change meant to change CPU results, and say so in the commit:
``python tests/test_device_clean.py``.

Every test here runs with what its numbers depend on pinned (:func:`pinned_numerics`: one torch
thread, float32 default dtype), so the verdict is the same under ``make test``, a plain ``pytest``
of this file, or any core count.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from device_harness import PACKAGE, DeviceFault, DeviceHarness

from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.config.fl import FLConfig, LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl import run_federated
from fedpipe.fl.strategy import ServerData, batches
from fedpipe.models import build_model
from fedpipe.tasks import ClassificationTask

FIXTURE = Path(__file__).parent / "fixtures" / "device_digests.json"
SHAPE, CLASSES = (1, 8, 8), 4
DIFFUSION = ("fedddpm", "fedddpm_plus", "aux_only")
"""The methods whose tiny run is on the diffusion track (a UNet, the DDPM loss, generated server
data and a score); every other method runs on the classification track."""
DIFFUSION_SIZES = (4, 6, 5)
BATCHED = tuple(n for n in sorted(ALGORITHMS) if batches(ALGORITHMS[n]))
"""The registered methods the batched executor trains (``fedpipe.fl.strategy.batches``)."""
LOCAL = LocalTrainConfig(steps=2, batch_size=8, lr=0.05)
RTOL = 1e-4
"""How far a summary of a run may be from the recorded one, relative to the part's L2 norm."""
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


@contextlib.contextmanager
def pinned_numerics() -> Iterator[None]:
    """What a CPU run's numbers depend on besides the code, its inputs and the CPU, set for the
    block and restored after: one torch thread (float sums are split across threads, so results are
    bit-identical only at one thread count; ``make test``'s xdist workers have one, a plain pytest on
    a 2-core machine two), float32 as the default dtype and autograd on (a test that leaked either
    would change every run after it)."""
    before = torch.get_num_threads(), torch.get_default_dtype(), torch.is_grad_enabled()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        torch.set_default_dtype(before[1])
        torch.set_grad_enabled(before[2])


@pytest.fixture(autouse=True)
def pinned():
    with pinned_numerics():
        yield


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


def mlp() -> torch.nn.Module:
    return build_model("mlp", SHAPE, CLASSES, hidden=16)


def classifier_fn(cls: type, cfg, device: str = "cpu", base=None):
    """The model factory of method ``cls`` (config ``cfg``) on ``device``: ``base()`` (by default
    ResNet-8 for PerAda and FedBN, which need convolutions and BatchNorm, a tiny MLP otherwise) as
    the method adapts it, with a fixed init that leaves the global RNG as it was."""
    if base is None:
        base = (lambda: build_model("resnet8", SHAPE, CLASSES)) if (
            cls.name.startswith("perada") or cls.name == "fedbn") else mlp

    def make() -> torch.nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)
            return cls.adapt_model(base(), cfg).to(device)
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


def score(model: torch.nn.Module, n: int, gen: torch.Generator) -> float:
    """A stand-in for FedDDPM+'s FID: a number the model's weights determine."""
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def evaluator(strategy, data: list[ClientData]):
    """The engine's ``evaluate(state, personal)``: the task's scalars for the global model on the
    pooled client data (methods with a global model), and each client's own model's loss on its
    data (one per client: per-client rows)."""
    x, y = torch.cat([c.x for c in data]), torch.cat([c.y for c in data])

    def evaluate(state, personal):
        out = {}
        if strategy.has_global_model():
            res = strategy.task.evaluate(strategy.global_model(state), x, y)
            out |= {k: v for k, v in res.items() if k != "n"}
        if personal is not None:
            out["personal_loss"] = [
                strategy.task.evaluate(strategy.model_of(personal[c]), d.x, d.y)["loss"]
                if c in personal else -1.0 for c, d in enumerate(data)]
        return out
    return evaluate


def model_factory(cls: type, cfg, device: str = "cpu", base=None):
    """The model factory of method ``cls``'s tiny run: the UNet on the diffusion track, else
    :func:`classifier_fn`."""
    return unet_fn(device) if cls.name in DIFFUSION else classifier_fn(cls, cfg, device, base)


def run_strategy(cls: type, cfg, executor: str = "serial", device: str = "cpu", *,
                 rounds: int | None = None, participation: float = 1.0, seed: int = 7,
                 sizes: tuple[int, ...] = (10, 14, 9, 12), base=None, evaluate: bool = False,
                 checkpoint_every: int = 5, **engine):
    """``rounds`` rounds (default two, three for FedPTR, whose MTT starts at round index 2) of method
    ``cls`` with config ``cfg`` on four clients of ``sizes`` samples (the diffusion track: three of
    :data:`DIFFUSION_SIZES`, unlabelled), ``participation`` of them per round; model, client data
    and server data on ``device``. ``base`` replaces the classifier (:func:`classifier_fn`),
    ``evaluate`` adds the engine's evaluation every round (:func:`evaluator`); ``engine`` goes to
    ``run_federated`` (``checkpoint_dir``, ``stop_after``, ``on_round``, ...)."""
    name = cls.name
    model_fn = model_factory(cls, cfg, device, base)
    if name in DIFFUSION:
        from fedpipe.tasks.diffusion import DiffusionTask

        task = DiffusionTask(num_train_timesteps=20)
        data, labelled, score_fn = clients(sizes=DIFFUSION_SIZES, labels=False), True, score
    else:
        task, data, labelled, score_fn = ClassificationTask(), clients(sizes=sizes), False, None
    data = [c.to(device) for c in data]
    strategy = cls(task, model_fn, LOCAL, cfg, num_clients=len(data))
    strategy.client_groups = (0, 0, 1, 1)[: len(data)]
    fl = FLConfig(rounds=rounds or (3 if name.startswith("fedptr") else 2),
                  participation=participation, local=LOCAL, executor=executor,
                  checkpoint_every=checkpoint_every)
    cls.check_clients(cfg, len(data), fl.clients_per_round(len(data)))
    return run_federated(strategy, model_fn(), data, fl, seed, progress=False,
                         server_data=server_data(cls.server_data_kind(cfg), labelled, device),
                         score=score_fn, evaluate=evaluator(strategy, data) if evaluate else None,
                         **engine)


def run_method(name: str, executor: str = "serial", device: str = "cpu"):
    """The recorded run of method ``name``: two rounds (three for FedPTR), every client in every
    round, so every client state is made (tests/test_cuda.py runs the same on CUDA)."""
    return run_strategy(ALGORITHMS[name], config(name), executor, device)


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
    """sha256 over every tensor of a (nested) mapping, in sorted key order: bit-identity, on one
    machine at one thread count (test_cuda's repeats)."""
    h = hashlib.sha256()
    for path, o in named_tensors(obj):
        t = o.detach().cpu().contiguous()
        h.update(f"{path}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update((t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes())
    return h.hexdigest()


def result_parts(result) -> dict:
    return {"weights": result.state.weights, "extra": result.state.extra,
            "clients": {str(k): v for k, v in result.client_states.items()}}


def result_digests(result) -> dict[str, str]:
    return {part: digest(obj) for part, obj in result_parts(result).items()}


def summary(obj) -> dict:
    """The layout of every tensor of ``obj`` (names, dtypes, shapes; hashed) and three numbers over
    all its values in float64, in :func:`named_tensors` order: their sum, L2 norm, and the sum of
    value i times a fixed sequence in [-0.5, 0.5) (Knuth's multiplicative hash of i: integer
    arithmetic, the same on every machine), which a permutation or a sign change moves."""
    layout, values = hashlib.sha256(), []
    for path, o in named_tensors(obj):
        t = o.detach().cpu()
        layout.update(f"{path}:{t.dtype}:{tuple(t.shape)};".encode())
        values.append(t.reshape(-1).double())
    v = torch.cat(values) if values else torch.zeros(0, dtype=torch.float64)
    i = torch.arange(v.numel(), dtype=torch.int64)
    mix = ((i * 2654435761) % 4294967296).double() / 4294967296 - 0.5
    return {"layout": layout.hexdigest(), "sum": float(v.sum()), "norm": float(v.norm()),
            "mixed": float((v * mix).sum())}


def result_summaries(result) -> dict[str, dict]:
    return {part: summary(obj) for part, obj in result_parts(result).items()}


def assert_summaries_match(got: dict, expected: dict, what: str) -> None:
    """``got`` agrees with the recorded ``expected``: the same layout, and each number within
    :data:`RTOL` of the recorded norm (FID values: of the value)."""
    assert got.keys() == expected.keys(), what
    for part, exp in expected.items():
        have = got[part]
        if not isinstance(exp, dict):  # a scalar (the track's FID)
            assert abs(have - exp) <= RTOL * abs(exp), f"{what} {part}: {have} != {exp}"
            continue
        assert have["layout"] == exp["layout"], f"{what} {part}: other tensors, dtypes or shapes"
        bound = RTOL * exp["norm"] + 1e-12
        for k in ("sum", "norm", "mixed"):
            assert abs(have[k] - exp[k]) <= bound, (
                f"{what} {part}: {k} {have[k]!r} != recorded {exp[k]!r} (within {bound:.3g})")


def expected(kind: str, name: str | None = None):
    """The recorded summaries of ``kind`` (``methods``: of method ``name``, None if it has none;
    ``track``)."""
    data = json.loads(FIXTURE.read_text())[kind]
    return data if name is None else data.get(name)


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
    cls = ALGORITHMS["fedrod"]
    for head in ("hypernetwork", "linear"):
        cfg = algorithm_config("fedrod", {"personal_head": head})
        strategy = cls(ClassificationTask(), classifier_fn(cls, cfg, "meta"), LOCAL, cfg,
                       num_clients=4)
        ph = strategy.personal_head()
        assert {t.device.type for t in ph.state_dict(keep_vars=True).values()} == {"meta"}, head
        assert ph.pi.device.type == "meta"
    assert config("fedrod").personal_head == "hypernetwork"


# -- the reference numbers ------------------------------------------------------------------------
def test_a_summary_sees_a_change_the_tolerance_hides_not():
    """The summary of a part moves with any change beyond rounding: a value changed by 1e-3 of the
    norm, two values swapped, a dtype, a name; and not with a change at the rounding level."""
    g = torch.Generator().manual_seed(0)
    w = {"a": torch.randn(50, generator=g), "b": torch.randn(3, 4, generator=g)}
    ref = {"w": summary(w)}

    def check(other) -> None:
        assert_summaries_match({"w": summary(other)}, ref, "w")

    check({k: v * (1 + 1e-7) for k, v in w.items()})  # rounding
    bumped = {**w, "a": w["a"].clone()}
    bumped["a"][7] += 1e-3 * float(summary(w)["norm"])
    swapped = {**w, "a": w["a"][[1, 0, *range(2, 50)]]}
    for changed in (bumped, swapped, {**w, "b": w["b"].double()}, {"a": w["a"], "c": w["b"]}):
        with pytest.raises(AssertionError):
            check(changed)


def track_outputs(root: Path, device: str = "cpu") -> dict:
    """The diffusion track's stages on the digits data (test_federate_ddpm's tiny settings, one
    federated round): partition, warm-up, generation, FID extractor, FedDDPM with its FID score,
    with the ``device`` setting. Returns what each wrote ({part: tensors}) and the FID."""
    from test_diffusion_stages import tiny_params

    from fedpipe.io import load_tensors
    from fedpipe.pipeline.diffusion import client_path, diffusion_stage_config
    from fedpipe.pipeline.feature_extractor import feature_extractor
    from fedpipe.pipeline.federate_ddpm import ddpm_train_config, federate_ddpm
    from fedpipe.pipeline.generate import generate
    from fedpipe.pipeline.outputs import run_dir
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
    return {"warmup": load_tensors(client_path(root / "warmup" / "models", 0)),
            "aux": load_tensors(root / "gen" / "aux.safetensors"),
            "fid": {p.name: load_tensors(p) for p in sorted((root / "fid").glob("*.safetensors"))},
            "fedddpm": load_tensors(run_dir(root / "fed", "fedddpm", 0) / "model.safetensors"),
            "fedddpm_fid": float(out.final["fid"])}


def run_track(root: Path, device: str = "cpu") -> dict[str, str]:
    """:func:`track_outputs`, each part's sha256 digest and the FID's repr (test_cuda's repeats)."""
    outputs = track_outputs(root, device)
    return {k: repr(v) if k == "fedddpm_fid" else digest(v) for k, v in outputs.items()}


def track_summaries(outputs: dict) -> dict:
    return {k: v if k == "fedddpm_fid" else summary(v) for k, v in outputs.items()}


def test_diffusion_track_stages_are_device_clean(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDPIPE_WORKERS", "1")  # in this process: workers would escape the harness
    with DeviceHarness():
        outputs = track_outputs(tmp_path)
    assert_summaries_match(track_summaries(outputs), expected("track"), "diffusion track")


def record(root: Path) -> dict:
    """The fixture's contents: every run's summaries, from the code as it is (``python
    tests/test_device_clean.py``; methods registered after the device fixes are left out)."""
    with pinned_numerics():
        old = json.loads(FIXTURE.read_text())["methods"] if FIXTURE.is_file() else ALGORITHMS
        return {"methods": {name: result_summaries(run_method(name)) for name in sorted(old)},
                "track": track_summaries(track_outputs(root))}


if __name__ == "__main__":
    import tempfile

    os.environ["FEDPIPE_WORKERS"] = "1"  # as under pytest (tests/conftest.py)
    FIXTURE.parent.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        FIXTURE.write_text(json.dumps(record(Path(tmp)), indent=1, sort_keys=True) + "\n")
