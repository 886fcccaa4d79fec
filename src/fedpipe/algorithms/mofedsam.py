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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedpipe.algorithms.scaffold import server_step
from fedpipe.config.core import check
from fedpipe.data import ClientData
from fedpipe.fl.local import GradsFn, LossFn, local_train
from fedpipe.fl.state import (
    ClientUpdate,
    Payload,
    ServerState,
    clone,
    read,
    trainable,
)
from fedpipe.fl.strategy import ClientState, RoundInfo, Strategy
from fedpipe.tasks import Batch

SAM_EPS = 1e-12


@dataclass(frozen=True)
class MoFedSAMConfig:
    rho: float = 0.05
    """rho, the SAM perturbation radius in e = rho g / ||g|| (Alg. 2, ascent step). 0.05 is SAM's
    default and in spec 001_fedddpm §5's grid {0.01, 0.05} (the FedDDPM paper gives no value)."""
    alpha: float = 0.1
    """alpha, the weight of the local SAM gradient in v = alpha g_sam + (1 - alpha) Delta (Alg. 2,
    momentum mixing); 0.1 per spec 001_fedddpm §5 ("momentum factor ~ 0.1, per Qu et al.")."""
    global_lr: float = 1.0
    """eta_g, the server step in x <- x + eta_g avg (x_i - x) (Alg. 2, server update); 1.0 makes the
    server model the clients' average (inferred: the FedDDPM spec gives no value)."""

    def validate(self, p: str) -> None:
        check(self.rho >= 0, f"{p}.rho", self.rho, "a number >= 0")
        check(0 < self.alpha <= 1, f"{p}.alpha", self.alpha, "a number in (0, 1]")
        check(self.global_lr > 0, f"{p}.global_lr", self.global_lr, "a number > 0")


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


class MoFedSAM(Strategy):
    name = "mofedsam"
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
        momentum = {n: (1 - alpha) * d for n, d in read(payload.extra.get("delta"), params).items()}

        def loss_fn(m: nn.Module, batch: Batch) -> torch.Tensor:
            return self.task.loss(m, batch, gen)

        def mix(m: nn.Module) -> None:  # v = alpha g_sam + (1 - alpha) Delta^r
            for n, p in params.items():
                if p.grad is None:
                    p.grad = momentum[n].clone()
                else:
                    p.grad.mul_(alpha).add_(momentum[n])

        metrics = local_train(model, data, self.task, self.local, payload.round, gen, loss_fn=loss_fn,
                              grads_fn=sam_grads_fn(params, self.cfg.rho, gen), grad_hook=mix)
        x_i = clone(model.state_dict())
        steps, lr = metrics["steps"], self.local.lr_at(payload.round)
        delta_i = {n: (x[n] - x_i[n]) / (steps * lr) if steps else torch.zeros_like(x[n])
                   for n in params}
        update = ClientUpdate(client_id, len(data), x_i, extra={"delta": delta_i},
                              metrics=metrics)
        return update, client_state, metrics

    def aggregate(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        updates = rnd.updates
        x = server_step(state.weights, self.average(updates), self.cfg.global_lr)
        delta = self.average(updates, [u.extra["delta"] for u in updates])
        return ServerState(weights=x, extra={"delta": delta}, meta=state.meta)
