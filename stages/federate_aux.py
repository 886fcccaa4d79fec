"""DVC stage `federate_aux@<algorithm>`: a classification-track algorithm that calibrates the global
classifier on the labelled auxiliary set after each round (FedDDPM applied to classification; needs
`diffusion.conditional: true`). Listed in `study.calibrated_algorithms`.

Reads params: seed, dataset, model, fl, algorithms.<algorithm>; the partition and the auxiliary set.
Writes data/federate/<algorithm>/ like `federate@<algorithm>`, so `evaluate` compares it with the rest.
"""

import sys

from fedpipe.cli import run_stage, stage_argument
from fedpipe.config import load_params
from fedpipe.pipeline.common import train_config
from fedpipe.pipeline.diffusion import AUX_FILE
from fedpipe.pipeline.federate import federate
from fedpipe.tracking import stage_run


def main() -> None:
    algorithm = stage_argument(sys.argv, "algorithm")
    cfg = train_config(load_params(), algorithm)  # validates before any data is loaded
    with stage_run(f"federate_aux@{algorithm}", cfg.params_read, cfg.seed) as run:
        out = federate(cfg, aux_path=AUX_FILE,
                       on_round=lambda rec: run.log_metrics(rec, step=int(rec["round"])))
        run.log_file_hashes("input", out.inputs)
        run.log_file_hashes("output", out.outputs)
        run.log_metrics({f"final_{k}": v for k, v in out.final.items()})
        run.log_artifact(out.out_dir / "curves.png", "plots")


if __name__ == "__main__":
    run_stage(main)
