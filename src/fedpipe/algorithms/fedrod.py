"""FedRoD (Chen and Chao, ICLR 2022, "On Bridging Generic and Personalized Federated Learning for Image
Classification"; a FedNH baseline, §4.1 and App. A.2).

The model is a shared body f_theta with two heads on its features z = f_theta(x): a generic head g
(shared) and a personalized head p_i. Client i in round t:

    1. (theta, g) <- SGD on the balanced-softmax loss for the local epochs (Eq. 4, [code]):
           L_BSM = CE(g(z) + log pi_i, y),   pi_i(c) = n_{i,c} / n_i   (its class counts)
       (log pi_i = -inf for a class the client lacks: that logit gets probability 0);
    2. p_i <- SGD on CE(g(z) + p_i(z), y) with the body and g fixed (z and g(z) detached;
       ``FedROD_phead_separate: True`` [code]) for the head epochs;
    3. upload (theta, g) (and the hypernetwork, below); the server averages them (FedAvg).

Prediction: generic g(z) (the global model), personalized g(z) + p_i(z) [code]. Both heads are linear
on the same z, so the personalized model is one classifier whose head is the sum of the two
(W_g + W_i, b_g + b_i): it is stored and evaluated as an ordinary model of the registry.

``personal_head``:
- ``hypernetwork`` (the paper's and FedNH's choice for the CNN): W_i = H(pi_i), reshaped (C, d), with
  H = Linear(C -> hidden) -> ReLU -> Linear(hidden -> d C) [code], hidden = d by default. H is shared:
  clients train it in step 2 on their own pi_i and the server averages it with the body. Its initial
  weights are torch's default initialisers drawn from the stream (seed', "fedrod-hypernet"), where seed'
  is derived from the model's initial weights (themselves from the run's (seed, "model-init")
  stream): ``init_server`` is not given the run seed. p_i has no bias;
- ``linear`` (FedNH's choice for ResNet-18): p_i is a per-client linear layer, zero at the start (the
  personalized model starts as the generic one; inferred), kept in the client's state, with a bias when
  the model's head has one.

Head epochs: the client's ``fl.local`` epochs unless ``head_epochs`` is set (FedNH's code trains the
personalized head for the same number of epochs). Needs a classifier of the registry (``features``
and a linear ``head``).

Against FedNH's official code (docs/papers/fednh.md): equal to 2.5e-14 in float64 at momentum 0. The
code trains p_i with plain SGD (no momentum, weight decay or clipping), fedpipe with ``fl.local``'s
optimizer (0.024 on the hypernetwork after 2 test rounds at momentum 0.9); the code views the
hypernetwork's output as (d, C), fedpipe as (C, d) (a permutation of its last layer's rows).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from fedpipe.algorithms.registry import register
from fedpipe.config.core import check, one_of
from fedpipe.data import ClientData
from fedpipe.fl.local import local_train
from fedpipe.fl.state import ClientUpdate, Payload, ServerState, Weights, clone
from fedpipe.fl.strategy import ClientState, RoundInfo, Strategy
from fedpipe.rng import torch_seed
from fedpipe.tasks import Batch

HEADS = ("hypernetwork", "linear")


@dataclass(frozen=True)
class FedRoDConfig:
    personal_head: str = "hypernetwork"
    """p_i from a shared hypernetwork of the label distribution (FedNH's CNN) or ``linear`` (ResNet)."""
    hyper_hidden: int | None = None
    """Hidden width of the hypernetwork; None = the feature dimension d ([code] Linear(C -> d))."""
    head_epochs: int | None = None
    """Epochs of step 2 (the personalized head); None = the client's ``fl.local`` schedule."""

    def validate(self, p: str) -> None:
        one_of(f"{p}.personal_head", self.personal_head, HEADS)
        check(self.hyper_hidden is None or self.hyper_hidden >= 1, f"{p}.hyper_hidden",
              self.hyper_hidden, "null or an integer >= 1")
        check(self.head_epochs is None or self.head_epochs >= 1, f"{p}.head_epochs",
              self.head_epochs, "null or an integer >= 1")


class HyperNetwork(nn.Module):
    """W_i = reshape(Linear(hidden -> d C)(ReLU(Linear(C -> hidden)(pi_i))), (C, d))."""

    def __init__(self, num_classes: int, feature_dim: int, hidden: int):
        super().__init__()
        self.num_classes, self.feature_dim = num_classes, feature_dim
        self.net = nn.Sequential(nn.Linear(num_classes, hidden), nn.ReLU(),
                                 nn.Linear(hidden, feature_dim * num_classes))

    def forward(self, pi: torch.Tensor) -> torch.Tensor:
        return self.net(pi).view(self.num_classes, self.feature_dim)


class PersonalHead(nn.Module):
    """p_i(z): a linear layer, or the hypernetwork's W_i for the label distribution ``pi``."""

    def __init__(self, head: nn.Linear, hyper: HyperNetwork | None):
        super().__init__()
        self.hyper = hyper
        self.linear = None
        if hyper is None:
            self.linear = nn.Linear(head.in_features, head.out_features, bias=head.bias is not None)
        self.register_buffer("pi", torch.zeros(head.out_features, device=head.weight.device),
                             persistent=False)

    def weight_bias(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.hyper is not None:
            return self.hyper(self.pi), None
        return self.linear.weight, self.linear.bias

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        w, b = self.weight_bias()
        return F.linear(z, w, b)


def class_counts(data: ClientData, num_classes: int) -> torch.Tensor:
    return torch.bincount(data.y, minlength=num_classes).to(torch.float32)


def weights_seed(weights: Weights) -> int:
    """A 32-bit integer from the bytes of ``weights`` (name order): a seed derived from the model."""
    h = hashlib.md5()
    for k in sorted(weights):
        h.update(k.encode())
        h.update(weights[k].detach().cpu().contiguous().numpy().tobytes())
    return int.from_bytes(h.digest()[:4], "little")


@register("fedrod")
class FedRoD(Strategy):
    config_class = FedRoDConfig

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._phead: PersonalHead | None = None

    # -- the personalized head -----------------------------------------------------------------
    @property
    def hyper(self) -> bool:
        return self.cfg.personal_head == "hypernetwork"

    def personal_head(self) -> PersonalHead:
        """A working p_i for the scratch model (reused; given new values on each use)."""
        if self._phead is None:
            model = self.scratch_model_instance()
            c, d = model.head.out_features, model.head.in_features
            with torch.random.fork_rng(devices=[]):  # values set later; leave the global RNG be
                hyper = HyperNetwork(c, d, self.cfg.hyper_hidden or d) if self.hyper else None
                self._phead = PersonalHead(model.head, hyper).to(  # where the model is (the
                    device=model.head.weight.device, dtype=model.head.weight.dtype)  # first CUDA run)
        return self._phead

    def load_head(self, values: Weights) -> PersonalHead:
        ph = self.personal_head()
        ph.load_state_dict(values)
        return ph

    def initial_head(self, weights: Weights) -> Weights:
        ph = self.personal_head()
        with torch.no_grad():
            if self.hyper:
                device = ph.pi.device  # init drawn there: its RNG restored after, as the CPU's
                with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                    torch.manual_seed(torch_seed(weights_seed(weights), "fedrod-hypernet"))
                    for m in ph.hyper.net:
                        if isinstance(m, nn.Linear):
                            m.reset_parameters()
            else:
                for p in ph.linear.parameters():
                    p.zero_()
        return clone(ph.state_dict())

    def personal_weights(self, weights: Weights, head: Weights, pi: torch.Tensor) -> Weights:
        """The personalized model as one classifier: head W_g + W_i (and b_g + b_i)."""
        ph = self.load_head(head)
        ph.pi = pi
        with torch.no_grad():
            w, b = ph.weight_bias()
            out = dict(weights)
            out["head.weight"] = weights["head.weight"] + w
            if b is not None and "head.bias" in weights:
                out["head.bias"] = weights["head.bias"] + b
        return out

    # -- hooks ---------------------------------------------------------------------------------
    def init_server(self, model: nn.Module) -> ServerState:
        state = super().init_server(model)
        if self.hyper:
            state.extra["hypernet"] = self.initial_head(state.weights)
        return state

    def payload(self, state: ServerState, round_: int, client_id: int = 0) -> Payload:
        extra = {"hypernet": state.extra["hypernet"]} if self.hyper else {}
        return Payload(round=round_, weights=state.weights, extra=extra, client_id=client_id)

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        model = self.scratch_model(payload.weights)
        counts = class_counts(data, model.head.out_features).to(model.head.weight.dtype)
        log_prior = torch.log(counts / counts.sum())

        def balanced_softmax(m: nn.Module, batch: Batch) -> torch.Tensor:  # step 1, Eq. 4
            x, y = batch
            return F.cross_entropy(m(x) + log_prior, y)

        metrics = local_train(model, data, self.task, self.local, payload.round, gen,
                              loss_fn=balanced_softmax)
        shared = self.scratch_weights()
        # step 2: the personalized head on detached features, body and g fixed
        if self.hyper:
            head0 = payload.extra["hypernet"]
        else:
            head0 = client_state.get("personal") or self.initial_head(shared)
        ph = self.load_head(head0)
        ph.pi = counts / counts.sum()
        model.eval()  # the body is fixed: no dropout, no BatchNorm statistics moved

        def personal_loss(p: nn.Module, batch: Batch) -> torch.Tensor:
            x, y = batch
            with torch.no_grad():
                z = model.features(x)
                out_g = model.head(z)
            return F.cross_entropy(out_g + p(z), y)

        e = self.cfg.head_epochs
        sched = self.local if e is None else replace(self.local, epochs=e, steps=None)
        hm = local_train(ph, data, self.task, sched, payload.round, gen, loss_fn=personal_loss)
        model.train()
        head = clone(ph.state_dict())
        metrics = {**metrics, "head_loss": hm["loss"], "head_steps": hm["steps"]}
        if self.hyper:
            update = ClientUpdate(client_id, len(data), shared, {"hypernet": head}, metrics)
            return update, client_state, metrics
        update = ClientUpdate(client_id, len(data), shared, metrics=metrics)
        return update, {**client_state, "personal": head}, metrics

    def aggregate(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        new = super().aggregate(state, rnd)
        if self.hyper and rnd.updates:
            hyper = self.average(rnd.updates, [u.extra["hypernet"] for u in rnd.updates])
            new = ServerState(new.weights, {**new.extra, "hypernet": hyper}, new.meta)
        return new

    def personalized_model(self, state: ServerState, client_state: ClientState, data: ClientData,
                           gen: torch.Generator, client_id: int = 0) -> Weights | None:
        w = state.weights["head.weight"]
        counts = class_counts(data, w.shape[0]).to(w.dtype)
        if self.hyper:
            head = state.extra["hypernet"]
        elif "personal" in client_state:
            head = client_state["personal"]
        else:
            return state.weights  # p_i = 0 before the client's first round
        pi = counts / counts.sum().clamp_min(1)
        return self.personal_weights(state.weights, head, pi)
