"""pFedMe (T. Dinh, Tran, Nguyen, NeurIPS 2020, "Personalized Federated Learning with Moreau
Envelopes"; a PerAda baseline, Sec. 7).

Client i's personalized model theta_i is the proximal point of its loss around its copy w_i of the
global model (the Moreau envelope, Eq. 2-3):

    theta_i(w_i) = argmin_theta  f_i(theta) + (lambda / 2) ||theta - w_i||^2

Each local step on a batch xi (Algorithm 1, lines 6-8):

    1. K steps of gradient descent, personal lr eta_p, from the current theta (w^t at the round's
       start): theta <- theta - eta_p (grad f_i(theta; xi) + lambda (theta - w_i))
    2. w_i <- w_i - eta lambda (w_i - theta)                (eta: the client lr, ``fl.local``)

The client uploads w_i; the server moves the global model (line 12):

    w^{t+1} = (1 - beta) w^t + beta * average_i(w_i)                   (beta = 1: FedAvg's average)

The personalized model is the client's last theta_i.

Hyperparameters: K = 3 (PerAda App. A.2); lambda in the paper's lambda/2 convention (PerAda's grid
{0.1, 1} is shared with Ditto and PerAda; the PerAda study sets the same value as for Ditto). Not given
by PerAda, so config values: eta_p (default: the client lr) and beta = 1. Step 1 is plain gradient
descent (pFedMe's own optimizer: ``fl.local``'s optimizer, momentum, weight decay and clipping are
not used, only its lr, lr decay, batch size and epochs / steps); step 2 likewise; buffers
(BatchNorm statistics) follow theta's forward passes and are uploaded with w_i.

Reference check (tests/test_equivalence_flbench_ref.py, docs/papers/baselines.md): theta_i, w_i and
the beta-mixed server step equal the authors' code (CharlieDinh/pFedMe) to 1.1e-16 in float64 when
its ``pFedMeOptimizer`` has ``mu = 0``. As published the code adds mu * theta (mu = 0.001) to the
inner gradient, a term the paper's objective does not have; this module follows the paper, and the
code differs from it by 3.4e-4 on theta_i and 6.7e-5 on the server model after 3 outer steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedpipe.algorithms.registry import register
from fedpipe.config.core import check
from fedpipe.data import ClientData
from fedpipe.fl.local import LossMean, iterate_batches
from fedpipe.fl.state import ClientUpdate, Payload, ServerState, Weights, clone, trainable
from fedpipe.fl.strategy import ClientState, RoundInfo, Strategy


@dataclass(frozen=True)
class PFedMeConfig:
    lam: float = 1.0
    """lambda of the Moreau envelope, lambda/2 ||theta - w||^2 (PerAda's grid {0.1, 1})."""
    inner_steps: int = 3
    """K, gradient steps on theta per batch (PerAda App. A.2: K = 3)."""
    personal_lr: float | None = None
    """eta_p of step 1; None = the client lr (not given by PerAda)."""
    beta: float = 1.0
    """Server step beta (line 12); 1 = the plain average (not given by PerAda)."""

    def validate(self, p: str) -> None:
        check(self.lam > 0, f"{p}.lam", self.lam, "a number > 0")
        check(self.inner_steps >= 1, f"{p}.inner_steps", self.inner_steps, "an integer >= 1")
        check(self.personal_lr is None or self.personal_lr > 0, f"{p}.personal_lr",
              self.personal_lr, "null or a number > 0")
        check(self.beta > 0, f"{p}.beta", self.beta, "a number > 0")


@register("pfedme")
class PFedMe(Strategy):
    config_class = PFedMeConfig

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        lam, lr = self.cfg.lam, self.local.lr_at(payload.round)
        plr = self.cfg.personal_lr if self.cfg.personal_lr is not None else lr
        model = self.scratch_model(payload.weights)  # theta, from w^t
        model.train()
        theta = trainable(model)
        w_i = {n: payload.weights[n].detach().clone() for n in theta}
        losses = LossMean()
        for batch in iterate_batches(data, self.local, gen):
            for _ in range(self.cfg.inner_steps):  # 1. theta ~ argmin f_i + lam/2 ||theta - w_i||^2
                model.zero_grad(set_to_none=True)
                loss = self.task.loss(model, batch, gen)
                loss.backward()
                with torch.no_grad():
                    for n, p in theta.items():
                        g = p.grad if p.grad is not None else 0.0
                        p -= plr * (g + lam * (p - w_i[n]))
            losses.add(loss)
            with torch.no_grad():  # 2. w_i <- w_i - eta lam (w_i - theta)
                for n, p in theta.items():
                    w_i[n] -= lr * lam * (w_i[n] - p)
        model.zero_grad(set_to_none=True)
        own = self.scratch_weights()  # theta (and the buffers it moved)
        upload = {**own, **w_i}
        metrics = {"loss": losses.value(), "steps": float(losses.count)}
        return ClientUpdate(client_id, len(data), clone(upload), metrics=metrics), \
            {**client_state, "personal": own}, metrics

    def aggregate(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        if not rnd.updates:
            return state
        avg = self.average(rnd.updates)
        b = self.cfg.beta
        weights = {k: (1 - b) * state.weights[k] + b * v if v.is_floating_point() else v
                   for k, v in avg.items()}
        return ServerState(weights=weights, extra=state.extra, meta=state.meta)

    def personalized_model(self, state: ServerState, client_state: ClientState, data: ClientData,
                           gen: torch.Generator, client_id: int = 0) -> Weights | None:
        return client_state.get("personal") or state.weights
