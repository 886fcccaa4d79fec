"""DVC stage `generate@<seed>`: in replicate <seed> of `study.seeds`, the server samples the
auxiliary set from the clients' warm-up DDPMs.

Reads params: dataset, diffusion, warmup, generate; the replicate's partition and warm-up models.
Writes data/generate/seed_<seed>/ (aux.safetensors, sources.json, a sample grid per client, metrics).
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
    cfg = diffusion_stage_config(params, "generate", seed)  # validates before any data is loaded
    if skip_if_unused("generate", item={"seed": cfg.seed}):  # not used by this study: placeholders
        return
    # heavy imports (torch, diffusers) only once the stage is known to run
    from fedpipe.pipeline.generate import generate
    with stage_run(f"generate@{cfg.seed}", cfg.params_read, cfg.seed) as run:
        out = generate(cfg)
        run.log_metrics(out["metrics"])
        run.log_file_hashes("input", out["inputs"])
        run.log_file_hashes("output", out["outputs"])


if __name__ == "__main__":
    run_stage(main)
