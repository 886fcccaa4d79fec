"""DVC stage `federate@<algorithm>-<seed>`: federated training of one algorithm of the study in
replicate <seed> of `study.seeds`.

Reads params: dataset, model, fl, algorithms.<algorithm>; the replicate's partition
(data/partition/seed_<seed>/) and, for a method that declares server data,
data/server_data/seed_<seed>/; for `backbone: fedavg`, data/backbone/seed_<seed>/ (the backbone
stage). Writes data/federate/<algorithm>/seed_<seed>/ (model, personal models, history, per-client
accuracies, metrics, curves; resume state in data/checkpoints/).
"""

import sys

from fedpipe.cli import run_stage, stage_arguments
from fedpipe.config import load_params
from fedpipe.pipeline.common import train_config
from fedpipe.pipeline.federate import federate
from fedpipe.tracking import stage_run


def main() -> None:
    algorithm, seed = stage_arguments(sys.argv, "algorithm", "seed")
    cfg = train_config(load_params(), algorithm, seed)  # validates before any data is loaded
    with stage_run(f"federate@{algorithm}-{seed}", cfg.params_read, cfg.seed) as run:
        out = federate(cfg, on_round=run.log_round)
        run.log_file_hashes("input", out.inputs)
        run.log_file_hashes("output", out.outputs)
        run.log_final(out.final)
        run.log_artifact(out.out_dir / "curves.png", "plots")


if __name__ == "__main__":
    run_stage(main)
