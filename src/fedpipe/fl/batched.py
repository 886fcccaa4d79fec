"""The batched executor (``fl.executor: batched``): the round's clients trained together.

The clients' weights are stacked along a new leading dimension (one slice per client) and every
local step is ONE vectorised functional step for all of them: ``torch.func.vmap`` over
``torch.func.grad_and_value`` of the task loss, evaluated with ``torch.func.functional_call`` on the
strategy's scratch model, then one optimizer update on the stacked tensors. Each client still draws
its own batches from its own stream, ``(seed, "client-update", round, client)``, through
:func:`fedpipe.fl.local.iterate_batches`, exactly as the serial executor draws them (same shuffles,
same feature-skew noise, in the same order), so a client's trained weights are the ones the serial
executor computes, up to floating-point rounding.

**Tolerance.** Batched and serial differ only in the order of float32 additions (a batched matmul
instead of a matmul, a masked sum instead of ``cross_entropy``'s mean, the optimizer written on
stacked tensors). ``tests/test_batched.py`` checks, after 2 rounds of several local steps, every
aggregated weight and every client-state tensor to ``atol = 1e-5, rtol = 1e-4`` (:data:`ATOL`,
:data:`RTOL`) and the round losses to ``1e-5`` relative; observed differences are around 1e-7.
It is not bit-identical: use ``serial`` (the default) where bit-for-bit results matter.
One exception to the elementwise tolerance: Adam on the diffusion UNet. Adam divides each coordinate's
step by its gradient's size, so a coordinate whose gradient is round-off sized (conv weights feeding a
GroupNorm, say) takes a full-size step whose sign is the round-off's: there single entries differ by up
to lr per step. The test checks the whole update instead: ``||w_batched - w_serial|| <= 1e-2
||w_serial - w_0||`` (:data:`ADAM_UPDATE_RTOL`; measured 2e-4 to 2.4e-3). SGD on the UNet, and Adam on
the classifiers, meet the elementwise tolerance.

**Clients of unequal size: pad and mask.** Clients are sorted by their number of local steps
(longest first), so at step s the clients still training are a prefix of the stack and only that
prefix is computed and updated (a client that has finished is left untouched, optimizer state
included). Within a step, the clients' batches (which differ in size when a client's last batch of
an epoch is short) are zero-padded to the largest and the loss of each client is the mean over its
real samples only (a 0/1 mask), which is the serial batch mean.

**Which strategies batch.** A strategy opts in with the class attribute ``batchable = True`` (default
False on :class:`~fedpipe.fl.strategy.Strategy`). Its client step is stated once, for every
executor: ``local_plan(payload, client_state, data, client_id) ->``
:class:`~fedpipe.fl.strategy.LocalPlan` (the weights it starts from and the terms of its local
objective: a proximal term (FedProx), a fixed gradient correction and a running sum of raw gradients
(SCAFFOLD)) and ``finish_update(...)`` (the update and client state from the trained weights). The
serial executor trains the plan with :func:`~fedpipe.fl.local.local_train`
(:meth:`~fedpipe.fl.strategy.ClientSide.client_update`), this one vectorised. The flag vouches for
the ``client_update`` of the class that declares it: a subclass that overrides ``client_update``
(a local step beyond a plan) without declaring ``batchable`` again is not batched. Batched today:
FedAvg, FedProx (and PowD, which trains as FedProx), SCAFFOLD (both control-variate rules), FedPer
(personal head), FedDDPM and FedDDPM+ (FedAvg's client step).

**Tasks.** Classification (cross-entropy) and diffusion (the DDPM eps-MSE of
:class:`~fedpipe.tasks.diffusion.DiffusionTask`: each client's t and eps are drawn from its stream
outside the vectorised step, in the serial order). The warm-up stage's independent client DDPMs
(``fedpipe.pipeline`` per-client jobs, not the round loop) are not batched.

**Fallback.** A strategy that is not batchable, or a run the vectorised step does not cover (a task
other than these two, a model with BatchNorm or dropout, whose training-mode forward has state or
randomness of its own), runs serially, with ONE log line per run naming the method and the reason.
Probes (power-of-choice) always run serially: they are a single forward pass per client.

Optimizers: SGD (momentum, weight decay) and Adam (weight decay), as ``torch.optim`` defines them;
``grad_clip`` clips each client's own gradient norm, as ``clip_grad_norm_`` does.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fedpipe.data.skew import epoch_order
from fedpipe.device import autocast
from fedpipe.fl.executors import SerialExecutor
from fedpipe.fl.local import iterate_batches, trainable_parameters
from fedpipe.fl.state import Weights, repeated_names
from fedpipe.fl.strategy import LocalPlan, Strategy, batches
from fedpipe.rng import torch_generator

log = logging.getLogger(__name__)

ATOL = 1e-5
RTOL = 1e-4
"""The documented agreement of batched with serial (weights and client state after 2 rounds)."""
ADAM_UPDATE_RTOL = 1e-2
"""Adam on the diffusion UNet: ||w_batched - w_serial|| / ||w_serial - w_0|| (see the module doc)."""


def supports_batching(strategy: Strategy) -> bool:
    """Whether ``strategy``'s method declares a client step this executor runs
    (:func:`fedpipe.fl.strategy.batches`)."""
    return batches(type(strategy))


def unsupported_reason(strategy: Strategy) -> str | None:
    """Why ``strategy``'s client step cannot be batched in this run (None: it can)."""
    if not supports_batching(strategy):
        return "its client step is not declared batchable"
    if batched_loss(strategy.task) is None:
        return f"task {getattr(strategy.task, 'name', type(strategy.task).__name__)!r} has no " \
               f"batched loss (classification and diffusion have)"
    model = strategy.scratch_model_instance()
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            return "the model has BatchNorm (running statistics change in the forward pass)"
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return "the model has dropout (its randomness is not on the client's stream)"
    if repeated_names(model.state_dict(keep_vars=True)):
        return "the model ties weights (one tensor under several names)"
    if strategy.local.optimizer not in ("sgd", "adam"):
        return f"optimizer {strategy.local.optimizer!r}"
    return None


class BatchedExecutor:
    """Runs the round's ``client_update``s as one vectorised training run (see the module doc)."""

    def __init__(self) -> None:
        self._checked: dict[int, str | None] = {}  # id(strategy) -> fallback reason

    def _reason(self, strategy: Strategy) -> str | None:
        key = id(strategy)
        if key not in self._checked:
            reason = unsupported_reason(strategy)
            self._checked[key] = reason
            if reason is not None:
                log.warning("fl.executor=batched: %s cannot be batched (%s); running its clients "
                            "serially", strategy.name, reason)
        return self._checked[key]

    def run(self, strategy, payloads, jobs, seed):
        if self._reason(strategy) is not None:
            return SerialExecutor().run(strategy, payloads, jobs, seed)
        if not jobs:
            return []
        plans = [strategy.local_plan(payloads[cid], cstate, data, cid)
                 for cid, cstate, data in jobs]
        gens = [torch_generator(seed, "client-update", payloads[cid].round, cid)
                for cid, _, _ in jobs]
        rounds = {payloads[cid].round for cid, _, _ in jobs}
        if len(rounds) > 1:
            raise ValueError(f"one round at a time; got payloads of rounds {sorted(rounds)}")
        trained = train_clients(strategy, plans, [d for _, _, d in jobs], gens, rounds.pop()
                                if rounds else 0)
        return [strategy.finish_update(plan, payloads[cid], cstate, data, cid, w, m, gs)
                for (cid, cstate, data), plan, (w, m, gs) in zip(jobs, plans, trained,
                                                                 strict=True)]

    def probe(self, strategy, payloads, jobs, seed):
        return SerialExecutor().probe(strategy, payloads, jobs, seed)


# -- the vectorised local training ----------------------------------------------------------------
def num_steps(n: int, cfg) -> int:
    """The number of local steps :func:`iterate_batches` takes on ``n`` samples."""
    if n == 0:
        return 0
    if cfg.steps is not None:
        return cfg.steps
    return cfg.epochs * math.ceil(n / cfg.batch_size)


def _masked_cross_entropy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor
                          ) -> torch.Tensor:
    per = F.cross_entropy(logits, y, reduction="none")
    return (per * mask).sum() / mask.sum()


class ClassificationLoss:
    """``ClassificationTask.loss`` (cross-entropy, batch mean) over a padded batch; under the task's
    bf16 autocast on CUDA, as the task (``compile`` does not apply to the vectorised step)."""

    def __init__(self, task) -> None:
        self.task = task

    def inputs(self, batch, gen: torch.Generator, device: torch.device) -> tuple[torch.Tensor, ...]:
        x, y = batch
        return x.to(device), y.to(device)

    def loss(self, model: nn.Module, weights: Weights, inputs, mask: torch.Tensor) -> torch.Tensor:
        x, y = inputs
        with autocast(x.device, getattr(self.task, "bf16_autocast", True)):
            logits = functional_call(model, weights, (x,))
        return _masked_cross_entropy(logits.float(), y, mask)


class DiffusionLoss:
    """``DiffusionTask.loss`` (Ho et al.'s l_simple, eq. 6) over a padded batch. The task's draws
    (t, then eps, from the client's stream, :meth:`DiffusionTask._noise`) and the forward process
    (eq. 3) happen per client outside the vectorised step, in the serial order (the batch first, then
    t and eps); the mean of the per-sample pixel means over the real samples is the task's mean."""

    def __init__(self, task) -> None:
        self.task = task

    def inputs(self, batch, gen: torch.Generator, device: torch.device) -> tuple[torch.Tensor, ...]:
        x, y = batch
        x0 = x.to(device, torch.float32) * 2 - 1  # [0, 1] -> [-1, 1], as the task
        t, eps = self.task._noise(x0, gen)  # on x0's device, as the task draws them
        return self.task.scheduler.add_noise(x0, eps, t), t, y.to(device), eps

    def loss(self, model: nn.Module, weights: Weights, inputs, mask: torch.Tensor) -> torch.Tensor:
        x_t, t, y, eps = inputs
        with autocast(x_t.device, getattr(self.task, "bf16_autocast", True)):
            pred = functional_call(model, weights, (x_t, t, y if self.task.conditional else None))
        per = ((pred.float() - eps) ** 2).flatten(1).mean(1)
        return (per * mask).sum() / mask.sum()


def batched_loss(task) -> ClassificationLoss | DiffusionLoss | None:
    """The vectorisable form of ``task``'s loss (None: the task has none)."""
    from fedpipe.tasks import ClassificationTask

    if isinstance(task, ClassificationTask):
        return ClassificationLoss(task)
    if getattr(task, "name", None) == "diffusion":
        from fedpipe.tasks.diffusion import DiffusionTask

        if isinstance(task, DiffusionTask):
            return DiffusionLoss(task)
    return None


def train_clients(strategy: Strategy, plans: Sequence[LocalPlan], datas: Sequence,
                  gens: Sequence[torch.Generator], round_: int
                  ) -> list[tuple[Weights, dict[str, float], Weights | None]]:
    """Train every client of ``plans`` on its data; returns, per client in the given order, its
    trained state dict, ``{'loss', 'steps'}`` as :func:`~fedpipe.fl.local.local_train` reports them
    and its sum of raw gradients (None unless its plan asks for it)."""
    cfg = strategy.local
    lr = cfg.lr_at(round_)
    model = strategy.scratch_model_instance()
    if not model.training:
        model.train()
    names_all = list(model.state_dict().keys())
    param_ids = {id(p) for p in trainable_parameters(model)}
    train_names = [n for n, p in model.named_parameters() if id(p) in param_ids]
    const_names = [n for n in names_all if n not in train_names]

    k = len(plans)
    steps = [num_steps(len(d), cfg) for d in datas]
    order = sorted(range(k), key=lambda i: (-steps[i], i))  # longest first: active = a prefix
    s_max = steps[order[0]] if k else 0

    def stack(tensors: list[torch.Tensor]) -> torch.Tensor:
        first = tensors[0]
        if all(t is first for t in tensors):  # the same global weights for all: one copy
            return first.detach().unsqueeze(0).repeat(len(tensors), *([1] * first.dim()))
        return torch.stack([t.detach() for t in tensors])

    with torch.no_grad():
        state = {n: stack([plans[i].start[n] for i in order]) for n in names_all}
        params = {n: state[n] for n in train_names}
        consts = {n: state[n] for n in const_names}
        use_prox = any(p.prox_mu for p in plans)
        centre = ({n: stack([plans[i].prox_centre[n] for i in order]) for n in train_names}
                  if use_prox else None)
        device = next(iter(state.values())).device
        mu = (torch.tensor([plans[i].prox_mu for i in order], dtype=torch.float32, device=device)
              if use_prox else None)
        use_corr = any(p.correction is not None for p in plans)
        corr = ({n: torch.stack([plans[i].correction[n] if plans[i].correction is not None
                                 else torch.zeros_like(params[n][0]) for i in order])
                 for n in train_names} if use_corr else None)
        use_gsum = any(p.grad_sum for p in plans)
        gsum = {n: torch.zeros_like(params[n]) for n in train_names} if use_gsum else None

    task_loss = batched_loss(strategy.task)

    def loss_fn(p, c, inputs, mask, centre_i, mu_i):
        loss = task_loss.loss(model, {**p, **c}, inputs, mask)
        if centre_i is not None:  # FedProx, Eq. 2: F_k(w) + mu/2 ||w - w^t||^2
            loss = loss + mu_i / 2 * sum(((p[n] - centre_i[n]) ** 2).sum() for n in p)
        return loss

    step_fn = vmap(grad_and_value(loss_fn), in_dims=(0, 0, 0, 0,
                                                     0 if use_prox else None,
                                                     0 if use_prox else None))
    opt = _StackedOptimizer(cfg, lr, params)
    gather = (_Gather([datas[i] for i in order], [steps[i] for i in order],
                      [gens[i] for i in order], cfg, device)
              if _Gather.applies(task_loss, datas) else None)
    iters = [] if gather else [iterate_batches(datas[i], cfg, gens[i]) for i in order]
    loss_sum = torch.zeros(k, dtype=torch.float64, device=device)  # read once, at the end
    for s in range(s_max):
        a = sum(1 for i in order if steps[i] > s)  # active clients: order[:a]
        if gather is not None:
            inputs, mask = gather.step(s, a)
        else:
            inputs, mask = _pad([task_loss.inputs(next(iters[j]), gens[order[j]], device)
                                 for j in range(a)])
        sl = {n: v[:a] for n, v in params.items()}
        cl = {n: v[:a] for n, v in consts.items()}
        grads, loss = step_fn(sl, cl, inputs, mask,
                              {n: v[:a] for n, v in centre.items()} if use_prox else None,
                              mu[:a] if use_prox else None)
        with torch.no_grad():
            if use_gsum:
                for n in train_names:
                    gsum[n][:a].add_(grads[n])
            if use_corr:
                for n in train_names:
                    grads[n].add_(corr[n][:a])
            if cfg.grad_clip is not None:
                _clip_(grads, cfg.grad_clip)
            opt.step(grads, a)
            loss_sum[:a] += loss.double()
    for it in iters:  # a generator left suspended draws nothing more; closing is tidy
        it.close()

    out: list[Any] = [None] * k
    with torch.no_grad():
        loss_sum = loss_sum.cpu()
        for j, i in enumerate(order):
            w = {n: state[n][j].clone() for n in names_all}
            metrics = {"loss": float(loss_sum[j]) / steps[i] if steps[i] else 0.0,
                       "steps": float(steps[i])}
            g = {n: gsum[n][j].clone() for n in train_names} if plans[i].grad_sum else None
            out[i] = (w, metrics, g)
    return out


class _Gather:
    """Every active client's batch of a step as ONE gather from the round's clients' data, laid end
    to end on the device (classification, clients without feature skew: the only draws are each
    epoch's shuffle). Each client's epoch orders are drawn up front, from its own stream, in the
    order :func:`~fedpipe.fl.local.iterate_batches` draws them (one
    :func:`~fedpipe.data.skew.epoch_order` per epoch, nothing drawn between them), so its batches
    are the serial executor's; the
    batch of client j at step s is rows ``[t b, min((t+1) b, n_j))`` of its epoch ``s // nb_j``'s
    order (``t = s mod nb_j``, ``nb_j = ceil(n_j / b)``), padded to the widest batch with a zero
    sample of mask 0. The per-client Python work and the per-client index, stack and pad kernels of
    :func:`_pad` (hundreds of launches a step at 100 clients, where a GPU waits on the host) become
    two index kernels a step."""

    @staticmethod
    def applies(task_loss, datas: Sequence) -> bool:
        return isinstance(task_loss, ClassificationLoss) and all(
            d.skew[0] == "none" or d.skew[1] == 0 for d in datas)

    def __init__(self, datas: Sequence, steps: Sequence[int], gens: Sequence[torch.Generator],
                 cfg, device: torch.device):
        b = cfg.batch_size
        xs = [d.x.to(device) for d in datas]
        ys = [d.y.to(device) for d in datas]
        self.x = torch.cat([*xs, xs[0].new_zeros((1, *xs[0].shape[1:]))])  # last row: the pad
        self.y = torch.cat([*ys, ys[0].new_zeros(1)])
        sizes = [len(d) for d in datas]
        width = min(b, max(sizes)) if sizes else 1
        k, s_max = len(datas), max(steps, default=0)
        host = torch.device("cpu")  # the positions are built on the host, then copied once
        pos = torch.full((s_max, k, width), -1, dtype=torch.long, device=host)  # in `seq`
        seqs, seq_off, row_off = [], 0, 0
        for j, (n, st, gen) in enumerate(zip(sizes, steps, gens, strict=True)):
            if st:
                nb = math.ceil(n / b)
                perms = [epoch_order(n, gen, host) for _ in range(math.ceil(st / nb))]
                seqs.append(torch.cat(perms) + row_off)
                s = torch.arange(st, device=host)
                first = (s % nb) * b  # the batch's first position within its epoch
                r = torch.arange(width, device=host)
                p = (s // nb * n + first).unsqueeze(1) + r
                pos[:st, j] = torch.where(first.unsqueeze(1) + r < n, p + seq_off, -1)
                seq_off += len(perms) * n
            row_off += n
        pad_row = torch.full((1,), row_off, dtype=torch.long, device=host)
        seq = torch.cat([*seqs, pad_row])
        rows = seq[torch.where(pos >= 0, pos, len(seq) - 1)]  # (s_max, k, width) rows of x
        self.rows, self.mask = rows.to(device), (pos >= 0).to(device, torch.float32)  # one copy each

    def step(self, s: int, a: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        rows = self.rows[s, :a]
        return (self.x[rows], self.y[rows]), self.mask[s, :a]


def _pad(items: list[tuple[torch.Tensor, ...]]
         ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Stack the clients' batch tensors (each a tuple of tensors with the samples along dim 0),
    zero-padded to the largest batch, with a 0/1 mask of the real samples."""
    sizes = [len(it[0]) for it in items]
    b, n = max(sizes), len(items)
    if all(s == b for s in sizes):
        return (tuple(torch.stack(ts) for ts in zip(*items, strict=True)),
                torch.ones(n, b, device=items[0][0].device))
    device = items[0][0].device
    rows = torch.cat([torch.arange(s, device=device) + j * b
                      for j, s in enumerate(sizes)])  # real samples' slots
    out = []
    for ts in zip(*items, strict=True):
        t0 = ts[0]
        full = t0.new_zeros((n * b, *t0.shape[1:]))
        full[rows] = torch.cat(ts)
        out.append(full.view(n, b, *t0.shape[1:]))
    mask = torch.zeros(n * b, device=device)
    mask[rows] = 1.0
    return tuple(out), mask.view(n, b)


def _clip_(grads: dict[str, torch.Tensor], max_norm: float) -> None:
    """Each client's gradient scaled to global L2 norm <= ``max_norm`` (``clip_grad_norm_``)."""
    a = next(iter(grads.values())).shape[0]
    norms = torch.stack([g.reshape(a, -1).norm(dim=1) for g in grads.values()], dim=1).norm(dim=1)
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads.values():
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))))


class _StackedOptimizer:
    """``torch.optim.SGD`` / ``Adam`` (as :func:`fedpipe.fl.local.make_optimizer` builds them) on
    stacked parameters; :meth:`step` updates the first ``a`` clients only. All clients start
    together, so the ones still training share the step count (Adam's bias correction)."""

    def __init__(self, cfg, lr: float, params: dict[str, torch.Tensor]):
        self.cfg, self.lr, self.params = cfg, lr, params
        self.t = 0
        self.buf: dict[str, torch.Tensor] = {}
        if cfg.optimizer == "adam":
            self.m = {n: torch.zeros_like(p) for n, p in params.items()}
            self.v = {n: torch.zeros_like(p) for n, p in params.items()}

    def step(self, grads: dict[str, torch.Tensor], a: int) -> None:
        cfg, lr = self.cfg, self.lr
        self.t += 1
        for n, g in grads.items():
            p = self.params[n][:a]
            if cfg.weight_decay:
                g = g.add(p, alpha=cfg.weight_decay)
            if cfg.optimizer == "adam":
                b1, b2, eps = 0.9, 0.999, 1e-8
                m, v = self.m[n][:a], self.v[n][:a]
                m.lerp_(g, 1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                bc1, bc2 = 1 - b1 ** self.t, 1 - b2 ** self.t
                denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
                p.addcdiv_(m, denom, value=-lr / bc1)
                continue
            if cfg.momentum:
                if n not in self.buf:
                    self.buf[n] = torch.zeros_like(self.params[n])
                    self.buf[n][:a] = g
                else:
                    self.buf[n][:a].mul_(cfg.momentum).add_(g)
                g = self.buf[n][:a]
            p.add_(g, alpha=-lr)
