"""FID noise: how far the FID of one trained model moves with the sampling seed alone, per sample count.

Loads one model of the federate_ddpm stage (default ``data/federate_ddpm/fedavg/seed_0/model.safetensors``)
with the params of params.yaml (diffusion, fid) and the FID extractor and reference of the
feature_extractor stage (``data/fid/``). For ``k`` sampling seeds (generators
``torch_generator(seed, "fid-noise", i)``, i < k) it draws ``max(--samples)`` images with
``fid.sampler`` and scores the first n of them for every n in ``--samples`` (a prefix of iid samples
is an iid sample, so one draw serves every count; a class-conditional model draws each count
separately, its labels coming sorted by class). Prints, per sample count, the mean and the sample
std of the k FIDs and the std as a fraction of the mean, and writes them to ``--out`` (JSON).

The std is the sampling noise of ONE FID number: every run's final FID carries it on top of the
spread between training seeds. To pick ``fid.num_samples``, run this on a model of the study and take
the smallest count whose std is well below (say a fifth of) the smallest gap the claims table tests
(the mean FID differences of the report's claims, e.g. FedDDPM vs FedAvg); then the claims measure
the models, not the sampler. The mean falls as n grows (FID is biased upward at small n), which
matters less because every arm uses the same n, but compare only FIDs of equal n.

    python benchmarks/fid_noise.py [--model PATH] [--against PATH] [--samples 100,200] [--k 5]
                                   [--seed 0] [--out data/benchmarks/fid_noise.json] [--threads 0]

``--against PATH`` (a second model, e.g. FedDDPM's of the same seed) also draws from it with the SAME
generators, as the pipeline does (the final FID of every algorithm of one training seed uses the
stream ``(seed, "fid-final")``): common random numbers. It prints the std of the paired difference
FID(model) - FID(against) over the k sampling seeds, which is the sampling noise a paired claim sees;
it is smaller than either FID's own std when the two models turn the same noise into similar images.

The defaults (5 x 200 images with 500 DDPM steps) are a quick look that runs in minutes on a CPU
(200 images took 260 s on a 2-core CPU shared with other jobs); to choose ``fid.num_samples`` run
``--samples 200,500,1000,2000,5000`` on a GPU. Measured on one H100 (218 s) for the default study's
FedAvg, seed 0 (its own FID 93.96 on 500 samples), std over 5 sampling seeds: 7.1 FID at 200
samples, 5.9 at 500 (the default ``fid.num_samples``), 3.5 at 1000, 3.2 at 2000 and 1.9 at 5000,
against a FedDDPM - FedAvg gap of 9.7 FID (mean over seeds 0-2): at 500 samples the sampler's noise
is of the order of the gap, at 5000 about a fifth of it.

With ``--against`` on a 2-core CPU (default study, seed 0, FedDDPM against FedAvg, 5 sampling seeds):
DDPM at 500 samples (323 s): difference -15.7, its std 4.7 (each FID's own std 3.9 / 4.6); DDIM
(``fid.sampler: ddim``, 50 steps; ``--params`` a copy of params.yaml with that set, 106 s for 500,
1000 and 2000 samples): difference -4.3 / -3.6 / -3.8 with std 0.82 / 1.25 / 0.57 (each FID's own
std 0.9-1.8). ``fedddpm_smoke`` judges FedDDPM's claims on DDIM FIDs of 2000 samples.

``--quick``: in a temporary directory (every path option relative to it), the FID extractor trained
for one epoch through the feature_extractor stage's function, and two untrained UNets (T = 10) saved
as the model and ``--against``; then 2 sampling seeds of 4 and 8 DDIM samples (2 steps), on the CPU:
it checks that the benchmark runs, its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import numpy as np
import torch
from _ddpm_models import add_model_args, load_models, tiny_models

from fedpipe.io import read_json, write_json
from fedpipe.pipeline.federate_ddpm import sample_images
from fedpipe.rng import torch_generator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(ap)
    ap.add_argument("--against", type=Path, default=None, help="a second model, same generators")
    ap.add_argument("--samples", default="100,200", help="comma-separated sample counts")
    ap.add_argument("--k", type=int, default=5, help="sampling seeds per count (>= 2)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fid-noise generators")
    ap.add_argument("--out", type=Path, default=Path("data/benchmarks/fid_noise.json"))
    ap.add_argument("--quick", action="store_true",
                    help="tiny inputs built in a temporary directory; 2 seeds of 4 and 8 samples")
    args = ap.parse_args()
    if args.quick:
        args.samples, args.k = "4,8", 2
        args.against = args.model.parent.parent.parent / "fedddpm" / "seed_0" / args.model.name
    with quick_inputs(args) if args.quick else contextlib.nullcontext():
        measure(args)


@contextlib.contextmanager
def quick_inputs(args):
    """A temporary working directory with the FID extractor (1 epoch) and two untrained UNets at
    ``args.model`` and ``args.against``."""
    from _quick import note

    with tiny_models((args.model, args.against), args.fid_dir, "bench-fid-noise"):
        note("inputs built in a temporary directory: a 1-epoch FID classifier, two untrained "
             "UNets (T = 10); CPU")
        yield


def measure(args) -> None:
    counts = sorted({int(s) for s in args.samples.split(",") if s.strip()})
    if args.k < 2 or not counts or counts[0] < 2:
        raise SystemExit("error: --k must be >= 2 and every sample count >= 2")
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_models([args.model] + ([args.against] if args.against else []), args.params,
                         args.fid_dir)
    cfg, task, tools, models = loaded.cfg, loaded.task, loaded.tools, loaded.models
    device, class_counts = loaded.device, loaded.class_counts

    fids: list[dict[int, list[float]]] = [{n: [] for n in counts} for _ in models]
    t0 = time.perf_counter()
    for i in range(args.k):
        for m, model in enumerate(models):  # the same generators for both: common random numbers
            if cfg.diffusion.conditional:  # labels come sorted by class: a prefix is not a sample
                draws = {n: sample_images(task, model, n, cfg, class_counts,
                                          torch_generator(args.seed, "fid-noise", i, n, device=device))
                         for n in counts}
            else:
                x = sample_images(task, model, counts[-1], cfg, class_counts,
                                  torch_generator(args.seed, "fid-noise", i, device=device))
                draws = {n: x[:n] for n in counts}
            for n in counts:
                fids[m][n].append(tools.fid.score(draws[n], tools.reference,
                                                  batch_size=cfg.fid.batch_size))
    seconds = time.perf_counter() - t0

    recorded = args.model.parent / "metrics.json"
    run = read_json(recorded) if recorded.is_file() else {}
    print(f"{args.model}: FID noise over {args.k} sampling seeds ({tools.fid.name}, {cfg.fid.sampler} "
          f"sampler, {device}, {seconds:.0f} s); the run's own FID: {run.get('fid')} on "
          f"{run.get('fid_samples')} samples")
    print(f"{'samples':>8} {'mean':>9} {'std':>8} {'std/mean':>9}  FIDs")
    per_count = {}
    for n in counts:
        a = np.asarray(fids[0][n])
        mean, std = float(a.mean()), float(a.std(ddof=1))
        per_count[str(n)] = {"fids": fids[0][n], "mean": mean, "std": std}
        print(f"{n:>8} {mean:>9.3f} {std:>8.3f} {std / mean:>9.2%}  "
              + " ".join(f"{f:.2f}" for f in fids[0][n]))
    if args.against:
        print(f"paired with {args.against} (same generators): FID(model) - FID(against)")
        print(f"{'samples':>8} {'std(b)':>8} {'diff':>9} {'std':>8}  differences")
        for n in counts:
            b, d = np.asarray(fids[1][n]), np.asarray(fids[0][n]) - np.asarray(fids[1][n])
            per_count[str(n)]["against"] = {"fids": fids[1][n], "std": float(b.std(ddof=1)),
                                            "diff_mean": float(d.mean()),
                                            "diff_std": float(d.std(ddof=1))}
            print(f"{n:>8} {b.std(ddof=1):>8.3f} {d.mean():>+9.3f} {d.std(ddof=1):>8.3f}  "
                  + " ".join(f"{v:+.2f}" for v in d))
    write_json(args.out, {"model": str(args.model), "against": str(args.against or ""),
                          "extractor": tools.fid.name,
                          "sampler": cfg.fid.sampler, "device": str(device), "k": args.k,
                          "seed": args.seed, "seconds": seconds, "counts": per_count,
                          "run_fid": run.get("fid"), "run_fid_samples": run.get("fid_samples"),
                          "torch": torch.__version__,
                          "args": {k: str(v) if isinstance(v, Path) else v
                                   for k, v in vars(args).items()}})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
