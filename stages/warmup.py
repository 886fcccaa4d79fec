"""DVC stage `warmup`: every client trains its own DDPM on its local data (FedDDPM's warm-up).

Reads params: seed, dataset, diffusion, warmup; the partition file. Writes data/warmup/ (one
checkpoint per client, loss curves, metrics). Resumes at the first unfinished client.
"""

from fedpipe.cli import run_stage
from fedpipe.config import load_params
from fedpipe.config.diffusion import diffusion_stage_config
from fedpipe.pipeline.skip import skip_if_unused
from fedpipe.tracking import stage_run


def main() -> None:
    params = load_params()
    cfg = diffusion_stage_config(params, "warmup")  # validates before any data is loaded
    if skip_if_unused("warmup"):  # not used by this study: placeholders only
        return
    # heavy imports (torch, diffusers) only once the stage is known to run
    from fedpipe.pipeline.warmup import warmup
    with stage_run("warmup", cfg.params_read, cfg.seed) as run:
        out = warmup(cfg)
        run.log_per_client("client_final_loss", {c: ls[-1] for c, ls in out.losses.items()})
        run.log_metrics(out.metrics)
        run.log_file_hashes("input", out.inputs)
        run.log_artifact(out.out_dir / "losses.png", "plots")


if __name__ == "__main__":
    run_stage(main)
