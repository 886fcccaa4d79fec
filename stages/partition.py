"""DVC stage `partition@<seed>`: replicate <seed> of `study.seeds` splits the training set over
clients with its own seed; writes the partition and its statistics.

Reads params sections: dataset, partition (and the replicate's seed, from the stage's name). Writes
data/partition/seed_<seed>/ (see dvc.yaml).
"""

import sys

from fedpipe.cli import run_stage, stage_argument
from fedpipe.config import load_params
from fedpipe.pipeline.inputs import replicate_dir
from fedpipe.pipeline.partition import partition_and_write, partition_stage_config
from fedpipe.tracking import stage_run

OUT = "data/partition"  # fedpipe.pipeline.inputs.PARTITION_DIR


def main() -> None:
    seed = stage_argument(sys.argv, "seed")
    params = load_params()
    cfg = partition_stage_config(params, seed)  # validates everything before any data is loaded
    read = {"seed": cfg.seed, **{k: params[k] for k in ("dataset", "partition") if k in params}}
    with stage_run(f"partition@{cfg.seed}", read, cfg.seed) as run:
        result = partition_and_write(cfg, replicate_dir(OUT, cfg.seed))
        run.log_file_hashes("output", result.hashes)
        run.log_metrics(result.summary)
        for path in result.plots:
            run.log_artifact(path, "plots")


if __name__ == "__main__":
    run_stage(main)
