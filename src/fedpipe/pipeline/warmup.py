"""The warmup stage (FedDDPM Sec. VI-A, "warm-up"): every client trains its own DDPM on its local data
for ``warmup.epochs`` epochs, from its own seeded initialisation, before any FL round.

Outputs, for replicate r of ``study.seeds`` (the stage ``warmup@<r>``, on replicate r's partition, every draw
from r), ``data/warmup/seed_<r>/models/client_XXX.safetensors`` (one checkpoint per client: the EMA weights
when ``diffusion.ema_decay`` is set), ``losses.csv`` (client, epoch, mean epoch loss), ``losses.png`` and
``metrics.json``.

Clients are independent, so on the CPU they train side by side in ``FEDPIPE_WORKERS`` processes of one
thread each (default: one per core; a client's batches of 32 tiny images keep one core busy and gain
nothing from a second thread). Each client draws from its own seeded streams and trains with one torch
thread also when run in this process, so the checkpoints are the same, bit for bit, whatever the
number of processes or cores (tested).

Resumable: each client's checkpoint is written atomically to ``data/checkpoints/warmup/seed_<r>/models/`` (not
a DVC output, so DVC's run-cache works for this stage) as soon as that client finishes, tagged with a
fingerprint of the params the stage reads and of the partition file. A killed warm-up restarts at the first
client without a matching checkpoint; a checkpoint from other params is redone. When every client is done,
their checkpoints are copied to ``data/warmup/seed_<r>/models/``."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from fedpipe.cli import keep_on_interrupt
from fedpipe.config.diffusion import WarmupConfig, check_diffusion_models
from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import ClientData, load_dataset
from fedpipe.errors import DivergenceError, InputError
from fedpipe.fl.engine import earlier_seconds, write_seconds
from fedpipe.fl.local import local_train
from fedpipe.fl.state import all_finite
from fedpipe.io import (
    md5_file,
    read_tensors,
    save_figure,
    save_tensors,
    set_aside,
    write_bytes,
    write_csv,
    write_json,
)
from fedpipe.pipeline.diffusion import (
    WARMUP_DIR,
    DiffusionStageConfig,
    client_path,
    make_task,
    make_unet,
    params_fingerprint,
)
from fedpipe.pipeline.inputs import (
    checkpoint_dir,
    clients_of,
    load_partition,
    partition_file,
    replicate_dir,
)
from fedpipe.pipeline.workers import map_in_processes, one_thread, worker_count
from fedpipe.rng import torch_generator
from fedpipe.tasks.diffusion import DiffusionTask, ema_step_hook, ema_weights, make_ema

log = logging.getLogger(__name__)

META_KEY = "fedpipe.warmup"


@dataclass(frozen=True)
class WarmupOutputs:
    out_dir: Path
    losses: dict[int, list[float]]  # client -> mean loss per epoch
    trained: list[int]  # clients trained in this call (the others were resumed)
    metrics: dict[str, float]
    inputs: dict[str, str]


def client_steps(cfg: WarmupConfig, samples: int) -> int:
    """A client's warm-up steps: ``epochs x ceil(m / batch_size)``, at most ``steps`` when set."""
    full = cfg.epochs * math.ceil(samples / cfg.batch_size)
    return full if cfg.steps is None else min(full, cfg.steps)


def local_config(cfg: WarmupConfig, samples: int | None = None) -> LocalTrainConfig:
    """The warm-up as a local training run; a step cap (``warmup.steps``) needs the client's
    ``samples`` (the cap never lengthens a client's warm-up)."""
    capped = cfg.steps is not None and samples is not None and client_steps(cfg, samples) < (
        cfg.epochs * math.ceil(samples / cfg.batch_size))
    return LocalTrainConfig(epochs=cfg.epochs, batch_size=cfg.batch_size, optimizer=cfg.optimizer,
                            lr=cfg.lr, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip,
                            steps=client_steps(cfg, samples) if capped else None)


def diverged(client: int | None, epoch: int, what: str, cfg: WarmupConfig) -> DivergenceError:
    who = f"client {client}" if client is not None else "a client"
    return DivergenceError(
        f"warm-up diverged: {who}, epoch {epoch}: {what}; nothing of this client is written. "
        f"Settings in play: warmup.lr={cfg.lr}, warmup.optimizer={cfg.optimizer}, "
        f"warmup.weight_decay={cfg.weight_decay}, warmup.grad_clip={cfg.grad_clip}")


def train_client_ddpm(model: torch.nn.Module, data: ClientData, task: DiffusionTask,
                      cfg: WarmupConfig, gen: torch.Generator, *, ema_decay: float | None = None,
                      on_step: Callable[[], None] | None = None, client: int | None = None
                      ) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Train one client's DDPM through the shared local loop; returns (weights to keep, per-epoch
    mean losses). The weights are the EMA weights (diffusers' ``EMAModel``, with its warm-up of the
    decay) when ``ema_decay`` is set.

    Divergence guard (as in federated rounds): after every epoch its losses are checked (one host
    sync per epoch), and the weights before they are returned; a non-finite value stops the
    warm-up with a :class:`DivergenceError` naming ``client`` and the epoch."""
    step_losses: list[torch.Tensor] = []
    per_epoch = math.ceil(len(data) / cfg.batch_size)

    def loss_fn(m: torch.nn.Module, batch) -> torch.Tensor:
        loss = task.loss(m, batch, gen)
        step_losses.append(loss.detach())
        return loss

    ema = make_ema(model, ema_decay) if ema_decay is not None else None
    ema_hook = ema_step_hook(ema) if ema is not None else None

    def step_hook(m: torch.nn.Module) -> None:
        if ema_hook is not None:
            ema_hook(m)
        if on_step is not None:
            on_step()
        if len(step_losses) % per_epoch == 0:  # an epoch ended
            epoch = torch.stack(step_losses[-per_epoch:])
            if not bool(torch.isfinite(epoch).all()):
                bad = epoch[~torch.isfinite(epoch)][0].item()
                raise diverged(client, len(step_losses) // per_epoch, f"non-finite loss ({bad})",
                               cfg)

    local = local_config(cfg, len(data))
    local_train(model, data, task, local, 0, gen, loss_fn=loss_fn, step_hook=step_hook)
    losses = torch.stack(step_losses).double()
    if local.steps is None:
        epoch_losses = losses.view(cfg.epochs, per_epoch).mean(1).tolist()
    else:  # capped (warmup.steps): whole epochs, then the part of the last one that ran
        tail = losses[len(losses) - len(losses) % per_epoch:]
        if not bool(torch.isfinite(tail).all()):
            raise diverged(client, len(losses) // per_epoch + 1, "non-finite loss", cfg)
        epoch_losses = [float(c.mean()) for c in losses.split(per_epoch)]
    with ema_weights(ema, model) if ema is not None else contextlib.nullcontext(model):
        weights = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    if not all_finite(weights):
        raise diverged(client, cfg.epochs, "non-finite weights", cfg)
    return weights, epoch_losses


def _finished(path: Path, fingerprint: str, aside: Path) -> dict | None:
    """The metadata of a finished client's model matching ``fingerprint`` (else None). A file that
    cannot be read (a truncated or corrupt persisted model) is set aside into ``aside``, with a
    log line, and the client is trained afresh."""
    if not path.is_file():
        return None
    try:  # read whole: the content must match the hash it was written with, and be finite
        weights, meta = read_tensors(path)
        if not all_finite(weights):
            raise InputError(path, "holds non-finite values", None)
    except InputError as e:
        set_aside(path, e.problem, aside)
        return None
    return meta if meta and meta.get("fingerprint") == fingerprint else None


def plot_losses(losses: dict[int, list[float]], title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for cid, ls in sorted(losses.items()):
        ax.plot(range(1, len(ls) + 1), ls, lw=1, label=f"client {cid}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("epsilon-MSE (epoch mean)")
    ax.set_yscale("log")
    if len(losses) <= 12:
        ax.legend(fontsize=7, ncol=2)
    ax.set_title(title)
    return fig


def _train_client_job(job: tuple) -> tuple[int, dict[str, torch.Tensor], list[float]]:
    """One client's warm-up in a worker process (CPU): the same seeded initialisation, data order and
    noise as in the serial loop."""
    cfg, meta, cid, data = job
    model = make_unet(cfg.diffusion, meta, cfg.seed, "warmup-init", cid)
    weights, client_losses = train_client_ddpm(model, data, make_task(cfg.diffusion, cfg.device.accel),
                                               cfg.warmup,
                                               torch_generator(cfg.seed, "warmup", cid),
                                               ema_decay=cfg.diffusion.ema_decay, client=cid)
    return cid, weights, client_losses


def warmup(cfg: DiffusionStageConfig, out_dir: str | Path | None = None,
           partition_path: str | Path | None = None, stop_after: int | None = None,
           progress: bool = True, workers: int | None = None) -> WarmupOutputs:
    """Train (or resume) every client's warm-up DDPM. ``stop_after``: stop after training that many
    clients in this call (simulates an interruption; used by tests). ``workers``: processes that
    train clients side by side on the CPU, one thread each (default :func:`worker_count`, from
    ``FEDPIPE_WORKERS``); 1 trains them one after the other in this process. By default it reads
    and writes replicate ``cfg.seed``'s files (``data/partition/seed_<seed>``,
    ``data/warmup/seed_<seed>``)."""
    out = Path(out_dir or replicate_dir(WARMUP_DIR, cfg.seed))
    partition_path = partition_path or partition_file(cfg.seed)
    check_diffusion_models(cfg.dataset, cfg.diffusion, cfg.fid)  # before any data loads
    models_dir = out / "models"
    resume_dir = checkpoint_dir(out, "models")  # each finished client, as soon as it is done
    resume_dir.mkdir(parents=True, exist_ok=True)
    keep_on_interrupt(f"every finished client's warm-up model kept in {resume_dir}")
    part = load_partition(partition_path, cfg.seed)
    ds = load_dataset(cfg.dataset)
    clients = clients_of(ds, part)
    task = make_task(cfg.diffusion, cfg.device.accel)
    device = cfg.device.torch
    fp = params_fingerprint(cfg.params_read, partition_path)
    for stale in resume_dir.glob("client_*.safetensors"):  # clients of an earlier, larger partition
        if int(stale.stem.split("_")[1]) >= len(clients):
            stale.unlink()
    losses: dict[int, list[float]] = {}
    trained: list[int] = []
    steps_per_client = [client_steps(cfg.warmup, len(c)) for c in clients]
    bar = tqdm(total=sum(steps_per_client), desc="warm-up", unit="step", disable=not progress,
               mininterval=1.0)
    todo: list[int] = []
    for cid, data in enumerate(clients):
        done = _finished(client_path(resume_dir, cid), fp, resume_dir.parent / "corrupt")
        if done is not None:
            losses[cid] = done["losses"]
            bar.update(steps_per_client[cid])
            continue
        if len(data) == 0:
            raise ValueError(f"warm-up: client {cid} has no training data")
        todo.append(cid)
    if stop_after is not None:
        todo = todo[:stop_after]

    def save(cid: int, weights: dict[str, torch.Tensor], client_losses: list[float]) -> None:
        # each client's checkpoint is written as soon as it is done: a killed warm-up resumes there
        meta = {"fingerprint": fp, "client": cid, "samples": len(clients[cid]),
                "losses": client_losses, "epochs": cfg.warmup.epochs}
        save_tensors(client_path(resume_dir, cid), dict(sorted(weights.items())),
                     {META_KEY: json.dumps(meta, sort_keys=True)})
        losses[cid] = client_losses
        trained.append(cid)
        write_seconds(resume_dir, fp, [*earlier, time.perf_counter() - t0])  # beside, not hashed

    n_workers = min(workers if workers is not None else worker_count(), len(todo))
    earlier = earlier_seconds(resume_dir, fp, len(losses))  # the processes before a resume
    t0 = time.perf_counter()
    if n_workers <= 1 or device.type != "cpu":
        for cid in todo:
            bar.set_description(f"warm-up client {cid + 1}/{len(clients)}")
            model = make_unet(cfg.diffusion, ds.meta, cfg.seed, "warmup-init", cid).to(device)
            with one_thread() if device.type == "cpu" else contextlib.nullcontext():
                weights, client_losses = train_client_ddpm(
                    model, clients[cid].to(device), task, cfg.warmup,
                    torch_generator(cfg.seed, "warmup", cid),
                    ema_decay=cfg.diffusion.ema_decay, on_step=lambda: bar.update(1), client=cid)
            save(cid, weights, client_losses)
    else:
        bar.set_description(f"warm-up ({n_workers} processes)")
        jobs = [(cfg, ds.meta, cid, clients[cid]) for cid in todo]
        for cid, weights, client_losses in map_in_processes(_train_client_job, jobs, n_workers):
            save(cid, weights, client_losses)
            bar.update(steps_per_client[cid])
    seconds = time.perf_counter() - t0
    bar.close()
    trained.sort()
    complete = len(losses) == len(clients)
    # metrics.json holds what the models determine; what this process did (its clients and seconds,
    # which differ between a fresh and a resumed run) goes to MLflow and the log only, so that a
    # fresh run's outputs hash as the committed dvc.lock says
    metrics = {"clients": float(len(clients)),
               "final_loss_mean": float(np.mean([ls[-1] for ls in losses.values()])) if losses else 0.0}
    if complete:  # the stage's output: every client's model, copied from the resume folder
        models_dir.mkdir(parents=True, exist_ok=True)
        for old in models_dir.glob("client_*.safetensors"):
            old.unlink()
        for cid in range(len(clients)):
            write_bytes(client_path(models_dir, cid), client_path(resume_dir, cid).read_bytes())
        write_csv(out / "losses.csv", ["client", "epoch", "loss"],
                  [[cid, e + 1, v] for cid, ls in sorted(losses.items()) for e, v in enumerate(ls)])
        save_figure(out / "losses.png", plot_losses(losses, f"warm-up DDPMs on {cfg.dataset.name}"))
        write_json(out / "metrics.json", metrics)
        log.info("warm-up: %d clients (%d trained now, %.1f s)", len(clients), len(trained), seconds)
    metrics = {**metrics, "clients_trained_now": float(len(trained)), "train_seconds_now": seconds,
               # the whole warm-up's seconds, over the processes that trained its clients
               "train_seconds_total": sum(earlier) + seconds}
    return WarmupOutputs(out, losses, trained, metrics, {str(partition_path): md5_file(partition_path)})
