"""DVC stage `server_data@<seed>`: the typed server data the study's classification methods declare
(`algorithms.<name>.server_data`), written for replicate <seed> of `study.seeds` from its auxiliary
set (only when a method reads it: study.server_data_from); see fedpipe.pipeline.server_data.

Reads params: dataset (the ``holdout`` kind: ``holdout_fraction``; ``public``: ``public_dataset``);
data/plan/server_data.json (the kinds the study's methods declare, which the plan stage derived from
study.algorithms and algorithms); data/<study.server_data_from>/seed_<seed>/ (the generated auxiliary
set when a method reads it). Writes data/server_data/seed_<seed>/.
"""

import sys

from fedpipe.cli import run_stage, stage_argument
from fedpipe.config import dataset_config, load_params
from fedpipe.config.dataset import check_server_data_source
from fedpipe.data import load_dataset
from fedpipe.io import md5_file, read_json_input
from fedpipe.pipeline.diffusion import aux_file
from fedpipe.pipeline.inputs import replicate_dir, replicate_seed
from fedpipe.pipeline.server_data import public_split, write_server_data
from fedpipe.pipeline.server_inputs import SERVER_DATA_DIR
from fedpipe.pipeline.skip import SERVER_DATA_PLAN
from fedpipe.tracking import stage_run


def main() -> None:
    seed = replicate_seed(stage_argument(sys.argv, "seed"))
    params = load_params()
    kinds = read_json_input(SERVER_DATA_PLAN, "plan")  # validated by the plan stage
    check_server_data_source(kinds, dataset_config(params.get("dataset")))
    read = {"server_data": kinds, "dataset": params.get("dataset"), "seed": seed}
    aux = aux_file(seed)
    with stage_run(f"server_data@{seed}", read, seed) as run:
        holdout = public = None
        if "holdout" in kinds:
            holdout = load_dataset(dataset_config(params.get("dataset"))).holdout
        if "public" in kinds:
            public = public_split(params)
        manifest = write_server_data(kinds, aux, replicate_dir(SERVER_DATA_DIR, seed),
                                     holdout=holdout, public=public)
        if set(kinds) - {"holdout", "public"}:
            run.log_file_hashes("input", {str(aux): md5_file(aux)})
        run.log_tags({f"server_data.{k}": ",".join(v["algorithms"])
                      for k, v in manifest["kinds"].items()})
    print({k: v["algorithms"] for k, v in manifest["kinds"].items()} or "no server data needed")


if __name__ == "__main__":
    run_stage(main)
