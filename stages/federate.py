"""DVC stage `federate@<algorithm>`: federated training of one algorithm of the study.

Reads params: seed, dataset, model, fl, algorithms.<algorithm>; the partition file. Writes
data/federate/<algorithm>/ (model, history, metrics, curves; checkpoint/ persists for resume).
"""

import sys

from fedpipe.cli import run_stage, stage_argument
from fedpipe.config import load_params
from fedpipe.pipeline.common import train_config
from fedpipe.pipeline.federate import federate
from fedpipe.tracking import stage_run


def main(stage: str = "federate", aux_path: str | None = None) -> None:
    """Also the body of `federate_aux@<algorithm>` (``aux_path``: the labelled auxiliary set)."""
    algorithm = stage_argument(sys.argv, "algorithm")
    cfg = train_config(load_params(), algorithm)  # validates before any data is loaded
    with stage_run(f"{stage}@{algorithm}", cfg.params_read, cfg.seed) as run:
        out = federate(cfg, aux_path=aux_path,
                       on_round=lambda rec: run.log_metrics(rec, step=int(rec["round"])))
        run.log_file_hashes("input", out.inputs)
        run.log_file_hashes("output", out.outputs)
        run.log_metrics({f"final_{k}": v for k, v in out.final.items()})
        run.log_artifact(out.out_dir / "curves.png", "plots")


if __name__ == "__main__":
    run_stage(main)
