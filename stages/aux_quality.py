"""DVC stage `aux_quality@<seed>`: FID of replicate <seed>'s auxiliary set against the real training
set, and (labelled sets) the classifier's accuracy per requested class.

Reads params: dataset, diffusion, generate, fid; data/generate/seed_<seed>/ and the shared data/fid/.
Writes data/aux_quality/seed_<seed>/ (metrics, per-class CSV and plot).
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
    cfg = diffusion_stage_config(params, "aux_quality", seed)  # validates before any data is loaded
    if skip_if_unused("aux_quality", item={"seed": cfg.seed}):  # not used by this study: placeholders
        return
    # heavy imports (torch, diffusers) only once the stage is known to run
    from fedpipe.pipeline.aux_quality import aux_quality
    with stage_run(f"aux_quality@{cfg.seed}", cfg.params_read, cfg.seed) as run:
        out = aux_quality(cfg)
        run.log_metrics(out["metrics"])
        run.log_tags({"fid.extractor_name": out["metrics"]["extractor"],
                        "fid.samples": out["metrics"]["samples"]})
        run.log_file_hashes("input", out["inputs"])


if __name__ == "__main__":
    run_stage(main)
