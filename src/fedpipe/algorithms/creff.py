"""CReFF (Shang, Lu, Huang, Chen, Shi, IJCAI 2022, "Federated Learning on Heterogeneous and
Long-Tailed Data via Classifier Re-training with Federated Features"; a FedNH baseline, App. A.2).

Federated learning is FedAvg; on top of it the server learns per-class *federated features* F_c whose
classifier gradients match the clients' real ones, and re-trains a classifier on them for inference.
Round t:

    client k (before its FedAvg local training, with the received model (theta^t, W^t)):
        for each class c it holds, on a random batch of up to ``batch_real`` of its samples of c,
        z = f_{theta^t}(x) and the real gradient  g_{k,c} = grad_W CE(W^t z, c)
        upload g_{k,c} and n_{k,c} with the local model (FedAvg)
    server:
        (theta^{t+1}, W^{t+1}) = FedAvg of the local models (what clients train from next round)
        g_c = sum_k n_{k,c} g_{k,c} / sum_k n_{k,c}                        (classes with an owner)
        F <- F - eta_F grad_F sum_c D(grad_W CE(W^t F_c, c), g_c)   for ``feature_epochs`` steps
        W_re <- W_re - eta_W grad CE(W_re F, labels)                for ``retrain_epochs`` epochs
        the global model for inference is (theta^{t+1}, W_re)

D is the dataset-condensation distance 'ours' ([code] ``dis_metric 'ours'``): sum over the rows
(classes) of the weight gradient of 1 - cos(g_real_row, g_syn_row); bias gradients are not matched
(that metric ignores 1-D tensors). F has ``num_features`` features per class, drawn N(0, 1) at the
first round from the stream (seed, "creff-features") and kept across rounds, as is W_re (from the
initial head). Both lrs are 0.01 (FedNH App. A.2: the official 0.1 for the features "makes the
training unstable"); 100 per class, 100 feature epochs, 300 re-training epochs, batch_real 64 as in
FedNH's code. Inferred (not given): the features use plain SGD (one step per feature epoch, on the sum over
classes), the classifier SGD with ``retrain_batch_size`` 32; the gradient matching uses W^t, the head
the clients computed their gradients at; client gradients are averaged by class counts.

Personalized model: local training is FedAvg's, so PM is FedAvg's (the client's latest local model,
FedNH §4.1), kept in the client's state when ``keep_local_model`` (default true).

Against FedNH's official code (docs/papers/fednh.md): client class gradients, FedAvg and the feature
matching agree to float64 rounding when every owner of a class holds as many samples of it. Kept
apart from the code: gradients taken and matched at W^t (code: the previous round's re-trained
head), count-weighted class gradients (code: uniform over owners), one re-trained classifier carried
across rounds (code: a fresh ``nn.Linear`` each round, its bias dropped afterwards), one real batch
per class (code: the mean of 10 draws; the same when a class has <= ``batch_real`` samples).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedpipe.algorithms.registry import register
from fedpipe.config.core import check
from fedpipe.data import ClientData
from fedpipe.device import generator_on
from fedpipe.fl.local import local_train
from fedpipe.fl.state import ClientUpdate, Payload, ServerState, Weights, clone
from fedpipe.fl.strategy import ClientState, RoundInfo, Strategy

HEAD_KEYS = ("head.weight", "head.bias")


@dataclass(frozen=True)
class CReFFConfig:
    num_features: int = 100
    """Federated features per class (FedNH App. A.2: 100)."""
    feature_epochs: int = 100
    """Gradient-matching steps on the features per round (100)."""
    feature_lr: float = 0.01
    """eta_F (0.01: FedNH's tuned value; official 0.1)."""
    retrain_epochs: int = 300
    """Epochs of classifier re-training on the features per round (300)."""
    retrain_lr: float = 0.01
    """eta_W (0.01)."""
    retrain_batch_size: int = 32
    """Batch size of the re-training (not given; inferred)."""
    batch_real: int = 64
    """Samples per class for a client's real gradient ([code] CReFF_batch_real: 64)."""
    keep_local_model: bool = True
    """Keep each client's latest local model as its personalized model (FedAvg's PM)."""

    def validate(self, p: str) -> None:
        for k in ("num_features", "feature_epochs", "retrain_epochs", "retrain_batch_size",
                  "batch_real"):
            check(getattr(self, k) >= 1, f"{p}.{k}", getattr(self, k), "an integer >= 1")
        for k in ("feature_lr", "retrain_lr"):
            check(getattr(self, k) > 0, f"{p}.{k}", getattr(self, k), "a number > 0")


def cosine_distance(g_syn: torch.Tensor, g_real: torch.Tensor) -> torch.Tensor:
    """'ours' of dataset condensation for a (C, d) weight gradient: sum over rows of
    1 - <a, b> / (||a|| ||b|| + 1e-6), the 1e-6 added to the product of the norms as in the code
    (``distance_wb``; ``F.cosine_similarity`` clamps each norm instead, which moves the features by
    ~1e-5 in three steps when the gradients are small)."""
    dot = (g_syn * g_real).sum(1)
    return (1 - dot / (g_syn.norm(dim=1) * g_real.norm(dim=1) + 1e-6)).sum()


def head_of(weights: Weights) -> Weights:
    return {k: weights[k] for k in HEAD_KEYS if k in weights}


def linear_ce_grads(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                    total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(d loss / d logits, d loss / d W) of loss = CE(x W^T + b, y), the mean over the rows of ``x``
    (``total``: their number, a 0-dim tensor: nll_loss's total_weight without class weights).

    Bit for bit autograd's gradient of ``F.cross_entropy(F.linear(x, w, b), y)``: the same kernels
    autograd runs for it (log_softmax, nll_loss_backward, _log_softmax_backward_data, then its mm
    backward for x @ W^T, W^T being column-major), without building and running a backward graph;
    differentiable in ``x``, with the graph ``autograd.grad(..., create_graph=True)`` records
    (the feature matching differentiates the weight gradient with respect to the features). The
    clients' real gradients, the matched synthetic ones and the re-training all take it. Written
    out by hand: no library gives it; tests/test_pfl_baselines.py checks it and the server loops
    against autograd, bit for bit."""
    aten = torch.ops.aten
    logp = torch.log_softmax(F.linear(x, w, b), 1)
    g = aten.nll_loss_backward(torch.ones_like(total), logp, y, None, 1, -100, total)  # 1: mean
    g = aten._log_softmax_backward_data(g, logp, 1, logp.dtype)
    return g, g.t().mm(x)


def match_features(feats: torch.Tensor, labels: torch.Tensor, owned: list[int], head: Weights,
                   real: torch.Tensor, epochs: int, lr: float) -> torch.Tensor:
    """The gradient matching: ``epochs`` SGD steps (lr ``lr``) on the features ``feats`` (rows
    labelled ``labels``) of sum_c D(grad_W CE(W F_c, c), real[c]) over the ``owned`` classes,
    at the head ``head`` (W^t, and its bias if it has one); returns the new features (no graph)."""
    feats = feats.detach().clone().requires_grad_(True)
    opt = torch.optim.SGD([feats], lr=lr)
    w, b = head["head.weight"].detach(), head.get("head.bias")
    rows = {cls: labels == cls for cls in owned}  # the same every epoch
    totals = {cls: torch.full((), float(rows[cls].sum()), dtype=w.dtype, device=w.device)
              for cls in owned}
    for _ in range(epochs):
        loss = feats.new_zeros(())
        for cls in owned:  # g_syn = grad_W CE(W F_c, c), differentiable in F_c
            g_syn = linear_ce_grads(feats[rows[cls]], labels[rows[cls]], w, b, totals[cls])[1]
            loss = loss + cosine_distance(g_syn, real[cls])
        opt.zero_grad(set_to_none=True)
        if owned:
            loss.backward()
            opt.step()
    return feats.detach()


def retrain_head(head: Weights, feats: torch.Tensor, labels: torch.Tensor, epochs: int,
                 batch_size: int, lr: float, gen: torch.Generator) -> Weights:
    """The classifier re-training on the federated features: ``epochs`` epochs of plain SGD (lr
    ``lr``) on CE(W_re F, labels) over minibatches of ``batch_size`` in a fresh order each epoch
    (``gen``), from ``head`` (``head.weight``, and ``head.bias`` if the head has one); returns the
    trained head, new tensors.

    Bit for bit ``torch.optim.SGD`` on autograd's gradient (:func:`linear_ce_grads`), without a
    graph or an optimizer per step: 9,600 steps a round at the defaults, each a handful of small
    kernels, so the per-step overhead of autograd and the optimizer was most of CReFF's server
    time."""
    w = head["head.weight"].detach().clone()
    b = head["head.bias"].detach().clone() if "head.bias" in head else None
    totals: dict[int, torch.Tensor] = {}  # per batch size (the last batch may be shorter)
    for _ in range(epochs):
        order = torch.randperm(len(labels), generator=gen, device=gen.device)
        xs, ys = feats[order], labels[order]
        for s in range(0, len(order), batch_size):
            x, y = xs[s:s + batch_size], ys[s:s + batch_size]
            if len(y) not in totals:
                totals[len(y)] = torch.full((), float(len(y)), dtype=w.dtype, device=w.device)
            g, gw = linear_ce_grads(x, y, w, b, totals[len(y)])
            if b is not None:
                b.add_(g.sum(0), alpha=-lr)  # autograd's bias gradient: the logits' summed
            w.add_(gw, alpha=-lr)  # SGD's step (no momentum, no decay): p - lr * g
    return {"head.weight": w} | ({} if b is None else {"head.bias": b})


@register("creff")
class CReFF(Strategy):
    config_class = CReFFConfig

    @property
    def personalizes(self) -> bool:
        return self.cfg.keep_local_model

    # -- client --------------------------------------------------------------------------------
    def real_gradients(self, weights: Weights, data: ClientData, gen: torch.Generator
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """(C, C, d) per-class gradients of CE w.r.t. the head weight, and (C,) class counts."""
        model = self.scratch_model(weights)
        model.eval()
        head = model.head
        c, d = head.out_features, head.in_features
        counts = torch.bincount(data.y, minlength=c).to(head.weight.dtype)
        grads = torch.zeros(c, c, d, dtype=head.weight.dtype, device=head.weight.device)
        g = generator_on(gen, head.weight.device)
        for cls in torch.nonzero(counts).flatten().tolist():
            idx = torch.nonzero(data.y == cls).flatten()
            idx = idx[torch.randperm(len(idx), generator=g, device=g.device)[: self.cfg.batch_real]]
            x, y = data.batch(idx, gen)
            with torch.no_grad():
                z = model.features(x)
                total = torch.full((), float(len(y)), dtype=z.dtype, device=z.device)
                grads[cls] = linear_ce_grads(z, y, head.weight, head.bias, total)[1]
        model.train()
        return grads, counts

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        grads, counts = self.real_gradients(payload.weights, data, gen)
        model = self.scratch_model(payload.weights)
        metrics = local_train(model, data, self.task, self.local, payload.round, gen)
        weights = self.scratch_weights()
        if self.cfg.keep_local_model:
            client_state = {**client_state, "local_model": weights}
        update = ClientUpdate(client_id, len(data), weights,
                              {"creff": {"grads": grads, "counts": counts}}, metrics)
        return update, client_state, metrics

    # -- server --------------------------------------------------------------------------------
    def payload(self, state: ServerState, round_: int, client_id: int = 0) -> Payload:
        """The FedAvg model (the re-trained classifier serves inference only)."""
        weights = {**state.weights, **state.extra.get("train_head", {})}
        return Payload(round=round_, weights=weights, client_id=client_id)

    def aggregate(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        if not rnd.updates:
            return state
        sent = head_of({**state.weights, **state.extra.get("train_head", {})})  # W^t
        avg = self.average(rnd.updates)
        extra = {**state.extra, "sent_head": clone(sent), "train_head": clone(head_of(avg))}
        extra.setdefault("retrained_head", clone(head_of(state.weights)))
        return ServerState(weights=avg, extra=extra, meta=state.meta)

    def server_update(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        if not rnd.updates:
            return state
        cfg = self.cfg
        grads = torch.stack([u.extra["creff"]["grads"] for u in rnd.updates])  # (K, C, C, d)
        counts = torch.stack([u.extra["creff"]["counts"] for u in rnd.updates])  # (K, C)
        total = counts.sum(0)
        owned = torch.nonzero(total).flatten().tolist()
        real = (counts[:, :, None, None] * grads).sum(0) / total.clamp_min(1)[:, None, None]
        sent = {k: v.detach() for k, v in state.extra["sent_head"].items()}
        c, d = sent["head.weight"].shape
        feats = state.extra.get("features", {}).get("x")
        if feats is None:  # first round: F ~ N(0, 1)
            g = generator_on(rnd.generator("creff-features"), sent["head.weight"].device)
            feats = torch.randn(c * cfg.num_features, d, generator=g, device=g.device,
                                dtype=sent["head.weight"].dtype)
        labels = torch.arange(c, device=feats.device).repeat_interleave(cfg.num_features)
        feats = match_features(feats, labels, owned, sent, real, cfg.feature_epochs, cfg.feature_lr)
        gen = generator_on(rnd.generator("creff-retrain"), feats.device)
        head = retrain_head(state.extra["retrained_head"], feats, labels, cfg.retrain_epochs,
                            cfg.retrain_batch_size, cfg.retrain_lr, gen)
        extra = {**state.extra, "features": {"x": feats}, "retrained_head": head}
        return ServerState(weights={**state.weights, **clone(head)}, extra=extra, meta=state.meta)

    # -- personalization -----------------------------------------------------------------------
    def personalized_model(self, state: ServerState, client_state: ClientState, data: ClientData,
                           gen: torch.Generator, client_id: int = 0) -> Weights | None:
        if not self.cfg.keep_local_model:
            return None
        return client_state.get("local_model") or state.weights
