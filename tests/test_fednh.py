"""FedNH (prototype head, client class sums, server Eq. 4), FedBABU (frozen head, fine-tuning) and
FedProto (prototype-regularised local training, nearest-prototype prediction), and FedAvg's
latest-local-model PM: one step each against hand-computed values on a tiny model."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.algorithms.fedavg import LOCAL_MODEL
from fedpipe.algorithms.fednh import FedNH, prototype_update
from fedpipe.algorithms.fedproto import FedProto, aggregate_prototypes
from fedpipe.config import ConfigError
from fedpipe.config.fl import FLConfig, LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl import RoundInfo, run_federated
from fedpipe.models import build_model
from fedpipe.models.prototype import PrototypeHead, etf_prototypes, orthogonal_prototypes
from fedpipe.tasks import ClassificationTask

LR = 0.1
ONE_STEP = LocalTrainConfig(steps=1, batch_size=64, lr=LR)
B0 = torch.tensor([[0.5, -0.2], [0.1, 0.3], [0.4, 0.2]])  # body (3 x 2)
H0 = torch.tensor([[0.3, -0.1, 0.2], [-0.4, 0.5, 0.1], [0.2, 0.2, -0.3]])  # linear head (3 x 3)
W0 = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])  # prototypes (C=3, d=3)


class Tiny(nn.Module):
    """features(x) = B x (d = 3), head = Linear(3, 3) without bias."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(2, 3, bias=False)
        self.head = nn.Linear(3, 3, bias=False)
        with torch.no_grad():
            self.body.weight.copy_(B0)
            self.head.weight.copy_(H0)

    def features(self, x):
        return self.body(x)

    def forward(self, x):
        return self.head(self.features(x))


def client(seed: int, labels: list[int]) -> ClientData:
    g = torch.Generator().manual_seed(seed)
    return ClientData(torch.randn(len(labels), 2, generator=g), torch.tensor(labels))


CLIENTS = [client(1, [0, 0, 1]), client(2, [1, 1, 0, 0]), client(3, [0, 1])]


N_CLIENTS = len(CLIENTS)


def make(name: str, cfg=None, local=ONE_STEP, n=N_CLIENTS):
    cls = ALGORITHMS[name]
    acfg = algorithm_config(name, cfg)

    def model_fn():
        with torch.random.fork_rng():  # as pipeline.common.make_model: a seeded model-init
            torch.manual_seed(0)
            m = cls.adapt_model(Tiny(), acfg)
        if name == "fednh":
            with torch.no_grad():
                m.head.weight.copy_(W0)
        return m

    return cls(ClassificationTask(), model_fn, local, acfg, aggregation="uniform", num_clients=n)


def close(a, b, tol=1e-6):
    return torch.allclose(a, b, atol=tol, rtol=0)


# -- the prototype head ------------------------------------------------------------------------
def test_prototype_inits_are_unit_rows_with_the_stated_angles():
    torch.manual_seed(0)
    w = orthogonal_prototypes(10, 192)
    assert close(w.norm(dim=1), torch.ones(10), 1e-5)
    assert close(w @ w.T, torch.eye(10), 1e-5)  # orthonormal: cosine 0, M^2 = 2
    e = etf_prototypes(10, 48)
    assert close(e.norm(dim=1), torch.ones(10), 1e-5)
    off = (e @ e.T)[~torch.eye(10, dtype=torch.bool)]
    assert close(off, torch.full_like(off, -1 / 9), 1e-5)  # simplex ETF: -1/(C-1)
    with pytest.raises(ValueError, match="dimension"):
        etf_prototypes(10, 5)


def test_prototype_head_logits_are_scaled_cosines():
    head = PrototypeHead(3, 3, scale=2.0)
    with torch.no_grad():
        head.weight.copy_(W0)
    z = torch.tensor([[3.0, 4.0, 0.0]])
    assert close(head(z), torch.tensor([[2 * 0.6, 2 * 0.8, 0.0]]))
    assert not head.weight.requires_grad and head.scale.requires_grad


def test_fednh_builds_on_registered_classifiers_with_the_code_scales():
    cfg = algorithm_config("fednh", None)
    cnn = FedNH.adapt_model(build_model("cnn_fednh", (1, 8, 8), 10, channels=4, hidden=(16, 12)), cfg)
    assert isinstance(cnn.head, PrototypeHead) and cnn.head.scale.item() == 1.0
    assert cnn(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    res = FedNH.adapt_model(build_model("resnet18", (1, 8, 8), 10, norm="group"), cfg)
    assert res.head.scale.item() == 20.0 and res.head.weight.shape == (10, 512)
    etf = FedNH.adapt_model(build_model("mlp", (1, 8, 8), 10, hidden=16),
                            algorithm_config("fednh", {"init": "etf", "scale": 5.0}))
    assert etf.head.scale.item() == 5.0
    assert close((etf.head.weight @ etf.head.weight.T)[0, 1], torch.tensor(-1 / 9), 1e-5)


@pytest.mark.parametrize("key,value", [("rho", 1.0), ("init", "random"), ("scale", 0.0),
                                       ("aggregation", "mean")])
def test_bad_fednh_config_is_one_config_error(key, value):
    with pytest.raises(ConfigError, match=f"algorithms.fednh.{key}"):
        algorithm_config("fednh", {key: value})


# -- FedNH: client step, class sums, server Eq. 4 ------------------------------------------------
def fednh_loss(B, s, d: ClientData):
    """Eq. 2, written out: CE(s * normalize(B x) W0^T, y)."""
    z = d.x @ B.T
    z = z / z.norm(dim=1, keepdim=True)
    return F.cross_entropy(s * z @ W0.T, d.y)


def test_fednh_client_trains_body_and_scale_with_frozen_prototypes_and_uploads_class_sums():
    s = make("fednh", {"scale": 1.5})
    d = CLIENTS[1]
    start = s.init_server(s.model_fn())
    B = B0.clone().requires_grad_(True)
    sc = torch.tensor(1.5, requires_grad=True)
    gB, gs = torch.autograd.grad(fednh_loss(B, sc, d), (B, sc))
    B1, s1 = B0 - LR * gB, 1.5 - LR * gs
    upd, cstate, _ = s.client_update(s.payload(start, 0, 1), {}, d, torch.Generator().manual_seed(0), 1)
    assert "head.weight" not in upd.weights  # the prototypes are the server's
    assert close(upd.weights["body.weight"], B1) and close(upd.weights["head.scale"], s1)
    z = F.normalize(d.x @ B1.T, dim=1)
    sums = torch.stack([z[d.y == c].sum(0) for c in range(3)])
    assert close(upd.extra["prototypes"]["sum"], sums)
    assert upd.extra["prototypes"]["count"].tolist() == [2.0, 2.0, 0.0]
    # the personalized model: the local model with the prototypes it received
    local = cstate[LOCAL_MODEL]
    assert close(local["head.weight"], W0) and close(local["body.weight"], B1)


def test_prototype_update_code_and_paper_versions_by_hand():
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    sums = [torch.tensor([[3.0, 4.0], [0.0, 2.0], [0.0, 0.0]]),
            torch.tensor([[0.0, 3.0], [0.0, 0.0], [0.0, 0.0]])]
    counts = [torch.tensor([5.0, 2.0, 0.0]), torch.tensor([3.0, 0.0, 0.0])]

    def unit(x, y):
        n = math.hypot(x, y)
        return [x / n, y / n]

    # code: a_0 = normalize((5 (0.6, 0.8) + 3 (0, 1)) / 8) = (3, 7)/sqrt(58); a_1 = (0, 1)
    a0 = unit(3, 7)
    code = prototype_update(w, sums, counts, 0.9, "code")
    assert close(code, torch.tensor([unit(0.9 + 0.1 * a0[0], 0.1 * a0[1]), [0.0, 1.0], [-1.0, 0.0]]))
    # paper (alpha = 1/2): a_0 = ((0.6, 0.8) + (0, 1)) / 2 = (0.3, 0.9); a_1 = ((0, 1) + 0) / 2
    paper = prototype_update(w, sums, counts, 0.9, "paper")
    assert close(paper, torch.tensor([unit(0.93, 0.09), [0.0, 1.0], [-1.0, 0.0]]))


def test_fednh_round_averages_bodies_and_moves_owned_prototypes_only():
    s = make("fednh", {"rho": 0.5})
    fl = FLConfig(rounds=1, participation=1.0, local=ONE_STEP, aggregation="uniform")
    res = run_federated(s, s.model_fn(), CLIENTS, fl, seed=0, progress=False)
    ups = []
    for cid, d in enumerate(CLIENTS):
        s2 = make("fednh", {"rho": 0.5})
        st = s2.init_server(s2.model_fn())
        ups.append(s2.client_update(s2.payload(st, 0, cid), {}, d, torch.Generator(), cid)[0])
    body = sum(u.weights["body.weight"] for u in ups) / 3
    assert close(res.state.weights["body.weight"], body)
    assert close(res.state.weights["head.scale"], sum(u.weights["head.scale"] for u in ups) / 3)
    w = prototype_update(W0, [u.extra["prototypes"]["sum"] for u in ups],
                         [u.extra["prototypes"]["count"] for u in ups], 0.5)
    assert close(res.state.weights["head.weight"], w)
    assert close(w[2], W0[2]) and not close(w[0], W0[0])  # class 2 has no owner
    assert close(res.personal[0]["head.weight"], W0)  # PM: the head the client received


# -- FedAvg's latest local model -----------------------------------------------------------------
def test_fedavg_keeps_the_latest_local_model_only_when_asked():
    assert not make("fedavg").personalizes
    s = make("fedavg", {"keep_local_model": True})
    fl = FLConfig(rounds=1, participation=1.0, local=ONE_STEP, aggregation="uniform")
    res = run_federated(s, s.model_fn(), CLIENTS, fl, seed=0, progress=False)
    d = CLIENTS[2]
    B = B0.clone().requires_grad_(True)
    H = H0.clone().requires_grad_(True)
    gB, gH = torch.autograd.grad(F.cross_entropy(d.x @ B.T @ H.T, d.y), (B, H))
    assert close(res.personal[2]["body.weight"], B0 - LR * gB)
    assert close(res.personal[2]["head.weight"], H0 - LR * gH)


# -- FedBABU -------------------------------------------------------------------------------------
def test_fedbabu_trains_the_body_under_the_frozen_head_and_fine_tunes_everything():
    s = make("fedbabu", {"ft_epochs": 1})
    d = CLIENTS[0]
    start = s.init_server(s.model_fn())
    B = B0.clone().requires_grad_(True)
    gB = torch.autograd.grad(F.cross_entropy(d.x @ B.T @ H0.T, d.y), B)[0]
    B1 = B0 - LR * gB
    upd, cstate, _ = s.client_update(s.payload(start, 0, 0), {}, d, torch.Generator(), 0)
    assert set(upd.weights) == {"body.weight"}  # the head is never uploaded
    assert close(upd.weights["body.weight"], B1) and close(cstate[LOCAL_MODEL]["head.weight"], H0)
    agg = s.aggregate(start, RoundInfo(0, 1, 0, updates=(upd,)))
    assert close(agg.weights["head.weight"], H0)  # GM keeps the initial head
    # fine-tuning: one full-batch epoch on body and head from the latest local model
    one_epoch = LocalTrainConfig(epochs=1, batch_size=64, lr=LR)
    s.local = one_epoch
    B = B1.clone().requires_grad_(True)
    H = H0.clone().requires_grad_(True)
    gB, gH = torch.autograd.grad(F.cross_entropy(d.x @ B.T @ H.T, d.y), (B, H))
    pm = s.personalized_model(agg, cstate, d, torch.Generator(), 0)
    assert close(pm["body.weight"], B1 - LR * gB) and close(pm["head.weight"], H0 - LR * gH)


# -- FedProto ------------------------------------------------------------------------------------
def test_fedproto_step_with_the_prototype_term_and_local_means():
    s = make("fedproto", {"lam": 0.5})
    d = CLIENTS[1]
    start = s.init_server(s.model_fn())
    P = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    start.weights["head.prototypes"] = P
    B = B0.clone().requires_grad_(True)
    H = H0.clone().requires_grad_(True)
    z = d.x @ B.T
    loss = F.cross_entropy(z @ H.T, d.y) + 0.5 * ((z - P[d.y]) ** 2).mean()
    gB, gH = torch.autograd.grad(loss, (B, H))
    upd, cstate, _ = s.client_update(s.payload(start, 0, 1), {}, d, torch.Generator(), 1)
    assert upd.weights == {}  # no model is shared
    own = cstate["personal"]
    assert close(own["body.weight"], B0 - LR * gB) and close(own["head.linear.weight"], H0 - LR * gH)
    assert "head.prototypes" not in own
    z0 = (d.x @ B0.T).detach()  # the embeddings of the (only) batch, before the step
    means = torch.stack([z0[d.y == c].mean(0) for c in (0, 1)])
    assert close(upd.extra["prototypes"]["mean"][:2], means)
    assert upd.extra["prototypes"]["owned"].tolist() == [True, True, False]
    # the personalized model predicts the nearest global prototype
    pm = s.personalized_model(start, cstate, d, torch.Generator(), 1)
    model = s.model_of(pm)
    feats = d.x @ own["body.weight"].T
    assert torch.equal(model(d.x).argmax(1), torch.cdist(feats, P).argmin(1))


def test_fedproto_server_means_over_owners_only():
    old = torch.zeros(3, 2)
    means = [torch.tensor([[1.0, 1.0], [2.0, 0.0], [9.0, 9.0]]),
             torch.tensor([[3.0, -1.0], [7.0, 7.0], [9.0, 9.0]])]
    owned = [torch.tensor([True, True, False]), torch.tensor([True, False, False])]
    assert close(aggregate_prototypes(old, means, owned),
                 torch.tensor([[2.0, 0.0], [2.0, 0.0], [0.0, 0.0]]))
    assert FedProto.adapt_model(Tiny(), algorithm_config("fedproto", None)).head.prototypes.shape == (3, 3)
