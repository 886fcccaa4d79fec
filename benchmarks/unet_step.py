"""One DDPM train step of the paper's MNIST UNet (``mnist_paper``, 11.8 M parameters): through the
task, as the pipeline runs it, against the same step written lean, and compiled; on the device
present (``--device auto``: CUDA when available).

Arms (Adam, lr 2e-4, random images in [0, 1], T = 500), timed interleaved so that machine noise hits
them all:

- ``before``: the step as the task ran it before the ``device`` setting: the batch on the CPU and
  moved per step, t and eps drawn on the CPU and copied over, unfused Adam (bf16 autocast on CUDA);
- ``task``: ``DiffusionTask.loss`` as the pipeline runs it now: data on the device, t and eps drawn
  there (``fedpipe.device.generator_on``), Adam from ``fedpipe.fl.local.make_optimizer`` (fused on
  CUDA), bf16 autocast on CUDA;
- ``lean``: the step written out by hand: noise on the device from a device generator, fused Adam on
  CUDA, bf16 autocast on CUDA, no task or scheduler call;
- ``compiled``: ``lean`` through ``torch.compile`` (on by default on CUDA; ``--compile`` on the CPU,
  where inductor's compile of this net takes minutes);
- ``task_comp``: ``task`` with ``accel.compile`` (``DiffusionTask(compile=True)``), beside
  ``compiled``.

The default batch is tiny (4) so that the CPU run ends in under a minute; ``--batch 128`` is the
paper's. Last line: ``speedup X`` = task time / lean time (how much slower the task path is than the
hand-written step; 1.0 = no overhead left).

    python benchmarks/unet_step.py [--batch 128] [--steps 20] [--device auto|cpu|cuda] [--compile]

``--quick``: on the CPU whatever the device (the CUDA-only arms, ``compiled`` and ``task_comp``, are
skipped), the small ``digits_small`` UNet on 1x8x8 images instead of ``mnist_paper``, batch 2, one
timed step per arm, no warm-up: it checks that every CPU arm runs; its ratios mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
import torch.nn.functional as F

from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.device import autocast, optimizer_options, resolve_device
from fedpipe.fl.local import make_optimizer
from fedpipe.models.unet import build_unet
from fedpipe.rng import torch_generator
from fedpipe.tasks.diffusion import DiffusionTask

T = 500
LR = 2e-4


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


UNET, SHAPE = "mnist_paper", (1, 28, 28)  # --quick: digits_small on 1x8x8


def make_model(device: torch.device) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build_unet(UNET, SHAPE).to(device)


def before_arm(device: torch.device, data: ClientData, batch: int, task: DiffusionTask):
    """The old task step: CPU batch and CPU noise copied per step, unfused Adam."""
    model = make_model(device)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    gen = torch_generator(0, "bench-before")
    x_cpu = data.x.cpu()

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


def task_arm(device: torch.device, data: ClientData, batch: int, task: DiffusionTask):
    """DiffusionTask.loss and make_optimizer, the data on the device (the pipeline's step now)."""
    model = make_model(device)
    opt = make_optimizer(list(model.parameters()), LocalTrainConfig(optimizer="adam"), LR)
    gen = torch_generator(0, "bench-task")
    on_device = data.to(device)
    epoch = iter(())

    def step() -> None:
        nonlocal epoch
        b = next(epoch, None)
        if b is None:  # a new shuffled pass, its order drawn on the device (ClientData.batches)
            epoch = on_device.batches(batch, gen)
            b = next(epoch)
        opt.zero_grad(set_to_none=True)
        task.loss(model, b, gen).backward()
        opt.step()
    return step


def lean_arm(device: torch.device, data: ClientData, batch: int, task: DiffusionTask,
             compile_: bool = False):
    """Noise and batch indices from a device generator, fused Adam on CUDA, bf16 autocast on CUDA."""
    model = make_model(device)
    net = torch.compile(model) if compile_ else model
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=LR, **optimizer_options(params, torch.optim.Adam))
    gen = torch.Generator(device=device).manual_seed(0)
    x_all = data.x.to(device)
    abar = task.scheduler.alphas_cumprod.to(device)

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


def timed(step, n: int, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync(device)
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4, help="batch size (the paper's: 128)")
    ap.add_argument("--steps", type=int, default=None,
                    help="timed steps per arm and repeat (default 3 on the CPU, 20 on CUDA)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats (median taken)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed steps per arm first (default 1 on the CPU, 5 on CUDA)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--compile", action="store_true", help="the compiled arm on the CPU too")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    ap.add_argument("--quick", action="store_true",
                    help="CPU, digits_small UNet on 1x8x8, batch 2, 1 step, no warm-up")
    args = ap.parse_args()
    if args.quick:
        global UNET, SHAPE
        UNET, SHAPE = "digits_small", (1, 8, 8)
        args.batch, args.steps, args.repeats, args.warmup, args.compile = 2, 1, 1, 0, False
        print(f"[quick] on the CPU (--device {args.device} asked; the CUDA-only arms compiled and "
              "task_comp skipped), digits_small UNet on 1x8x8, batch 2, 1 step")
        args.device = "cpu"
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device, "--device")
    on_cuda = device.type == "cuda"
    args.steps = args.steps or (20 if on_cuda else 3)
    args.warmup = args.warmup if args.warmup is not None else (5 if on_cuda else 1)
    task = DiffusionTask(num_train_timesteps=T)
    gen = torch.Generator().manual_seed(0)
    data = ClientData(torch.rand(512, *SHAPE, generator=gen), torch.zeros(512, dtype=torch.long))
    arms = {"before": before_arm(device, data, args.batch, task),
            "task": task_arm(device, data, args.batch, task),
            "lean": lean_arm(device, data, args.batch, task)}
    if device.type == "cuda" or args.compile:
        arms["compiled"] = lean_arm(device, data, args.batch, task, compile_=True)
        arms["task_comp"] = task_arm(device, data, args.batch,  # the pipeline with accel.compile
                                     DiffusionTask(num_train_timesteps=T, compile=True))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"CPU, {torch.get_num_threads()} torch threads"
    print(f"{UNET} UNet train step, batch {args.batch}, on {name}")
    for arm, step in arms.items():  # warm-up (and compile) outside the clock
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            step()
        sync(device)
        print(f"  {arm:9s} warm-up {time.perf_counter() - t0:.1f} s")
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    for _ in range(args.repeats):
        for arm, step in arms.items():
            times[arm].append(timed(step, args.steps, device))
    med = {arm: statistics.median(v) for arm, v in times.items()}
    for arm, s in med.items():
        print(f"  {arm:9s} {s * 1e3:9.2f} ms/step  (x{med['lean'] / s:.2f} of lean's speed)")
    with contextlib.suppress(KeyError):
        print(f"before / task: {med['before'] / med['task']:.2f}; "
              f"task / compiled: {med['task'] / med['compiled']:.2f}")
        print(f"compiled speedup {med['task_comp'] / med['compiled']:.2f} (the task with accel.compile "
              f"against the lean compiled step; target <= 1.20)")
    print(f"speedup {med['task'] / med['lean']:.2f}")


if __name__ == "__main__":
    main()
