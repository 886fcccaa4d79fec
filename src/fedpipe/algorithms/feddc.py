"""FedDC (Gao et al., CVPR 2022, "FedDC: Federated Learning with Non-IID Data via Local Drift
Decoupling and Correction"), Algorithm 1, as in the authors' code (gaoliang13/FedDC, the harness the
FedPTR authors used for their baselines; docs/papers/baselines.md).

Each client i keeps a local drift variable h_i (the accumulated gap between its local model and the
global model) and a SCAFFOLD-style control variate c_i; the server keeps c. All start at 0.

Client i, starting from the global model w (theta_i <- w), K local steps on::

    F(theta_i) = L_i(theta_i)                                   # task loss
               + alpha/2 ||theta_i + h_i - w||^2                # R: drift penalty (Eq. 5)
               + <theta_i, c - c_i>                             # G: gradient correction (Eq. 6)

then::

    h_i  <- h_i + (theta_i - w)                                 # local drift update
    c_i+ <- c_i - c + (w - theta_i) / (K eta)                   # SCAFFOLD option II
    upload theta_i + h_i  (and dc_i = c_i+ - c_i)

Server::

    w <- avg_{i in S} (theta_i + h_i)                           # drift-corrected aggregation
    c <- c + (1/N) sum_{i in S} dc_i

R is added to the task loss (so the reported local loss includes it); G is added to the gradient
before the optimizer step, exactly as SCAFFOLD's correction (the paper's G term uses the clients'
previous local updates; its code implements it with SCAFFOLD's option-II control variates, which is
what this module does).

Inferred choices (config values or documented here):

- ``drift_average``: ``participants`` (default) is the paper's "the server averages the uploaded
  theta_i + h_i" over the round's clients; ``all_clients`` is the authors' code:
  w = avg_{i in S} theta_i + (1/N) sum_{all i} h_i, with the stale drifts of clients not sampled
  this round (the server keeps sum_i h_i). Both agree under full participation and uniform weights.
- ``avg`` follows ``fl.aggregation`` (the code uses the uniform mean: ``fl.aggregation=uniform``).
- K is the number of local steps actually taken and eta the local lr of the round (the code uses the
  undecayed lr).
- The code rescales alpha and the control variates per client by its relative data size
  (n_i / mean n); this module uses the paper's unscaled alpha (identical for equal-size clients).
- h_i, c_i, R and G cover the trainable parameters; float buffers (BatchNorm statistics) are
  averaged as in FedAvg.

Reference check (tests/test_equivalence_flbench_ref.py, docs/papers/baselines.md): with
``drift_average=all_clients`` and ``fl.aggregation=uniform``, theta_i, h_i, c_i and the server's w
and c equal gaoliang13/FedDC to 3.8e-16 in float64 (equal-size clients, no lr decay).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedpipe.algorithms.registry import register
from fedpipe.algorithms.scaffold import option2_control_variate
from fedpipe.config.core import check, one_of
from fedpipe.data import ClientData
from fedpipe.fl.local import correct_gradients, local_train
from fedpipe.fl.state import (
    ClientUpdate,
    Payload,
    ServerState,
    clone,
    read,
    sum_over_clients,
    trainable,
)
from fedpipe.fl.strategy import ClientState, RoundInfo, Strategy, check_num_clients
from fedpipe.tasks import Batch

DRIFT_AVERAGES = ("participants", "all_clients")


@dataclass(frozen=True)
class FedDCConfig:
    alpha: float = 0.01
    """alpha, the drift-penalty coefficient in R = alpha/2 ||theta_i + h_i - w||^2 (Eq. 5).
    0.01 = ``alpha_coef`` of the authors' example code and of the FedPTR harness, the middle of
    {0.001, 0.01, 0.1} (docs/papers/baselines.md)."""
    drift_average: str = "participants"
    """How the server forms w (Alg. 1, server step): ``participants`` = avg over the round's clients
    of the uploaded theta_i + h_i (paper); ``all_clients`` = avg theta_i + mean of all N clients'
    h_i (authors' code). Inferred choice; both agree under full participation."""

    def validate(self, p: str) -> None:
        check(self.alpha > 0, f"{p}.alpha", self.alpha, "a number > 0")
        one_of(f"{p}.drift_average", self.drift_average, DRIFT_AVERAGES)


@register("feddc")
class FedDC(Strategy):
    tracks = ("classification", "diffusion")  # task-agnostic: the task's loss only
    config_class = FedDCConfig

    def init_server(self, model: nn.Module) -> ServerState:
        zeros = {n: torch.zeros_like(p.detach()) for n, p in trainable(model).items()}
        extra = {"c": zeros}
        if self.cfg.drift_average == "all_clients":
            extra["hsum"] = {n: z.clone() for n, z in zeros.items()}  # sum_i h_i
        return ServerState(weights=clone(model.state_dict()), extra=extra)

    def payload(self, state: ServerState, round_: int, client_id: int = 0) -> Payload:
        c = {"c": state.extra["c"]}  # not the server's sum h_i
        return Payload(round=round_, weights=state.weights, extra=c, client_id=client_id)

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        alpha, w = self.cfg.alpha, payload.weights
        model = self.scratch_model(w)  # theta_i <- w
        params = trainable(model)
        h_i = read(client_state.get("h"), params)
        c = read(payload.extra.get("c"), params)
        c_i = read(client_state.get("c_i"), params)
        correction = {n: c[n] - c_i[n] for n in params}
        target = {n: w[n] - h_i[n] for n in params}  # theta_i + h_i - w = theta_i - (w - h_i)

        def local_objective(m: nn.Module, batch: Batch) -> torch.Tensor:
            # L_i(theta_i) + R: alpha/2 ||theta_i + h_i - w||^2
            penalty = sum(((p - target[n]) ** 2).sum() for n, p in params.items())
            return self.task.loss(m, batch, gen) + alpha / 2 * penalty

        def grad_hook(m: nn.Module) -> None:
            correct_gradients(params, correction)  # G: gradient correction c - c_i

        metrics = local_train(model, data, self.task, self.local, payload.round, gen,
                              loss_fn=local_objective, grad_hook=grad_hook)
        theta_i = clone(model.state_dict())
        dh = {n: theta_i[n] - w[n] for n in params}
        h_new = {n: h_i[n] + dh[n] for n in params}  # local drift update
        c_i_new = option2_control_variate(c_i, c, w, theta_i, metrics["steps"],
                                          self.local.lr_at(payload.round))
        upload = theta_i | {n: theta_i[n] + h_new[n] for n in params}  # theta_i + h_i
        extra = {"dc": {n: c_i_new[n] - c_i[n] for n in params}, "dh": dh}
        update = ClientUpdate(client_id, len(data), upload, extra=extra, metrics=metrics)
        return update, {"h": h_new, "c_i": c_i_new}, metrics

    def aggregate(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        updates = rnd.updates
        check_num_clients(self, updates)
        w_avg = self.average(updates)  # avg (theta_i + h_i)
        extra: dict[str, dict[str, torch.Tensor]] = {}
        if self.cfg.drift_average == "all_clients":
            # avg theta_i + (1/N) sum_{all i} h_i = avg(theta_i + h_i) - avg h_i + (1/N) sum h_i;
            # with theta_i = w + dh_i this is w + avg dh_i + (1/N) sum_{all i} h_i.
            hsum = state.extra["hsum"]
            dh_sum = sum_over_clients(updates, "dh")
            hsum_new = {n: hsum[n] + dh_sum[n] for n in hsum}
            dh_avg = self.average(updates, [u.extra["dh"] for u in updates])
            w_avg |= {n: state.weights[n] + dh_avg[n] + hsum_new[n] / self.num_clients for n in hsum}
            extra["hsum"] = hsum_new
        dc_sum = sum_over_clients(updates, "dc")
        c = state.extra["c"]
        extra["c"] = {n: c[n] + dc_sum[n] / self.num_clients for n in c}
        return ServerState(weights=w_avg, extra=extra, meta=state.meta)

