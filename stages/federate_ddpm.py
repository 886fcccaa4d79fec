"""DVC stage `federate_ddpm@<algorithm>-<seed>`: federated training of the DDPM with one algorithm of
`study.diffusion_algorithms` (FedAvg, FedProx, SCAFFOLD, MoFedSAM, FedDDPM, FedDDPM+).

Reads params: dataset, diffusion, diffusion_fl, fid, algorithms.<algorithm>; replicate <seed>'s
partition and auxiliary set (data/partition/seed_<seed>/, data/generate/seed_<seed>/) and the shared
data/fid/. Writes data/federate_ddpm/<algorithm>/seed_<seed>/ (model, history with
the FID curve, metrics, QuickTest trace, curves and a sample grid; resume state in data/checkpoints/).
"""

import sys

from fedpipe.cli import run_stage, stage_arguments
from fedpipe.config import load_params
from fedpipe.pipeline.federate_ddpm import ddpm_train_config, federate_ddpm
from fedpipe.tracking import stage_run


def main() -> None:
    algorithm, seed = stage_arguments(sys.argv, "algorithm", "seed")
    cfg = ddpm_train_config(load_params(), algorithm, seed)  # validates before any data is loaded
    with stage_run(f"federate_ddpm@{algorithm}-{seed}", cfg.params_read, cfg.seed) as run:
        out = federate_ddpm(cfg, on_round=run.log_round)
        run.log_file_hashes("input", out.inputs)
        run.log_file_hashes("output", out.outputs)
        run.log_final(out.final)
        run.log_tags({"fid.extractor_name": out.final["extractor"],
                      "fid.samples": out.final["fid_samples"]})
        for name in ("curves.png", "samples.png"):
            run.log_artifact(out.out_dir / name, "plots")


if __name__ == "__main__":
    run_stage(main)
