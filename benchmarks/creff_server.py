"""CReFF's server step per round, before and after its rewrite (fedpipe.algorithms.creff): the
gradient matching (``feature_epochs`` steps on the federated features) and the classifier
re-training (``retrain_epochs`` epochs of minibatch SGD), each as written before (autograd and
torch.optim.SGD at every step: :func:`autograd_matching`, :func:`autograd_retrain`, kept here as
the plain reference that tests/test_pfl_baselines.py also checks against) and as now
(:func:`~fedpipe.algorithms.creff.match_features`, :func:`~fedpipe.algorithms.creff.retrain_head`),
on the same inputs, in one process, interleaved; CPU time (``time.process_time``), one torch thread.

Checks that both give the same tensors bit for bit, then prints per part the CPU seconds per round
(median over repeats) and the ratio old / new. Inputs at fednh_smoke's sizes and CReFF's defaults:
10 classes x 100 features of 48 (cnn_fednh's smoke width), every class owned, 100 matching steps,
300 re-training epochs of batch 32.

    python benchmarks/creff_server.py [--repeats 3] [--feature-epochs 100] [--retrain-epochs 300]

Measured on the shared 2-core CPU (loaded by other jobs, niced), --repeats 3: matching 0.361 ->
0.281 CPU s/round (x1.28), re-training 1.203 -> 0.292 CPU s/round (x4.12), both bit for bit.

``--quick``: 1 repeat of 2 matching steps and 2 re-training epochs (the bit-for-bit checks still run).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from fedpipe.algorithms.creff import cosine_distance, match_features, retrain_head

CLASSES, FEATURES, DIM = 10, 100, 48


def autograd_matching(feats, labels, owned, head, real, epochs, lr):
    """The gradient matching as written before: g_syn by ``autograd.grad(create_graph=True)`` at
    a head that requires grad, torch.optim.SGD on the features."""
    feats = feats.detach().clone().requires_grad_(True)
    opt = torch.optim.SGD([feats], lr=lr)
    w = head["head.weight"].clone().requires_grad_(True)
    b = head.get("head.bias")
    for _ in range(epochs):
        loss = feats.new_zeros(())
        for cls in owned:
            fc = feats[labels == cls]
            out = F.linear(fc, w, b)
            g_syn = torch.autograd.grad(F.cross_entropy(out, labels[labels == cls]), w,
                                        create_graph=True)[0]
            loss = loss + cosine_distance(g_syn, real[cls])
        opt.zero_grad(set_to_none=True)
        if owned:
            loss.backward()
            opt.step()
    return feats.detach()


def autograd_retrain(head, feats, labels, epochs, batch_size, lr, gen):
    """The classifier re-training as written before: autograd and torch.optim.SGD, one step per
    minibatch."""
    head = {k: v.clone().requires_grad_(True) for k, v in head.items()}
    opt = torch.optim.SGD(list(head.values()), lr=lr)
    for _ in range(epochs):
        order = torch.randperm(len(labels), generator=gen)
        for s in range(0, len(order), batch_size):
            i = order[s:s + batch_size]
            opt.zero_grad(set_to_none=True)
            logits = F.linear(feats[i], head["head.weight"], head.get("head.bias"))
            F.cross_entropy(logits, labels[i]).backward()
            opt.step()
    return {k: v.detach() for k, v in head.items()}


def inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(CLASSES * FEATURES, DIM, generator=g)
    labels = torch.arange(CLASSES).repeat_interleave(FEATURES)
    head = {"head.weight": 0.1 * torch.randn(CLASSES, DIM, generator=g)}
    real = 0.01 * torch.randn(CLASSES, CLASSES, DIM, generator=g)
    return feats, labels, head, real


def timed(fn, *args):
    t = time.process_time()
    out = fn(*args)
    return time.process_time() - t, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--feature-epochs", type=int, default=100)
    ap.add_argument("--retrain-epochs", type=int, default=300)
    ap.add_argument("--quick", action="store_true", help="1 repeat, 2 matching steps, 2 epochs")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.feature_epochs, args.retrain_epochs = 1, 2, 2
    torch.set_num_threads(1)
    feats, labels, head, real = inputs()
    owned = list(range(CLASSES))
    times: dict[str, list[float]] = {k: [] for k in ("match_old", "match_new", "re_old", "re_new")}
    for _ in range(args.repeats + 1):  # the first pass warms up (lazy imports), not counted
        t_mo, f_old = timed(autograd_matching, feats, labels, owned, head, real,
                            args.feature_epochs, 0.01)
        t_mn, f_new = timed(match_features, feats, labels, owned, head, real,
                            args.feature_epochs, 0.01)
        t_ro, h_old = timed(autograd_retrain, head, f_old, labels, args.retrain_epochs, 32, 0.01,
                            torch.Generator().manual_seed(1))
        t_rn, h_new = timed(retrain_head, head, f_new, labels, args.retrain_epochs, 32, 0.01,
                            torch.Generator().manual_seed(1))
        assert torch.equal(f_old, f_new), "matching: not bit for bit"
        assert torch.equal(h_old["head.weight"], h_new["head.weight"]), "re-training: not bit for bit"
        for k, v in zip(times, (t_mo, t_mn, t_ro, t_rn), strict=True):
            times[k].append(v)
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    for part, old, new in (("matching", "match_old", "match_new"), ("re-training", "re_old", "re_new")):
        print(f"{part}: {med[old]:.3f} -> {med[new]:.3f} CPU s/round (x{med[old] / med[new]:.2f}), "
              "bit for bit")


if __name__ == "__main__":
    main()
