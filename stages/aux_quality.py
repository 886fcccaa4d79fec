"""DVC stage `aux_quality`: FID of the auxiliary set against the real training set, and (labelled
sets) the classifier's accuracy per requested class.

Reads params: seed, dataset, diffusion, warmup, generate, fid; the auxiliary set and data/fid/.
Writes data/aux_quality/ (metrics, per-class CSV and plot).
"""

from fedpipe.cli import run_stage
from fedpipe.config import load_params
from fedpipe.config.diffusion import diffusion_stage_config
from fedpipe.pipeline.skip import skip_if_unused
from fedpipe.tracking import stage_run


def main() -> None:
    params = load_params()
    cfg = diffusion_stage_config(params, "aux_quality")  # validates before any data is loaded
    if skip_if_unused("aux_quality"):  # not used by this study: placeholders only
        return
    # heavy imports (torch, diffusers) only once the stage is known to run
    from fedpipe.pipeline.aux_quality import aux_quality
    with stage_run("aux_quality", cfg.params_read, cfg.seed) as run:
        out = aux_quality(cfg)
        run.log_metrics(out["metrics"])
        run.log_tags({"fid.extractor_name": out["metrics"]["extractor"],
                        "fid.samples": out["metrics"]["samples"]})
        run.log_file_hashes("input", out["inputs"])


if __name__ == "__main__":
    run_stage(main)
