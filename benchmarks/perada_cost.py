"""PerAda's costs (issue 12): bytes a client uploads per round, PerAda against FedAvg on the same
model, and the server's distillation time per round against the clients' local training time of the
same round (both measured here, in one process: the ratio is what to read on a shared machine).

    python benchmarks/perada_cost.py            # ResNet-18 (ImageNet stem) and the smoke resnet8
    python benchmarks/perada_cost.py --quick    # the same, the distillation at a tiny size

Upload: PerAda sends theta_m, its adapter set (adapters, bn1/bn2 BNs, head) with the BN buffers of
those layers; FedAvg sends the whole state dict (parameters and buffers). float32 throughout.

``--quick``: the byte counts as in a full run (they are exact, and cheap); the distillation timing
with 2 clients of 20 samples, 2 KD steps of 16 on 32 images, 1 repeat (its ratio means nothing).
"""

from __future__ import annotations

import argparse
import time

import torch

from fedpipe.algorithms.perada import PerAda, PerAdaConfig
from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl import RoundInfo, ServerData
from fedpipe.models import build_model
from fedpipe.models.adapters import adapter_keys, add_adapters, freeze_backbone
from fedpipe.tasks import ClassificationTask


def nbytes(weights) -> int:
    return sum(t.numel() * t.element_size() for t in weights.values())


def upload_bytes(name: str, shape, **kw) -> None:
    plain = build_model(name, shape, 10, **kw)
    ada = freeze_backbone(add_adapters(build_model(name, shape, 10, **kw)))
    sd = ada.state_dict()
    perada = nbytes({k: sd[k] for k in adapter_keys(ada)})
    fedavg = nbytes(plain.state_dict())
    params = sum(p.numel() for n, p in ada.named_parameters() if p.requires_grad)
    print(f"{name} {kw or ''}: PerAda uploads {perada:,} B ({params:,} parameters + BN buffers), "
          f"FedAvg {fedavg:,} B: ratio {perada / fedavg:.4f}")


def distill_time(clients: int = 4, n_client: int = 100, n_aux: int = 270, steps: int = 50,
                 batch: int = 128, repeats: int = 3) -> None:
    """Smoke scale: resnet8 on 1x8x8, 4 clients per round of ~100 samples, KD 50 x 128 on 270 images."""
    torch.manual_seed(0)
    cfg = PerAdaConfig(kd_steps=steps, kd_batch_size=batch, server_data="holdout")

    def model_fn():
        return PerAda.adapt_model(build_model("resnet8", (1, 8, 8), 10), cfg)

    local = LocalTrainConfig(epochs=1, batch_size=32, lr=0.05)
    s = PerAda(ClassificationTask(), model_fn, local, cfg, num_clients=clients)
    state = s.init_server(model_fn())
    data = [ClientData(torch.rand(n_client, 1, 8, 8), torch.randint(0, 10, (n_client,)))
            for _ in range(clients)]
    aux = ServerData("holdout", ClientData(torch.rand(n_aux, 1, 8, 8), torch.full((n_aux,), -1)),
                     False)
    t_client, t_kd = [], []
    for r in range(repeats):
        t0 = time.perf_counter()
        ups = [s.client_update(s.payload(state, r, c), {}, d, torch.Generator().manual_seed(c),
                               c)[0] for c, d in enumerate(data)]
        t1 = time.perf_counter()
        rnd = RoundInfo(index=r, total=repeats, seed=0, updates=tuple(ups), server_data=aux)
        agg = s.aggregate(state, rnd)
        t2 = time.perf_counter()
        state = s.server_update(agg, rnd)
        t3 = time.perf_counter()
        t_client.append(t1 - t0)
        t_kd.append(t3 - t2)
    c, k = min(t_client), min(t_kd)
    print(f"smoke scale ({clients} clients x {n_client} samples, 1 epoch each for v and theta; KD "
          f"{steps} x {batch} on {n_aux}): clients {c:.3f} s, server distillation {k:.3f} s per "
          f"round: KD / client work = {k / c:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="rounds timed (the fastest is printed)")
    ap.add_argument("--quick", action="store_true", help="the distillation timing at a tiny size")
    args = ap.parse_args()
    torch.set_num_threads(1)
    upload_bytes("resnet18", (3, 32, 32), stem="imagenet")
    upload_bytes("resnet8", (1, 8, 8))
    if args.quick:
        distill_time(clients=2, n_client=20, n_aux=32, steps=2, batch=16, repeats=1)
    else:
        distill_time(repeats=args.repeats)


if __name__ == "__main__":
    main()
