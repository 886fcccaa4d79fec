"""DVC stage `generate`: the server samples the auxiliary set from the clients' warm-up DDPMs.

Reads params: seed, dataset, diffusion, warmup, generate; the partition and the warm-up models.
Writes data/generate/ (aux.safetensors, sources.json, a sample grid per client, metrics).
"""

from fedpipe.cli import run_stage
from fedpipe.config import load_params
from fedpipe.config.diffusion import diffusion_stage_config
from fedpipe.pipeline.skip import skip_if_unused
from fedpipe.tracking import stage_run


def main() -> None:
    params = load_params()
    cfg = diffusion_stage_config(params, "generate")  # validates before any data is loaded
    if skip_if_unused("generate"):  # not used by this study: placeholders only
        return
    # heavy imports (torch, diffusers) only once the stage is known to run
    from fedpipe.pipeline.generate import generate
    with stage_run("generate", cfg.params_read, cfg.seed) as run:
        out = generate(cfg)
        run.log_metrics(out["metrics"])
        run.log_file_hashes("input", out["inputs"])
        run.log_file_hashes("output", out["outputs"])


if __name__ == "__main__":
    run_stage(main)
