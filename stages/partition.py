"""DVC stage `partition`: split the training set over clients; write the partition and its statistics.

Reads params sections: seed, dataset, partition. Writes data/partition/ (see dvc.yaml).
"""

from fedpipe.cli import run_stage
from fedpipe.config import load_params, partition_stage_config
from fedpipe.data.outputs import partition_and_write
from fedpipe.tracking import stage_run

OUT = "data/partition"


def main() -> None:
    params = load_params()
    cfg = partition_stage_config(params)  # validates everything before any data is loaded
    read = {k: params[k] for k in ("seed", "dataset", "partition") if k in params}
    with stage_run("partition", read, cfg.seed) as run:
        result = partition_and_write(cfg, OUT)
        run.log_file_hashes("output", result.hashes)
        run.log_metrics(result.summary)
        for path in result.plots:
            run.log_artifact(path, "plots")


if __name__ == "__main__":
    run_stage(main)
