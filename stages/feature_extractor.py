"""DVC stage `feature_extractor`: the FID feature extractor and the real training set's reference
statistics.

Reads params: seed, dataset, fid. Writes data/fid/ (classifier, reference statistics, metrics).
"""

from fedpipe.cli import run_stage
from fedpipe.config import load_params
from fedpipe.pipeline.common import check_model
from fedpipe.pipeline.diffusion import diffusion_stage_config
from fedpipe.pipeline.skip import skip_if_unused
from fedpipe.tracking import stage_run


def main() -> None:
    params = load_params()
    cfg = diffusion_stage_config(params, "feature_extractor")  # validates before any compute
    if skip_if_unused("feature_extractor"):  # not used by this study: placeholders only
        return
    # heavy imports (torch, diffusers) only once the stage is known to run
    from fedpipe.pipeline.feature_extractor import feature_extractor
    check_model(cfg.fid.classifier, "fid.classifier")
    with stage_run("feature_extractor", cfg.params_read, cfg.seed) as run:
        out = feature_extractor(cfg)
        run.log_metrics(out["metrics"])
        run.log_tags({"fid.extractor_name": out["metrics"]["extractor"]})
        run.log_file_hashes("output", out["outputs"])


if __name__ == "__main__":
    run_stage(main)
