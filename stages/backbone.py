"""DVC stage `backbone@<seed>`: PerAda's offline backbone for replicate <seed> of `study.seeds`,
the plain model pretrained by FedAvg on the federation's own data (the paper's Fig. 5 alternative),
shared by every algorithm of the study with `backbone: fedavg`; a marked placeholder (a second) when
none has it (data/plan/backbone.json).

Reads params: dataset, model, fl, study, algorithms (their common pretrain_rounds); the
replicate's partition file (data/partition/seed_<seed>/). Writes data/backbone/seed_<seed>/
(model.safetensors, metrics.json; resume state in data/checkpoints/backbone/).
"""

import sys

from fedpipe.cli import run_stage, stage_argument
from fedpipe.config import load_params
from fedpipe.pipeline.skip import BACKBONE_PLAN, skip_if_unused
from fedpipe.tracking import stage_run


def main() -> None:
    seed = stage_argument(sys.argv, "seed")
    params = load_params()
    if skip_if_unused("backbone", BACKBONE_PLAN, item={"seed": seed},
                      why="no algorithm with backbone: fedavg"):  # placeholders only
        return
    # heavy imports (torch, the algorithms) only once the stage is known to run
    from fedpipe.pipeline.backbone import backbone_config, build_backbone

    bcfg = backbone_config(params, seed)  # validates before any data is loaded
    with stage_run(f"backbone@{seed}", bcfg.train.params_read, bcfg.train.seed) as run:
        out = build_backbone(bcfg)
        run.log_file_hashes("input", out["inputs"])
        run.log_file_hashes("output", out["outputs"])
        run.log_final(out["metrics"])


if __name__ == "__main__":
    run_stage(main)
