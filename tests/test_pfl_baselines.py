"""Personalized-FL baselines (Ditto, FedBN, LG-FedAvg, APFL, pFedMe, FedRoD, FedSim/FedAlt, CReFF):
one step of each against hand-computed values on tiny models, and (slow) each through the engine."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fakes import (
    B0,
    DT,
    FULL_BATCH,
    H0,
    LR,
    REGRESSION_CLIENTS,
    MSETask,
    TwoLayer,
    grad_body,
    grad_head,
)
from fakes import two_layer_strategy as make
from torch import nn

from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.algorithms.creff import (
    cosine_distance,
    linear_ce_grads,
    match_features,
    retrain_head,
)
from fedpipe.algorithms.fedrod import weights_seed
from fedpipe.config import ConfigError
from fedpipe.config.fl import FLConfig, LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl import RoundInfo, run_federated
from fedpipe.fl.local import local_train
from fedpipe.fl.state import Payload
from fedpipe.models.classifiers import Classifier
from fedpipe.pipeline.federate import client_evaluator
from fedpipe.rng import torch_generator
from fedpipe.tasks import ClassificationTask

# CReFF's server loops as written before their rewrite: the plain references, kept with their benchmark
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from creff_server import autograd_matching, autograd_retrain  # noqa: E402

CLIENTS = list(REGRESSION_CLIENTS[:2])
BV, HV = torch.tensor([[0.2, 0.1], [-0.3, 0.4]], dtype=DT), torch.tensor([[-0.5, 0.2]], dtype=DT)


def W(B, h):
    return {"body.weight": B, "head.weight": h}


def close(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def step(s, weights, client_state=None, d=CLIENTS[1], round_=0):
    return s.client_update(Payload(round_, weights, client_id=1), client_state or {}, d,
                           torch_generator(0, "t"), 1)


# -- Ditto -------------------------------------------------------------------------------------
def test_ditto_global_step_then_proximal_personal_step():
    lam, d = 0.75, CLIENTS[1]
    s = make("ditto", {"lam": lam})
    update, state, metrics = step(s, W(B0, H0), {"personal": W(BV, HV)})
    close(update.weights["body.weight"], B0 - LR * grad_body(B0, H0, d))  # FedAvg's step on w
    close(update.weights["head.weight"], H0 - LR * grad_head(B0, H0, d))
    # v <- v - eta (grad F(v) + lam (v - w^t))
    close(state["personal"]["body.weight"], BV - LR * (grad_body(BV, HV, d) + lam * (BV - B0)))
    close(state["personal"]["head.weight"], HV - LR * (grad_head(BV, HV, d) + lam * (HV - H0)))
    assert metrics["personal_steps"] == 1
    st = s.init_server(TwoLayer())
    assert s.personalized_model(st, state, d, None)["body.weight"] is state["personal"]["body.weight"]
    assert s.personalized_model(st, {}, d, None) is st.weights  # never selected: the global model


def test_ditto_first_participation_starts_from_the_global_model():
    d = CLIENTS[0]
    _, state, _ = step(make("ditto"), W(B0, H0), None, d)
    close(state["personal"]["body.weight"], B0 - LR * grad_body(B0, H0, d))  # prox term is 0


# -- FedBN -------------------------------------------------------------------------------------
class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.body = nn.Sequential(nn.Linear(2, 3, dtype=DT), nn.BatchNorm1d(3, dtype=DT))
        self.head = nn.Linear(3, 1, dtype=DT)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=DT))

    def forward(self, x):
        return self.head(self.body(x)).squeeze(-1)


def test_fedbn_keeps_batchnorm_on_the_clients_and_averages_the_rest():
    s = make("fedbn", model_fn=BNNet)
    assert s.personal == {"body.1.weight", "body.1.bias", "body.1.running_mean",
                          "body.1.running_var", "body.1.num_batches_tracked"}
    fl = FLConfig(rounds=1, participation=1.0, local=FULL_BATCH, checkpoint_every=10)
    res = run_federated(s, BNNet(), CLIENTS, fl, seed=0, progress=False)
    trained = []
    for cid, d in enumerate(CLIENTS):  # each client: one step of plain SGD from the initial model
        m = BNNet()
        local_train(m, d, MSETask(), FULL_BATCH, 0, torch_generator(0, "client-update", 0, cid))
        trained.append(m.state_dict())
    n = [len(d) for d in CLIENTS]
    init = BNNet().state_dict()
    for k in init:
        if k in s.personal:
            assert torch.equal(res.state.weights[k], init[k])  # the global model keeps initial BN
            for cid in range(2):
                assert torch.equal(res.client_states[cid]["personal"][k], trained[cid][k])
                assert torch.equal(res.personal[cid][k], trained[cid][k])
        else:
            close(res.state.weights[k], (n[0] * trained[0][k] + n[1] * trained[1][k]) / sum(n))
    assert not torch.equal(trained[0]["body.1.running_mean"], trained[1]["body.1.running_mean"])


def test_fedbn_refuses_a_model_without_batchnorm():
    with pytest.raises(ValueError, match="no BatchNorm"):
        _ = make("fedbn").personal


# -- LG-FedAvg ---------------------------------------------------------------------------------
def test_lg_fedavg_keeps_the_body_and_averages_the_head():
    fl = FLConfig(rounds=1, participation=1.0, local=FULL_BATCH, checkpoint_every=10)
    res = run_federated(make("lg_fedavg"), TwoLayer(), CLIENTS, fl, seed=0, progress=False)
    n = torch.tensor([len(d) for d in CLIENTS], dtype=DT)
    heads = [H0 - LR * grad_head(B0, H0, d) for d in CLIENTS]
    close(res.state.weights["head.weight"], (n[0] * heads[0] + n[1] * heads[1]) / n.sum())
    assert torch.equal(res.state.weights["body.weight"], B0)  # no global representation
    for cid, d in enumerate(CLIENTS):
        close(res.client_states[cid]["personal"]["body.weight"], B0 - LR * grad_body(B0, H0, d))
        close(res.personal[cid]["head.weight"], res.state.weights["head.weight"])


def test_lg_fedavg_warmup_rounds_are_fedavg():
    update, state, _ = step(make("lg_fedavg", {"warmup_rounds": 1}), W(B0, H0))
    assert set(update.weights) == {"body.weight", "head.weight"} and state == {}
    update, state, _ = step(make("lg_fedavg", {"warmup_rounds": 1}), W(B0, H0), round_=1)
    assert set(update.weights) == {"head.weight"} and set(state["personal"]) == {"body.weight"}


# -- APFL --------------------------------------------------------------------------------------
def test_apfl_steps_w_and_v_from_the_same_point():
    a, d = 0.3, CLIENTS[1]
    s = make("apfl", {"alpha": a})
    update, state, _ = step(s, W(B0, H0), {"personal": W(BV, HV)})
    close(update.weights["body.weight"], B0 - LR * grad_body(B0, H0, d))
    close(update.weights["head.weight"], H0 - LR * grad_head(B0, H0, d))
    Bm, hm = a * BV + (1 - a) * B0, a * HV + (1 - a) * H0  # v_bar
    v = state["personal"]
    close(v["body.weight"], BV - LR * a * grad_body(Bm, hm, d))
    close(v["head.weight"], HV - LR * a * grad_head(Bm, hm, d))
    glob = s.init_server(TwoLayer())
    pm = s.personalized_model(glob, state, d, None)
    close(pm["body.weight"], a * v["body.weight"] + (1 - a) * B0)


def test_apfl_adaptive_alpha_step():
    a, alr, d = 0.3, 0.7, CLIENTS[1]
    s = make("apfl", {"alpha": a, "adaptive": True, "alpha_lr": alr})
    _, state, metrics = step(s, W(B0, H0), {"personal": W(BV, HV)})
    Bm, hm = a * BV + (1 - a) * B0, a * HV + (1 - a) * H0
    grad_alpha = ((BV - B0) * grad_body(Bm, hm, d)).sum() + ((HV - H0) * grad_head(Bm, hm, d)).sum()
    a1 = min(max(a - alr * float(grad_alpha), 0.0), 1.0)
    assert 0 < a1 < 1 and a1 != a
    close(state["alpha"]["alpha"], torch.tensor(a1, dtype=DT))
    pm = s.personalized_model(s.init_server(TwoLayer()), state, d, None)
    close(pm["head.weight"], a1 * state["personal"]["head.weight"] + (1 - a1) * H0)


# -- pFedMe ------------------------------------------------------------------------------------
def test_pfedme_inner_steps_and_local_update():
    lam, plr, d = 0.5, 0.2, CLIENTS[1]
    s = make("pfedme", {"lam": lam, "inner_steps": 2, "personal_lr": plr})
    update, state, _ = step(s, W(B0, H0))
    B, h = B0, H0  # theta, from w
    for _ in range(2):
        B, h = (B - plr * (grad_body(B, h, d) + lam * (B - B0)),
                h - plr * (grad_head(B, h, d) + lam * (h - H0)))
    close(state["personal"]["body.weight"], B)
    close(state["personal"]["head.weight"], h)
    close(update.weights["body.weight"], B0 - LR * lam * (B0 - B))
    close(update.weights["head.weight"], H0 - LR * lam * (H0 - h))


def test_pfedme_server_step_beta():
    s = make("pfedme", {"beta": 2.0})
    st = s.init_server(TwoLayer())
    ups = [step(s, W(B0, H0), None, d)[0] for d in CLIENTS]
    new = s.aggregate(st, RoundInfo(0, 1, 0, tuple(ups)))
    n = [len(d) for d in CLIENTS]
    avg = (n[0] * ups[0].weights["body.weight"] + n[1] * ups[1].weights["body.weight"]) / sum(n)
    close(new.weights["body.weight"], -1.0 * B0 + 2.0 * avg)


# -- FedRoD ------------------------------------------------------------------------------------
def linear_classifier(c=3):
    """A classifier whose body is Flatten (features z = x) and head W z + b: closed-form gradients."""
    m = Classifier((1, 1, 2), c, nn.Flatten()).double()
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=DT))
    return m


def cls_data(seed, labels):
    g = torch.Generator().manual_seed(seed)
    y = torch.tensor(labels)
    return ClientData(torch.randn(len(y), 1, 1, 2, generator=g, dtype=DT), y)


def ce_grads(logit, z, y):
    """d/dW, d/db of mean CE(logit, y) with logit = W z + b + const."""
    r = (torch.softmax(logit, 1) - F.one_hot(y, logit.shape[1]).to(DT)) / len(y)
    return r.T @ z, r.sum(0)


def test_fedrod_balanced_softmax_then_linear_personal_head():
    d = cls_data(5, [0, 0, 0, 2])  # class 1 absent: log prior -inf
    s = make("fedrod", {"personal_head": "linear"}, model_fn=linear_classifier,
             task=ClassificationTask())
    m = linear_classifier()
    W0, b0 = m.head.weight.detach(), m.head.bias.detach()
    update, state, _ = step(s, dict(m.state_dict()), None, d)
    z = d.x.flatten(1)
    log_prior = torch.log(torch.tensor([3.0, 0.0, 1.0], dtype=DT) / 4)
    gW, gb = ce_grads(z @ W0.T + b0 + log_prior, z, d.y)
    W1, b1 = W0 - LR * gW, b0 - LR * gb
    close(update.weights["head.weight"], W1)
    close(update.weights["head.bias"], b1)
    gP, gp = ce_grads(z @ W1.T + b1, z, d.y)  # p starts at 0: out_g + p(z) = out_g
    close(state["personal"]["linear.weight"], -LR * gP)
    close(state["personal"]["linear.bias"], -LR * gp)
    glob = s.init_server(m)
    pm = s.personalized_model(glob, state, d, None)
    close(pm["head.weight"], W0 - LR * gP)  # W_g + W_i
    close(pm["head.bias"], b0 - LR * gp)


def test_fedrod_hypernetwork_head_is_shared_and_seeded_from_the_model():
    d = cls_data(6, [0, 1, 1, 2, 2, 2])
    s = make("fedrod", model_fn=linear_classifier, task=ClassificationTask())
    st = s.init_server(linear_classifier())
    again = make("fedrod", model_fn=linear_classifier, task=ClassificationTask()).init_server(
        linear_classifier())
    for k, v in st.extra["hypernet"].items():
        assert torch.equal(v, again.extra["hypernet"][k])
    assert weights_seed(st.weights) == weights_seed(dict(linear_classifier().state_dict()))
    h = st.extra["hypernet"]
    pi = torch.tensor([1, 2, 3], dtype=DT) / 6
    Wi = (F.relu(pi @ h["hyper.net.0.weight"].T + h["hyper.net.0.bias"]) @ h["hyper.net.2.weight"].T
          + h["hyper.net.2.bias"]).view(3, 2)
    pm = s.personalized_model(st, {}, d, None)
    close(pm["head.weight"], st.weights["head.weight"] + Wi)
    close(pm["head.bias"], st.weights["head.bias"])  # the hypernetwork gives no bias
    update, state, _ = s.client_update(s.payload(st, 0, 1), {}, d, torch_generator(0, "t"), 1)
    assert state == {} and set(update.extra["hypernet"]) == set(h)
    assert not torch.equal(update.extra["hypernet"]["hyper.net.2.weight"], h["hyper.net.2.weight"])
    new = s.aggregate(st, RoundInfo(0, 1, 0, (update,)))
    assert torch.equal(new.extra["hypernet"]["hyper.net.2.weight"],
                       update.extra["hypernet"]["hyper.net.2.weight"])


# -- FedSim / FedAlt ---------------------------------------------------------------------------
def test_fedalt_trains_the_personal_part_then_the_shared_part():
    d = CLIENTS[1]
    s = make("fedalt", {"part": "output"}, LocalTrainConfig(epochs=1, batch_size=64, lr=LR))
    update, state, m = step(s, W(B0, H0), {"personal": {"head.weight": HV}}, d)
    h1 = HV - LR * grad_head(B0, HV, d)  # v, u fixed
    close(state["personal"]["head.weight"], h1)
    close(update.weights["body.weight"], B0 - LR * grad_body(B0, h1, d))  # u, v fixed
    assert set(update.weights) == {"body.weight"} and m["personal_steps"] == 1


def test_fedsim_updates_both_parts_simultaneously():
    d = CLIENTS[1]
    update, state, _ = step(make("fedsim", {"part": "input"}), W(B0, H0), {}, d)
    close(state["personal"]["body.weight"], B0 - LR * grad_body(B0, H0, d))  # the input layer
    close(update.weights["head.weight"], H0 - LR * grad_head(B0, H0, d))
    assert set(update.weights) == {"head.weight"}


class WithAdapter(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(2, 2, dtype=DT))
        self.body.adapter1 = nn.Linear(2, 2, bias=False, dtype=DT)
        self.head = nn.Linear(2, 1, dtype=DT)

    def forward(self, x):
        z = self.body[0](x)
        return self.head(z + self.body.adapter1(z)).squeeze(-1)


def test_partial_split_is_a_config_option_for_adapters():
    assert make("fedsim", {"part": "adapter"}, model_fn=WithAdapter).personal == {
        "body.adapter1.weight"}
    assert make("fedalt", {"part": "modules", "modules": ["body.0"]},
                model_fn=WithAdapter).personal == {"body.0.weight", "body.0.bias"}
    with pytest.raises(ValueError, match="adapter"):
        _ = make("fedsim", {"part": "adapter"}).personal  # TwoLayer has no adapter
    with pytest.raises(ConfigError):
        algorithm_config("fedsim", {"part": "modules"})


# -- CReFF -------------------------------------------------------------------------------------
def test_creff_real_gradients_matching_and_retraining():
    d = cls_data(7, [0, 0, 2, 2, 2])
    cfg = {"num_features": 2, "feature_epochs": 1, "retrain_epochs": 1, "retrain_batch_size": 64,
           "feature_lr": 0.5, "retrain_lr": 0.3}
    s = make("creff", cfg, model_fn=linear_classifier, task=ClassificationTask(), num_clients=1)
    m = linear_classifier()
    st = s.init_server(m)
    W0, b0 = m.head.weight.detach(), m.head.bias.detach()
    update, cstate, _ = s.client_update(s.payload(st, 0, 0), {}, d, torch_generator(0, "t"), 0)
    z = d.x.flatten(1)
    real = torch.zeros(3, 3, 2, dtype=DT)
    for c in (0, 2):  # batch_real 64 > the class's samples: all of them
        zc = z[d.y == c]
        real[c] = ce_grads(zc @ W0.T + b0, zc, d.y[d.y == c])[0]
    close(update.extra["creff"]["grads"], real)
    assert update.extra["creff"]["counts"].tolist() == [2.0, 0.0, 3.0]
    rnd = RoundInfo(0, 1, 9, (update,))
    new = s.server_update(s.aggregate(st, rnd), rnd)
    # the features: F0 ~ N(0, 1) from (seed, "creff-features", round), one matching step
    F0 = torch.randn(6, 2, generator=rnd.generator("creff-features"), dtype=DT).requires_grad_(True)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    loss = 0
    for c in (0, 2):  # only classes some client owns
        fc = F0[labels == c]
        g_syn = ce_grads(fc @ W0.T + b0, fc, labels[labels == c])[0]
        cos = (g_syn * real[c]).sum(1) / (g_syn.norm(dim=1) * real[c].norm(dim=1) + 1e-6)
        loss = loss + (1 - cos).sum()  # the code's 'ours' distance (distance_wb)
    loss.backward()
    F1 = (F0 - 0.5 * F0.grad).detach()
    close(new.extra["features"]["x"], F1)
    gW, gb = ce_grads(F1 @ W0.T + b0, F1, labels)  # one full-batch epoch from the initial head
    close(new.weights["head.weight"], W0 - 0.3 * gW)
    close(new.weights["head.bias"], b0 - 0.3 * gb)
    # clients keep training the FedAvg model; its head travels in the payload
    assert torch.equal(s.payload(new, 1, 0).weights["head.weight"], update.weights["head.weight"])
    assert cstate["local_model"] is update.weights
    assert s.personalized_model(new, cstate, d, None) is update.weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [False, True])
def test_creff_retraining_is_bit_for_bit_the_autograd_sgd_loop(dtype, bias):
    """``retrain_head`` (the gradient of a linear classifier's CE written out) gives exactly the
    weights of autograd + torch.optim.SGD, at the smoke study's shapes (10 classes x 100 features of
    48, batch 32: a last batch of 8), bias-free like cnn_fednh's head or with a bias."""
    g = torch.Generator().manual_seed(3)
    c, n, d = 10, 100, 48
    feats = torch.randn(c * n, d, generator=g, dtype=dtype)
    labels = torch.arange(c).repeat_interleave(n)
    head = {"head.weight": 0.1 * torch.randn(c, d, generator=g, dtype=dtype)}
    if bias:
        head["head.bias"] = 0.1 * torch.randn(c, generator=g, dtype=dtype)
    before = {k: v.clone() for k, v in head.items()}
    want = autograd_retrain(head, feats, labels, 6, 32, 0.01, torch.Generator().manual_seed(9))
    got = retrain_head(head, feats, labels, 6, 32, 0.01, torch.Generator().manual_seed(9))
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == dtype and not torch.equal(got[k], before[k])  # it trained
        assert torch.equal(got[k], want[k]), (k, (got[k] - want[k]).abs().max())
        assert torch.equal(head[k], before[k])  # the server state's head is left as it was


@pytest.mark.parametrize("bias", [False, True])
def test_creff_matching_is_bit_for_bit_the_autograd_loop(bias):
    """``match_features`` gives exactly the features of the autograd loop it replaced
    (``autograd.grad(create_graph=True)``, torch.optim.SGD), over all classes and over a few."""
    g = torch.Generator().manual_seed(4)
    c, n, d = 10, 100, 48
    feats = torch.randn(c * n, d, generator=g)
    labels = torch.arange(c).repeat_interleave(n)
    head = {"head.weight": 0.1 * torch.randn(c, d, generator=g)}
    if bias:
        head["head.bias"] = 0.1 * torch.randn(c, generator=g)
    real = 0.01 * torch.randn(c, c, d, generator=g)
    for owned in (list(range(c)), [0, 3, 7]):
        want = autograd_matching(feats, labels, owned, head, real, 4, 0.5)
        got = match_features(feats, labels, owned, head, real, 4, 0.5)
        assert not torch.equal(got, feats) and torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [False, True])
def test_creff_linear_ce_grads_and_their_feature_gradient_are_autograds(dtype, bias):
    """``linear_ce_grads`` gives autograd's gradient of CE(x W^T + b, y), and the gradient of the
    feature-matching distance through it (d/dF of D(grad_W, g_real)) is what autograd's
    create_graph=True gives, bit for bit, at the smoke study's shapes (100 features of 48)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(100, 48, generator=g, dtype=dtype)
    y = torch.randint(0, 10, (100,), generator=g)
    w = 0.1 * torch.randn(10, 48, generator=g, dtype=dtype)
    b = 0.1 * torch.randn(10, generator=g, dtype=dtype) if bias else None
    real = 0.01 * torch.randn(10, 48, generator=g, dtype=dtype)
    total = torch.tensor(100.0, dtype=dtype)
    xa, wa = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    logits = F.linear(xa, wa, b)
    gz_want, gw_want = torch.autograd.grad(F.cross_entropy(logits, y), (logits, wa),
                                           create_graph=True)
    cosine_distance(gw_want, real).backward()
    xe = x.clone().requires_grad_(True)
    gz, gw = linear_ce_grads(xe, y, w, b, total)
    assert torch.equal(gz, gz_want) and torch.equal(gw, gw_want)
    cosine_distance(gw, real).backward()
    assert xa.grad.abs().sum() > 0 and torch.equal(xe.grad, xa.grad)


@pytest.mark.parametrize(("name", "bad"), [
    ("ditto", {"lam": -1.0}), ("fedbn", {"norm": "group"}), ("lg_fedavg", {"warmup_rounds": -1}),
    ("apfl", {"alpha": 1.5}), ("pfedme", {"inner_steps": 0}), ("fedrod", {"personal_head": "mlp"}),
    ("fedsim", {"part": "everything"}), ("fedalt", {"shared_epochs": 0}), ("creff", {"feature_lr": 0}),
])
def test_invalid_hyperparameters_name_the_key(name, bad):
    with pytest.raises(ConfigError) as err:
        algorithm_config(name, bad)
    assert err.value.key == f"algorithms.{name}.{next(iter(bad))}"


# -- end to end ---------------------------------------------------------------------------------
def bn_classifier():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        body = nn.Sequential(nn.Flatten(), nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU())
        return Classifier((1, 2, 2), 4, body)


def blobs(seed, classes, n, scale=1.0, shift=0.0):
    """``n`` samples cycling through ``classes``: class c at 3 e_c in R^4 plus N(0, 0.25 I) noise,
    then ``scale * x + shift`` (a client's feature shift), as (1, 2, 2) images."""
    g = torch.Generator().manual_seed(seed)
    y = torch.tensor(classes).repeat(n // len(classes))
    x = 3 * torch.eye(4)[y] + 0.5 * torch.randn(len(y), 4, generator=g)
    return ClientData((scale * x + shift).view(-1, 1, 2, 2), y)


LOCAL_E2E = LocalTrainConfig(epochs=2, batch_size=8, lr=0.1)
LABEL_SKEW = [[0, 1], [1, 2], [2, 3], [3, 0]]  # each client holds two of the four classes
FEATURE_SHIFT = [(0.5, -3.0), (1.0, 0.0), (2.0, 3.0), (4.0, 6.0)]  # (scale, shift) per client


def final_run(name, train, tests, cfg=None, participation=0.75, rounds=5):
    """``name`` on the BN classifier, 4 clients, ``rounds`` rounds: (strategy, result)."""
    test_x, test_y = torch.cat([t.x for t in tests]), torch.cat([t.y for t in tests])
    fl = FLConfig(rounds=rounds, participation=participation, local=LOCAL_E2E, checkpoint_every=100)
    s = ALGORITHMS[name](ClassificationTask(), bn_classifier, LOCAL_E2E, algorithm_config(name, cfg),
                         num_clients=4)
    ev = client_evaluator(ClassificationTask(), s.model_of, test_x, test_y, tests, 0)
    res = run_federated(s, bn_classifier(), train, fl, seed=0, evaluate=ev, progress=False)
    assert not s.personalizes or len(res.personal) == 4
    return s, res


def final_row(name, train, tests, cfg=None, participation=0.75, rounds=5):
    """The last history row of ``name`` on the BN classifier: 4 clients, ``rounds`` rounds."""
    return final_run(name, train, tests, cfg, participation, rounds)[1].history[-1]


def own_model_margin(strategy, personal, tests) -> float:
    """Mean over clients k of: client k's own model's accuracy on k's test set, less the mean
    accuracy of the other clients' models on it. 0 for any one model shared by all (and for
    untrained ones); near 1 for models that learned their own clients' classes only."""
    models = {k: strategy.model_of(w).eval() for k, w in personal.items()}
    margins = []
    with torch.no_grad():
        for k, t in enumerate(tests):
            acc = {i: float((m(t.x).argmax(1) == t.y).float().mean()) for i, m in models.items()}
            margins.append(acc[k] - sum(a for i, a in acc.items() if i != k) / (len(acc) - 1))
    return sum(margins) / len(margins)


@pytest.fixture(scope="module")
def label_skew():
    """Pathological label skew: the clients' data, their local test sets, and FedAvg's final row
    (its global model on each client's test set: ``test_client_mean``)."""
    train = [blobs(k, c, 24) for k, c in enumerate(LABEL_SKEW)]
    tests = [blobs(10 + k, c, 20) for k, c in enumerate(LABEL_SKEW)]
    return train, tests, final_row("fedavg", train, tests)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ditto", "apfl", "pfedme", "fedrod", "fedsim", "fedalt"])
def test_personal_models_beat_the_global_fedavg_model_under_label_skew(name, label_skew):
    """The claim these methods share (Ditto, Li et al. 2021, Sec. 5; APFL, Deng et al. 2020, Sec. 5;
    pFedMe, T. Dinh et al. 2020, Sec. 5; FedRoD, Chen & Chao 2022, Table 2; FedSim/FedAlt, Pillutla
    et al. 2022, Sec. 5): under label skew each client's own model is more accurate on its own
    distribution than the one global FedAvg model. Asserted with a margin of 0.1 accuracy after
    the same 5 rounds (measured on this data: FedAvg 0.84, each of these 1.0)."""
    train, tests, fedavg = label_skew
    personal = final_row(name, train, tests)["test_personal_mean"]
    assert personal >= fedavg["test_client_mean"] + 0.1, (name, personal, fedavg)


@pytest.mark.slow
def test_fedbn_beats_fedavg_under_feature_shift():
    """FedBN's claim (Li et al., ICLR 2021, Sec. 5, Table 1): with clients whose features are shifted
    (here each client scales and shifts its inputs: ``FEATURE_SHIFT``), local BatchNorm statistics
    make the clients' models more accurate on their own data than FedAvg's global model. Margin 0.2
    (measured: FedAvg 0.575, FedBN 0.925)."""
    train = [blobs(k, [0, 1, 2, 3], 24, *FEATURE_SHIFT[k]) for k in range(4)]
    tests = [blobs(10 + k, [0, 1, 2, 3], 20, *FEATURE_SHIFT[k]) for k in range(4)]
    fedavg = final_row("fedavg", train, tests, participation=1.0)["test_client_mean"]
    fedbn = final_row("fedbn", train, tests, participation=1.0)["test_personal_mean"]
    assert fedbn >= fedavg + 0.2, (fedbn, fedavg)


@pytest.mark.slow
@pytest.mark.parametrize("name, cfg, min_margin", [
    ("lg_fedavg", None, 0.03),  # measured 0.058: its head is global, only the body is its own
    ("creff", {"retrain_epochs": 30, "feature_epochs": 20}, 0.25),  # measured 0.363: its whole model
])
def test_methods_whose_claim_is_elsewhere_run_end_to_end_and_learn(name, cfg, min_margin,
                                                                    label_skew):
    """LG-FedAvg's and CReFF's claims are not about this data (CReFF's is its global model on
    long-tailed data; LG-FedAvg's margin over FedAvg was not shown here, docs/papers/baselines.md):
    end to end, each client's model learns its two classes (a guess among the four classes: 1/4),
    and is its own: on a client's test set it beats the other clients' models on average
    (``own_model_margin``; a model shared by all, FedAvg's, scores exactly 0). CReFF's personal
    model is the client's whole local model; LG-FedAvg's shares the global head, which knows all four
    classes, so its margin is small (its own body only)."""
    train, tests, _ = label_skew
    s, res = final_run(name, train, tests, cfg)
    personal = res.history[-1]["test_personal_mean"]
    assert math.isfinite(personal) and personal >= 0.7, (name, personal)
    margin = own_model_margin(s, res.personal, tests)
    assert margin >= min_margin, (name, margin)
    shared = {k: res.state.weights for k in res.personal}  # the same model for every client
    assert abs(own_model_margin(s, shared, tests)) < 1e-9
