"""FedDF (Lin et al., NeurIPS 2020, "Ensemble Distillation for Robust Model Fusion in Federated
Learning"; a PerAda baseline, Sec. 7.1, Table 2): FedAvg on the clients, then the server distils the
ensemble of the round's client models into the averaged model on unlabelled server data.

Round t, participating clients S_t with local models W_m^{t+1} (FedAvg's local SGD):

    W^{t,0} = sum_m p_m W_m^{t+1}                                   (FedAvg average, ``fl.aggregation``)
    for r = 0..R-1, batch x from the unlabelled set D_aux:
        z_T(x) = (1/|S_t|) sum_{m in S_t} f(W_m^{t+1}, x)           (mean of the teachers' logits)
        W <- W - eta Adam( KL( softmax(z_T / tau) || softmax(f(W, x) / tau) ) )

``distill`` below is shared with PerAda (its global adapter is distilled the same way). Choices, each a
config field: Adam (FedDF and PerAda's code), cosine annealing of the lr over the R steps (PerAda's
code; FedDF itself uses a constant lr with early stopping on a labelled validation set, which needs
labels on the server and is not done here), temperature tau = 1 with no tau^2 factor, per-batch mean
KL. Teachers run in eval mode (no dropout, BN running statistics), so their logits on the set are
computed once per round, which is exactly what per-batch teacher passes would give; the student trains
in train mode, as in both official codes (its BN running statistics follow the distillation data).

Reference check: none (docs/papers/baselines.md): FL-bench and PFLlib do not implement FedDF and no
official code is among the stored repositories; the shared ``distill`` is checked with PerAda.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedpipe.algorithms.registry import register
from fedpipe.config.core import check
from fedpipe.data import ClientData
from fedpipe.device import generator_on
from fedpipe.fl.state import ServerState, Weights
from fedpipe.fl.strategy import RoundInfo, Strategy, require_server_data

DISTILL_KINDS = ("distill", "holdout", "public")


@dataclass(frozen=True)
class DistillConfig:
    """The server's ensemble distillation (shared by FedDF and PerAda)."""

    kd_steps: int = 500
    """R, distillation steps per round (PerAda Table 9, CIFAR-10: 500)."""
    kd_batch_size: int = 2048
    """Distillation batch size (PerAda Table 9, CIFAR-10: 2048)."""
    kd_lr: float = 1e-3
    """eta_g, Adam's lr on the server (PerAda Table 9, CIFAR-10: 1e-3); cosine-annealed over R."""
    kd_temperature: float = 1.0
    """tau in KL(softmax(z_T/tau) || softmax(z_S/tau)); the papers give none, PerAda's code uses 1."""
    kd_max_round: int | None = None
    """Distil only in rounds < this (PerAda's code: 30); null = every round (the paper's Alg. 1)."""
    server_data: str = "distill"
    """The unlabelled distillation set: ``distill`` (the generated auxiliary set), ``holdout`` (the
    dataset's held-out slice of the training pool, ``dataset.holdout_fraction``) or ``public``
    (another dataset's training images, ``dataset.public_dataset``: PerAda's CIFAR-100)."""

    def validate(self, p: str) -> None:
        check(self.kd_steps >= 0, f"{p}.kd_steps", self.kd_steps, "an integer >= 0")
        check(self.kd_batch_size >= 1, f"{p}.kd_batch_size", self.kd_batch_size, "an integer >= 1")
        check(self.kd_lr > 0, f"{p}.kd_lr", self.kd_lr, "a number > 0")
        check(self.kd_temperature > 0, f"{p}.kd_temperature", self.kd_temperature, "a number > 0")
        check(self.kd_max_round is None or self.kd_max_round >= 0, f"{p}.kd_max_round",
              self.kd_max_round, "null or an integer >= 0")
        check(self.server_data in DISTILL_KINDS, f"{p}.server_data", self.server_data,
              " or ".join(DISTILL_KINDS))

    def distills_in(self, round_: int) -> bool:
        return self.kd_steps > 0 and (self.kd_max_round is None or round_ < self.kd_max_round)


@contextmanager
def global_rng_from(gen: torch.Generator) -> Iterator[None]:
    """Seed torch's global RNG from ``gen`` for the duration (restored after): ``nn.Dropout`` (PerAda's
    adapters) draws its masks from the global RNG, which would otherwise make a run depend on what
    ran before it in the process."""
    seed = int(torch.randint(0, 2**62, (1,), generator=gen, device=gen.device))
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def teacher_logits(teachers: Sequence[nn.Module], x: torch.Tensor, batch_size: int = 1024
                   ) -> torch.Tensor:
    """z_T: the mean of the teachers' logits on ``x`` (teachers in eval mode)."""
    out = []
    with torch.inference_mode():
        for t in teachers:
            t.eval()
        for start in range(0, len(x), batch_size):
            xb = x[start:start + batch_size]
            out.append(torch.stack([t(xb) for t in teachers]).mean(0))
    return torch.cat(out)


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0
            ) -> torch.Tensor:
    """KL(softmax(z_T/tau) || softmax(z_S/tau)), mean over the batch (``batchmean``)."""
    return F.kl_div(F.log_softmax(student_logits / temperature, dim=1),
                    F.log_softmax(teacher_logits / temperature, dim=1),
                    reduction="batchmean", log_target=True)


def distill(student: nn.Module, teachers: Sequence[nn.Module], data: ClientData, cfg: DistillConfig,
            gen: torch.Generator) -> dict[str, float]:
    """R Adam steps (cosine-annealed lr) of the student's trainable parameters on
    KL(teacher ensemble || student) over shuffled batches of ``data`` (cycled), in place."""
    z_t = teacher_logits(teachers, data.x)
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=cfg.kd_lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(cfg.kd_steps, 1))
    student.train()
    n, done, first, last = len(data), 0, float("nan"), float("nan")
    g = generator_on(gen, data.x.device)  # the batch order, drawn where the data is
    with global_rng_from(gen):  # the student's dropout masks
        while done < cfg.kd_steps:
            order = torch.randperm(n, generator=g, device=g.device)
            for start in range(0, n, cfg.kd_batch_size):
                idx = order[start:start + cfg.kd_batch_size]
                opt.zero_grad(set_to_none=True)
                loss = kd_loss(student(data.x[idx]), z_t[idx], cfg.kd_temperature)
                loss.backward()
                opt.step()
                sched.step()
                done += 1
                if done == 1:
                    first = loss.item()
                if done == cfg.kd_steps:
                    last = loss.item()
                    break
    return {"kd_loss_first": first, "kd_loss_last": last, "kd_steps": float(done)}


def distill_weights(strategy: Strategy, start: Weights, teachers: Sequence[Weights], data: ClientData,
                    cfg: DistillConfig, gen: torch.Generator) -> tuple[Weights, dict[str, float]]:
    """The weights ``start`` distilled from the ensemble of ``teachers`` (full state dicts)."""
    student = strategy.model_of(start)
    models = [strategy.model_of(w) for w in teachers]
    info = distill(student, models, data, cfg, gen)
    return {k: v.detach().clone() for k, v in student.state_dict().items()}, info


@dataclass(frozen=True)
class FedDFConfig(DistillConfig):
    pass


@register("feddf")
class FedDF(Strategy):
    config_class = FedDFConfig

    def server_update(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        return distill_round(self, state, rnd)


def distill_round(strategy: Any, state: ServerState, rnd: RoundInfo) -> ServerState:
    """The server step of FedDF and PerAda: in a distillation round with updates, distil the global
    model (student) from the round's local models (teachers: the global weights overlaid with each
    update) on the server data; otherwise the state unchanged."""
    if not rnd.updates or not strategy.cfg.distills_in(rnd.index):
        return state
    data = require_server_data(rnd, strategy.name)
    teachers = [{**state.weights, **u.weights} for u in rnd.updates]
    weights, _ = distill_weights(strategy, state.weights, teachers, data, strategy.cfg,
                                 rnd.generator("distill"))
    return ServerState(weights=weights, extra=state.extra, meta=state.meta)
