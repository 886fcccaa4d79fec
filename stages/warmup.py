"""DVC stage `warmup@<seed>`: in replicate <seed> of `study.seeds`, every client trains its own DDPM
on its local data (FedDDPM's warm-up), every draw from the replicate's seed.

Reads params: dataset, diffusion, warmup; the replicate's partition file. Writes
data/warmup/seed_<seed>/ (one checkpoint per client, loss curves, metrics). Resumes at the first
unfinished client.
"""

import sys

from fedpipe.cli import run_stage, stage_argument
from fedpipe.config import load_params
from fedpipe.pipeline.diffusion import diffusion_stage_config
from fedpipe.pipeline.skip import skip_if_unused
from fedpipe.tracking import stage_run


def main() -> None:
    seed = stage_argument(sys.argv, "seed")
    params = load_params()
    cfg = diffusion_stage_config(params, "warmup", seed)  # validates before any data is loaded
    if skip_if_unused("warmup", item={"seed": cfg.seed}):  # not used by this study: placeholders
        return
    # heavy imports (torch, diffusers) only once the stage is known to run
    from fedpipe.pipeline.warmup import warmup
    with stage_run(f"warmup@{cfg.seed}", cfg.params_read, cfg.seed) as run:
        out = warmup(cfg)
        run.log_per_client("client_final_loss", {c: ls[-1] for c, ls in out.losses.items()})
        run.log_metrics(out.metrics)
        run.log_file_hashes("input", out.inputs)
        run.log_artifact(out.out_dir / "losses.png", "plots")


if __name__ == "__main__":
    run_stage(main)
