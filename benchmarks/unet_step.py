"""One DDPM train step of a UNet (``--size``: the paper's MNIST UNet, or a study's diffusion track):
through the task, as the pipeline runs it, against the same step written lean, and compiled; the
sampler's forward eager and compiled; the step's FLOP against a plain matmul's rate; on the device
present (``--device auto``: CUDA when available).

Sizes (``--size``):

- ``paper`` (default): the paper's MNIST UNet ``mnist_paper`` (11.8 M parameters) on 1x28x28, Adam
  lr 2e-4, T = 500, batch ``--batch`` (default 4; the paper's: 128), the sampler's batch 256 on CUDA
  and the train batch on the CPU (a forward of this net at 256 takes 10-30 s there);
- ``smoke``, ``mnist5k``: the diffusion track of ``conf/study/fedddpm_smoke.yaml`` and
  ``conf/study/fedddpm_mnist5k.yaml``, read from the study's params as ``dvc exp run -S
  study=<study>`` composes them (:func:`fedpipe.estimate.compose`, on a copy of ``conf/``): the UNet
  preset and ``diffusion.unet_kwargs``, the image shape of ``dataset``, T and betas, the batch size,
  optimizer and lr of ``diffusion_fl.local``, the sampler's batch ``fid.batch_size``.

Arms (random images in [0, 1]), timed interleaved so that machine noise hits them all:

- ``before`` (``--size paper`` only): the step as the task ran it before the ``device`` setting: the
  batch on the CPU and moved per step, t and eps drawn on the CPU and copied over, unfused Adam (bf16
  autocast on CUDA);
- ``task``: ``DiffusionTask.loss`` as the pipeline runs it now: data on the device, t and eps drawn
  there (``fedpipe.device.generator_on``), Adam from ``fedpipe.fl.local.make_optimizer`` (fused on
  CUDA), bf16 autocast on CUDA;
- ``lean``: the step written out by hand: noise on the device from a device generator, fused Adam on
  CUDA, bf16 autocast on CUDA, no task or scheduler call;
- ``compiled``: ``lean`` through ``torch.compile`` (on by default on CUDA; ``--compile`` on the CPU);
- ``task_comp`` (CUDA only: ``accel.compile`` compiles nothing on the CPU): ``task`` with
  ``DiffusionTask(compile=True)``, beside ``compiled``;
- ``sample`` / ``sample_comp``: the sampler's forward (``DiffusionTask.sample``'s call of the net:
  eval mode, inference mode) at the sampler's batch, eager / through ``torch.compile`` (beside
  ``compiled``);
- ``matmul``: a plain fp32 2048x2048 matmul, the device's reference rate.

The first call of each arm is timed apart (warm-up, outside the clock): for a compiled arm it is
the compile. With a compiled arm the script points ``TORCHINDUCTOR_CACHE_DIR`` at a fresh temporary
folder (cold cache), and at the end runs itself again in a second process on the same folder
(``--first-calls-only``): the compiled arms' first calls with a warm inductor cache, as a later
stage's process on the same machine pays them. The step's and the forward's GFLOP are counted by
``torch.utils.flop_counter.FlopCounterMode`` (convolutions and matmuls, forward and backward; Adam's
elementwise updates and the norms are not counted), each arm's rate is GFLOP / its median time.
``compile payback`` divides the compile's cost (first call less one step) by the time a compiled step
saves over ``lean``. Last line: ``speedup X`` = task time / lean time (how much slower the task path
is than the hand-written step; 1.0 = no overhead left).

    python benchmarks/unet_step.py [--size paper|smoke|mnist5k] [--batch N] [--sample-batch N]
        [--steps 20] [--repeats 5] [--device auto|cpu|cuda] [--compile] [--threads 1]

``--quick``: on the CPU whatever the device (no compiled arm), ``--size smoke`` unless another size is
named (the small ``digits_small`` UNet on 1x8x8), batch 2, a sampler batch of 8, one timed call per
arm, no warm-up: it checks that every CPU arm runs; its ratios mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.device import autocast, optimizer_options, resolve_device
from fedpipe.fl.local import make_optimizer
from fedpipe.models.unet import build_unet
from fedpipe.rng import torch_generator
from fedpipe.tasks.diffusion import DiffusionTask

REPO = Path(__file__).resolve().parents[1]
STUDIES = {"smoke": "fedddpm_smoke", "mnist5k": "fedddpm_mnist5k"}  # --size -> conf/study/<study>
MATMUL_N = 2048
# per size on the CPU: (timed calls per arm and repeat, repeats); CUDA: 20 and 3
CPU_STEPS = {"paper": (3, 3), "smoke": (20, 5), "mnist5k": (3, 5)}


@dataclass(frozen=True)
class Size:
    """The net, data shape and training settings one ``--size`` benchmarks."""

    name: str
    source: str
    unet: str
    shape: tuple[int, int, int]
    batch: int
    lr: float
    local: LocalTrainConfig
    task: DiffusionTask
    sample_batch: int
    unet_kwargs: dict = field(default_factory=dict)


def paper_size(batch: int | None, on_cuda: bool) -> Size:
    batch = batch or 4
    return Size("paper", "the paper's MNIST UNet", "mnist_paper", (1, 28, 28), batch, 2e-4,
                LocalTrainConfig(optimizer="adam"), DiffusionTask(num_train_timesteps=500),
                256 if on_cuda else batch)


def study_size(name: str, batch: int | None) -> Size:
    """The diffusion track of ``conf/study/<STUDIES[name]>.yaml``, composed as DVC composes it."""
    from fedpipe.config.dataset import dataset_config
    from fedpipe.config.diffusion import diffusion_config, fid_config
    from fedpipe.config.fl import fl_config
    from fedpipe.estimate import compose
    from fedpipe.pipeline.diffusion import make_task

    study = STUDIES[name]
    with tempfile.TemporaryDirectory(prefix="unet-step-") as tmp:
        params = compose(REPO, [f"study={study}"], Path(tmp) / "params.yaml")
    diff = diffusion_config(params.get("diffusion"))
    local = fl_config(params.get("diffusion_fl"), "diffusion_fl").local
    if local.optimizer != "adam":  # the lean arm writes Adam out
        sys.exit(f"--size {name}: diffusion_fl.local.optimizer is {local.optimizer!r} in study "
                 f"{study}; this benchmark's lean step is Adam's")
    if diff.conditional:
        sys.exit(f"--size {name}: study {study} trains a conditional DDPM; the arms are unconditional")
    return Size(name, f"study {study}, composed from conf/", diff.unet,
                tuple(dataset_config(params.get("dataset")).in_shape()), batch or local.batch_size,
                local.lr, local, make_task(diff), fid_config(params.get("fid")).batch_size,
                dict(diff.unet_kwargs))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_model(size: Size, device: torch.device) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build_unet(size.unet, size.shape, **size.unet_kwargs).to(device)


def before_arm(size: Size, device: torch.device, data: ClientData):
    """The old task step: CPU batch and CPU noise copied per step, unfused Adam."""
    model, task, batch = make_model(size, device), size.task, size.batch
    opt = torch.optim.Adam(model.parameters(), lr=size.lr)
    gen = torch_generator(0, "bench-before")
    x_cpu = data.x.cpu()
    T = task.num_train_timesteps

    def step() -> None:
        idx = torch.randint(0, len(x_cpu), (batch,), generator=gen)
        x0 = x_cpu[idx].to(device) * 2 - 1
        t = torch.randint(0, T, (batch,), generator=gen).to(device)
        eps = torch.randn(x0.shape, generator=gen).to(device)
        x_t = task.scheduler.add_noise(x0, eps, t)
        with autocast(device):
            pred = model(x_t, t, None)
        opt.zero_grad(set_to_none=True)
        F.mse_loss(pred.float(), eps).backward()
        opt.step()
    return step


def task_arm(size: Size, device: torch.device, data: ClientData, task: DiffusionTask | None = None):
    """DiffusionTask.loss and make_optimizer, the data on the device (the pipeline's step now)."""
    model, task = make_model(size, device), task or size.task
    opt = make_optimizer(list(model.parameters()), size.local, size.lr)
    gen = torch_generator(0, "bench-task")
    on_device = data.to(device)
    epoch = iter(())

    def step() -> None:
        nonlocal epoch
        b = next(epoch, None)
        if b is None:  # a new shuffled pass, its order drawn on the device (ClientData.batches)
            epoch = on_device.batches(size.batch, gen)
            b = next(epoch)
        opt.zero_grad(set_to_none=True)
        task.loss(model, b, gen).backward()
        opt.step()
    return step


def lean_arm(size: Size, device: torch.device, data: ClientData, compile_: bool = False):
    """Noise and batch indices from a device generator, fused Adam on CUDA, bf16 autocast on CUDA."""
    model, batch = make_model(size, device), size.batch
    net = torch.compile(model) if compile_ else model
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=size.lr, **optimizer_options(params, torch.optim.Adam))
    gen = torch.Generator(device=device).manual_seed(0)
    x_all = data.x.to(device)
    abar = size.task.scheduler.alphas_cumprod.to(device)
    T = size.task.num_train_timesteps

    def step() -> None:
        idx = torch.randint(0, len(x_all), (batch,), generator=gen, device=device)
        x0 = x_all[idx] * 2 - 1
        t = torch.randint(0, T, (batch,), generator=gen, device=device)
        eps = torch.randn(x0.shape, generator=gen, device=device)
        a = abar[t].view(-1, 1, 1, 1)
        x_t = a.sqrt() * x0 + (1 - a).sqrt() * eps
        with autocast(device):
            pred = net(x_t, t, None)
        opt.zero_grad(set_to_none=True)
        F.mse_loss(pred.float(), eps).backward()
        opt.step()
    return step


def sample_arm(size: Size, device: torch.device, compile_: bool = False):
    """The sampler's call of the net (DiffusionTask.sample): eval mode, inference mode, bf16
    autocast on CUDA, a batch of ``size.sample_batch`` noisy images at one timestep."""
    model = make_model(size, device).eval()
    net = torch.compile(model) if compile_ else model
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn((size.sample_batch, *size.shape), generator=gen, device=device)
    t = torch.full((size.sample_batch,), size.task.num_train_timesteps // 2, dtype=torch.long,
                   device=device)

    def step() -> None:
        with torch.inference_mode(), autocast(device, size.task.bf16_autocast):
            net(x, t, None)
    return step


def matmul_arm(device: torch.device):
    gen = torch.Generator(device=device).manual_seed(2)
    a, b = (torch.randn(MATMUL_N, MATMUL_N, generator=gen, device=device) for _ in range(2))

    def step() -> None:
        torch.mm(a, b)
    return step


def count_flops(step) -> float:
    """FLOP of one call of ``step`` as FlopCounterMode counts them (matmuls and convolutions)."""
    with FlopCounterMode(display=False) as counter:
        step()
    return float(counter.get_total_flops())


def timed(step, n: int, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync(device)
    return (time.perf_counter() - t0) / n


def first_call(step, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    step()
    sync(device)
    return time.perf_counter() - t0


def first_calls_warm(args: argparse.Namespace, cache: str) -> dict[str, float]:
    """This script again in a second process on the inductor cache ``cache`` (warm by now): the
    compiled arms' first calls there."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--size", args.size, "--device",
           args.device, "--threads", str(args.threads), "--batch", str(args.batch_used),
           "--sample-batch", str(args.sample_batch_used), "--first-calls-only"]
    out = subprocess.run(cmd, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache},
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"the warm-cache process exited {out.returncode}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("paper", *STUDIES), default=None,
                    help="paper: mnist_paper at --batch (default); smoke / mnist5k: the diffusion "
                         "track of conf/study/fedddpm_<size>.yaml, at its batch")
    ap.add_argument("--batch", type=int, default=None,
                    help="train batch (default: the size's; paper: 4, the paper's own is 128)")
    ap.add_argument("--sample-batch", type=int, default=None,
                    help="the sampler forward's batch (default: the study's fid.batch_size; paper: "
                         "256 on CUDA, the train batch on the CPU)")
    ap.add_argument("--steps", type=int, default=None,
                    help="timed calls per arm and repeat (default on the CPU: paper 3, smoke 20, "
                         "mnist5k 3; on CUDA 20)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="interleaved repeats, median taken (default: paper 3, smoke and mnist5k "
                         "5; on CUDA 3)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed calls per arm first, the first one timed apart (default 1 on the "
                         "CPU, 5 on CUDA)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--compile", action="store_true",
                    help="the compiled arms on the CPU too (always on CUDA)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    ap.add_argument("--first-calls-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true",
                    help="CPU, --size smoke (digits_small on 1x8x8) unless named, batch 2, 1 call")
    args = ap.parse_args(argv)
    for name in ("batch", "sample_batch", "steps", "repeats"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup is not None and args.warmup < 0:
        ap.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.threads < 0:
        ap.error(f"--threads must be >= 0, got {args.threads}")
    if args.quick:
        args.size = args.size or "smoke"
        args.batch, args.sample_batch, args.steps, args.repeats, args.warmup, args.compile = \
            2, 8, 1, 1, 0, False
        print(f"[quick] on the CPU (--device {args.device} asked; no compiled arm), --size "
              f"{args.size}, batch 2, a sampler batch of 8, 1 call per arm")
        args.device = "cpu"
    args.size = args.size or "paper"
    return args


def only_first_calls(size: Size, device: torch.device, data: ClientData) -> None:
    """The second process: the compiled arms' first calls (the inductor cache warm), as JSON."""
    out = {"compiled": first_call(lean_arm(size, device, data, compile_=True), device),
           "sample_comp": first_call(sample_arm(size, device, compile_=True), device)}
    print(json.dumps(out))


def main() -> None:
    args = parse()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device, "--device")
    on_cuda = device.type == "cuda"
    size = paper_size(args.batch, on_cuda) if args.size == "paper" else \
        study_size(args.size, args.batch)
    if args.sample_batch:
        size = Size(**{**size.__dict__, "sample_batch": args.sample_batch})
    args.batch_used, args.sample_batch_used = size.batch, size.sample_batch
    steps, repeats = (20, 3) if on_cuda else CPU_STEPS[args.size]
    args.steps, args.repeats = args.steps or steps, args.repeats or repeats
    args.warmup = args.warmup if args.warmup is not None else (5 if on_cuda else 1)
    compile_ = on_cuda or args.compile
    gen = torch.Generator().manual_seed(0)
    data = ClientData(torch.rand(512, *size.shape, generator=gen), torch.zeros(512, dtype=torch.long))
    if args.first_calls_only:
        only_first_calls(size, device, data)
        return
    cache_dir = None
    if compile_ and not args.quick:  # a cold inductor cache, shared with the second process
        cache_dir = tempfile.TemporaryDirectory(prefix="unet-step-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir.name

    n_params = sum(p.numel() for p in make_model(size, device).parameters())
    kwargs = f" with {size.unet_kwargs}" if size.unet_kwargs else ""
    name = torch.cuda.get_device_name(device) if on_cuda else \
        f"CPU, {torch.get_num_threads()} torch threads"
    print(f"--size {size.name} ({size.source}): {size.unet}{kwargs} UNet, {n_params / 1e6:.3f} M "
          f"parameters, on {'x'.join(map(str, size.shape))}; batch {size.batch}, "
          f"{size.local.optimizer} lr {size.lr:g}, T {size.task.num_train_timesteps}; sampler "
          f"batch {size.sample_batch}; on {name}")

    arms = {}
    if size.name == "paper":
        arms["before"] = before_arm(size, device, data)
    arms["task"] = task_arm(size, device, data)
    arms["lean"] = lean_arm(size, device, data)
    if compile_:
        arms["compiled"] = lean_arm(size, device, data, compile_=True)
    if on_cuda:  # the pipeline with accel.compile (which compiles on CUDA only)
        task = size.task
        arms["task_comp"] = task_arm(size, device, data, DiffusionTask(
            num_train_timesteps=task.num_train_timesteps, beta_start=task.scheduler.config.beta_start,
            beta_end=task.scheduler.config.beta_end, compile=True))
    arms["sample"] = sample_arm(size, device)
    if compile_:
        arms["sample_comp"] = sample_arm(size, device, compile_=True)
    arms["matmul"] = matmul_arm(device)

    first: dict[str, float] = {}
    for arm, step in arms.items():  # warm-up (and compile) outside the clock
        t0 = time.perf_counter()
        if args.warmup:
            first[arm] = first_call(step, device)
            for _ in range(args.warmup - 1):
                step()
        sync(device)
        print(f"  {arm:11s} warm-up {time.perf_counter() - t0:7.1f} s"
              + (f"  (first call {first[arm]:.2f} s)" if arm in first else ""))

    flops = {"step": count_flops(arms["lean"]), "sample": count_flops(arms["sample"]),
             "matmul": 2.0 * MATMUL_N ** 3}
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    for _ in range(args.repeats):
        for arm, step in arms.items():
            times[arm].append(timed(step, args.steps, device))
    med = {arm: statistics.median(v) for arm, v in times.items()}
    kind = {arm: "matmul" if arm == "matmul" else "sample" if arm.startswith("sample") else "step"
            for arm in arms}

    print(f"train step, batch {size.batch} ({flops['step'] / 1e9:.3f} GFLOP fwd+bwd), median of "
          f"{args.repeats} x {args.steps}:")
    for arm, s in med.items():
        if kind[arm] == "step":
            print(f"  {arm:11s} {s * 1e3:9.2f} ms/step  (x{med['lean'] / s:.2f} of lean's speed)  "
                  f"{flops['step'] / s / 1e9:6.1f} GFLOP/s")
    print(f"sampler forward, batch {size.sample_batch}, no grad ({flops['sample'] / 1e9:.3f} GFLOP):")
    for arm, s in med.items():
        if kind[arm] == "sample":
            print(f"  {arm:11s} {s * 1e3:9.2f} ms/call  (x{med['sample'] / s:.2f} of eager's speed)  "
                  f"{flops['sample'] / s / 1e9:6.1f} GFLOP/s")
    print(f"reference: fp32 {MATMUL_N}x{MATMUL_N} matmul {med['matmul'] * 1e3:.2f} ms, "
          f"{flops['matmul'] / med['matmul'] / 1e9:.1f} GFLOP/s; the lean step reaches "
          f"{flops['step'] / med['lean'] / flops['matmul'] * med['matmul']:.2f} of it")

    if compile_ and first:
        warm = first_calls_warm(args, cache_dir.name) if cache_dir is not None else {}
        for arm, base in (("compiled", "lean"), ("sample_comp", "sample")):
            cold = first[arm] - med[arm]  # the first call less one call's work
            saved = med[base] - med[arm]
            line = f"compile {arm}: first call {first[arm]:.1f} s cold"
            if arm in warm:
                line += f", {warm[arm]:.1f} s with a warm inductor cache (a second process)"
            if saved > 0:
                paid = [f"{cold / saved:,.0f} calls cold"]
                if arm in warm:
                    paid.append(f"{(warm[arm] - med[arm]) / saved:,.0f} warm")
                line += f"; saves {saved * 1e3:.2f} ms a call: paid back after {', '.join(paid)}"
            else:
                line += f"; saves nothing ({med[arm] * 1e3:.2f} against {med[base] * 1e3:.2f} ms " \
                        "eager): never paid back"
            print(line)
        if cache_dir is not None:
            cache_dir.cleanup()
    with contextlib.suppress(KeyError):
        print(f"task / compiled: {med['task'] / med['compiled']:.2f}")
        print(f"before / task: {med['before'] / med['task']:.2f}")
    with contextlib.suppress(KeyError):
        print(f"compiled speedup {med['task_comp'] / med['compiled']:.2f} (the task with accel.compile "
              f"against the lean compiled step; target <= 1.20)")
    print(f"speedup {med['task'] / med['lean']:.2f}")


if __name__ == "__main__":
    main()
