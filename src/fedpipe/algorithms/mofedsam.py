"""MoFedSAM (Qu et al., ICML 2022, "Generalized Federated Learning via Sharpness Aware
Minimization"), Algorithm 2: FedSAM's sharpness-aware local steps (Foret et al., ICLR 2021) mixed
with the global momentum of the last round (as in FedCM).

The server keeps Delta, the averaged per-step pseudo-gradient of the last round (0 in round 0).

Client i, from x_{i,0} = x^r, for k = 0..K-1 on a minibatch xi::

    g       = grad F_i(x_{i,k}; xi)
    e       = rho g / ||g||                               # SAM ascent; norm over all parameters
    g_sam   = grad F_i(x_{i,k} + e; xi)                   # gradient at the perturbed point
    v       = alpha g_sam + (1 - alpha) Delta^r           # momentum mixing
    x_{i,k+1} = x_{i,k} - eta_l v
    upload x_{i,K} and Delta_i = (x^r - x_{i,K}) / (K eta_l)

Server::

    Delta^{r+1} = avg_{i in S} Delta_i
    x^{r+1}     = x^r + eta_g avg_{i in S} (x_{i,K} - x^r)

The SAM step is :func:`sam_grads_fn` (the ``grads_fn`` hook of local training); the mixing is the
``grad_hook`` in :meth:`MoFedSAM.client_update`.

Implementation choices (documented, not in the paper):

- Both SAM passes see the same stochastic loss: the generator's state is restored before the second
  pass, so a loss that draws noise (the diffusion loss) uses the same draws at x and at x + e.
- Buffers (BatchNorm statistics) are restored after the second pass, so only the pass at x updates
  them (the advice of the reference SAM implementation); e covers trainable parameters only.
- e = rho g / (||g|| + 1e-12), as in the reference SAM implementation.
- Delta_i is normalised by each client's own K (steps actually taken) and eta_l (lr of the round);
  with equal K this is the paper's Delta = avg (x^r - x_{i,K}) / (K eta_l).
- Averages follow ``fl.aggregation`` (the paper writes the uniform 1/|S|).
- Delta^0 = 0, so round 0 takes steps of eta_l * alpha * g_sam (as in FedCM's code).
- Delta is a gradient (it is mixed into g_sam). The paper's Delta_i = (x^r - x_{i,K}) / (K eta_l) is
  the mean mixed gradient (1/K) sum_k v_k for plain SGD steps only. Under Adam it is Adam's mean
  normalised step, about 1 per coordinate whatever the gradients' size: (1 - alpha) Delta then
  swamps alpha g_sam, each step follows sign(Delta) at eta_l per coordinate, the next Delta is the
  same sign vector, and the model drifts without looking at the data. ``delta: mean_gradient``
  uploads Delta_i = (1/K) sum_k v_k (:func:`mean_gradient_delta`), which is the paper's value under
  SGD and a gradient under any optimizer; then Delta^{r+1} = alpha avg g_sam + (1 - alpha) Delta^r,
  the paper's momentum. ``auto`` (the default) keeps the displacement for SGD, bit for bit the
  earlier behaviour, and takes mean_gradient for Adam. Measured on the default DDPM track (digits
  8x8, 10 shard clients, 30% participation, 40 rounds, Adam lr 1e-3, rho 0.05, alpha 0.1): with the
  displacement, |Delta| = 1.000 on every coordinate from round 2 on (||Delta|| = sqrt(d) = 343.9),
  client losses climbed from 0.55 to 12.9 by round 19 and the final test eps-MSE was 7.72 (FedAvg
  0.162) and the FID 394 (FedAvg 94; FID of 500 samples); with mean_gradient, eps-MSE 0.162 and
  FID 74. Over seeds 0-2, mean_gradient: eps-MSE 0.162, FID 65 +- 12; FedAvg: 0.161, 85 +- 24.
  Mixing in step space instead (Adam on alpha g_sam, (1 - alpha) eta_l Delta added after each step)
  converged more slowly (seed 0: 0.181).
- rho is not what broke: e = rho g / ||g|| does not depend on the optimizer or the loss's scale,
  and on the trained DDPM rho = 0.05 raises a batch's loss by 16% (an MLP on digits trained by SGD:
  25%), so 0.05 is as mild here as on the classifiers it comes from. With mean_gradient, the final
  test eps-MSE by rho was 0.159 (0), 0.160 (0.01), 0.162 (0.05), 0.175 (0.2), 0.215 (0.5), and
  the FID 74.4 (0.01) against 74.2 (0.05): rho stays at SAM's 0.05 on both tracks.

Reference check (tests/test_equivalence_flbench_ref.py, docs/papers/baselines.md): with
``delta=displacement`` and ``fl.aggregation=uniform`` the client steps, the server step and the next
Delta equal woodenchild95/FL-Simulator's MoFedSAM to 1.1e-16 in float64 once its SAM epsilon
(1e-7) is set to this module's 1e-12; as published, the epsilon moves the weights by 1.8e-10 after
3 steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from fedpipe.algorithms.registry import register
from fedpipe.algorithms.scaffold import rule_for_optimizer, server_step
from fedpipe.config.core import check, one_of
from fedpipe.data import ClientData
from fedpipe.fl.local import GradsFn, LossFn, accumulate_gradients, local_train
from fedpipe.fl.state import (
    ClientUpdate,
    Payload,
    ServerState,
    Weights,
    clone,
    read,
    trainable,
)
from fedpipe.fl.strategy import ClientState, RoundInfo, Strategy
from fedpipe.tasks import Batch

SAM_EPS = 1e-12
DELTAS = ("auto", "displacement", "mean_gradient")


@dataclass(frozen=True)
class MoFedSAMConfig:
    rho: float = 0.05
    """rho, the SAM perturbation radius in e = rho g / ||g|| (Alg. 2, ascent step). 0.05 is SAM's
    default (the FedDDPM paper gives no value; docs/papers/baselines.md); it
    needs no per-track value (measured on the DDPM track: see the module docstring)."""
    alpha: float = 0.1
    """alpha, the weight of the local SAM gradient in v = alpha g_sam + (1 - alpha) Delta (Alg. 2,
    momentum mixing); 0.1, FL-Simulator's default (the FedDDPM paper gives no value;
    docs/papers/baselines.md)."""
    global_lr: float = 1.0
    """eta_g, the server step in x <- x + eta_g avg (x_i - x) (Alg. 2, server update); 1.0 makes the
    server model the clients' average (inferred: the FedDDPM paper gives no value)."""

    delta: str = "auto"
    """How a client measures Delta_i, the unit of the global momentum (Alg. 2). ``displacement``:
    (x^r - x_{i,K}) / (K eta_l), the paper's, which assumes plain SGD steps (it is then the mean of
    the mixed gradients v); ``mean_gradient``: (1/K) sum_k v_k, the mean of the mixed gradients fed
    to the optimizer (the same value under plain SGD, and a gradient under any optimizer);
    ``auto``: displacement with ``optimizer: sgd``, mean_gradient otherwise (Adam). Under Adam the
    displacement is Adam's normalised step (|Delta| = 1 per coordinate on the DDPM track, against
    gradients of ~1e-3): mixed in at weight 1 - alpha it swamps g_sam, every step goes along
    sign(Delta), Delta reproduces itself, and the model drifts by lr per coordinate per step."""

    def validate(self, p: str) -> None:
        check(self.rho >= 0, f"{p}.rho", self.rho, "a number >= 0")
        check(0 < self.alpha <= 1, f"{p}.alpha", self.alpha, "a number in (0, 1]")
        check(self.global_lr > 0, f"{p}.global_lr", self.global_lr, "a number > 0")
        one_of(f"{p}.delta", self.delta, DELTAS)


def delta_rule(choice: str, optimizer: str) -> str:
    """The Delta rule: ``auto`` is ``displacement`` for SGD, ``mean_gradient`` otherwise."""
    return rule_for_optimizer(choice, optimizer, "displacement")


def momentum_mix_hook(params: dict[str, nn.Parameter], alpha: float, delta: Weights,
                      v_sum: Weights | None = None) -> Callable[[nn.Module], None]:
    """The ``grad_hook`` of a MoFedSAM local step: grad <- v = alpha g_sam + (1 - alpha) Delta^r
    (a parameter without a gradient gets the momentum alone); then v is added to ``v_sum`` (when
    given) for :func:`mean_gradient_delta`."""
    momentum = {n: (1 - alpha) * d for n, d in delta.items()}

    def mix(model: nn.Module) -> None:
        for n, p in params.items():
            if p.grad is None:
                p.grad = momentum[n].clone()
            else:
                p.grad.mul_(alpha).add_(momentum[n])
        if v_sum is not None:
            accumulate_gradients(v_sum, params)

    return mix


def displacement_delta(x: Weights, x_i: Weights, steps: float, lr: float,
                       names: Iterable[str]) -> Weights:
    """Delta_i = (x^r - x_{i,K}) / (K eta_l) over ``names`` (Alg. 2; 0 for a client that took no
    step)."""
    return {n: (x[n] - x_i[n]) / (steps * lr) if steps else torch.zeros_like(x[n]) for n in names}


def mean_gradient_delta(v_sum: Weights, steps: float) -> Weights:
    """Delta_i = (1/K) sum_k v_k, the mean mixed gradient fed to the optimizer; with plain SGD,
    x_{i,K} = x^r - eta_l sum_k v_k makes it :func:`displacement_delta`'s value (0 for a client that
    took no step)."""
    return {n: v / steps if steps else torch.zeros_like(v) for n, v in v_sum.items()}


def sam_grads_fn(params: dict[str, nn.Parameter], rho: float, gen: torch.Generator) -> GradsFn:
    """The SAM two-pass gradient: leaves grad F(x + e) in ``.grad`` with the weights back at x;
    returns the loss at x."""

    def grads_fn(model: nn.Module, batch: Batch, loss_fn: LossFn) -> torch.Tensor:
        rng_state = gen.get_state()
        loss = loss_fn(model, batch)
        loss.backward()  # g = grad F(x)
        grads = {n: p.grad for n, p in params.items() if p.grad is not None}
        if not grads:
            return loss
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
        scale = rho / (norm + SAM_EPS)
        x = {n: params[n].detach().clone() for n in grads}
        buffers = [b.detach().clone() for b in model.buffers()]
        with torch.no_grad():
            for n, g in grads.items():
                params[n].add_(g * scale)  # x + e, e = rho g / ||g||
        model.zero_grad(set_to_none=True)
        gen.set_state(rng_state)  # the same stochastic loss at x + e
        loss_fn(model, batch).backward()  # g_sam = grad F(x + e)
        with torch.no_grad():
            for n, v in x.items():
                params[n].copy_(v)  # back to x
            for b, v in zip(model.buffers(), buffers, strict=True):
                b.copy_(v)
        return loss

    return grads_fn


@register("mofedsam")
class MoFedSAM(Strategy):
    tracks = ("classification", "diffusion")  # task-agnostic: the task's loss only
    config_class = MoFedSAMConfig

    def init_server(self, model: nn.Module) -> ServerState:
        delta = {n: torch.zeros_like(p.detach()) for n, p in trainable(model).items()}
        return ServerState(weights=clone(model.state_dict()), extra={"delta": delta})

    def payload(self, state: ServerState, round_: int, client_id: int = 0) -> Payload:
        return Payload(round=round_, weights=state.weights, extra=state.extra,  # x^r and Delta^r
                       client_id=client_id)

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        x, alpha = payload.weights, self.cfg.alpha
        model = self.scratch_model(x)
        params = trainable(model)
        delta = read(payload.extra.get("delta"), params)  # Delta^r
        rule = delta_rule(self.cfg.delta, self.local.optimizer)
        v_sum = ({n: torch.zeros_like(p.detach()) for n, p in params.items()}
                 if rule == "mean_gradient" else None)

        def loss_fn(m: nn.Module, batch: Batch) -> torch.Tensor:
            return self.task.loss(m, batch, gen)

        metrics = local_train(model, data, self.task, self.local, payload.round, gen, loss_fn=loss_fn,
                              grads_fn=sam_grads_fn(params, self.cfg.rho, gen),
                              grad_hook=momentum_mix_hook(params, alpha, delta, v_sum))
        x_i = clone(model.state_dict())
        steps = metrics["steps"]
        if rule == "mean_gradient":  # (1/K) sum_k v_k, the mixed gradients fed to the optimizer
            delta_i = mean_gradient_delta(v_sum, steps)
        else:  # (x^r - x_{i,K}) / (K eta_l)
            delta_i = displacement_delta(x, x_i, steps, self.local.lr_at(payload.round), params)
        update = ClientUpdate(client_id, len(data), x_i, extra={"delta": delta_i},
                              metrics=metrics)
        return update, client_state, metrics

    def aggregate(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        updates = rnd.updates
        x = server_step(state.weights, self.average(updates), self.cfg.global_lr)
        delta = self.average(updates, [u.extra["delta"] for u in updates])
        return ServerState(weights=x, extra={"delta": delta}, meta=state.meta)
