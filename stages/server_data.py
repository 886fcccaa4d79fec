"""DVC stage `server_data@<seed>`: the typed server data the study's classification methods declare
(`algorithms.<name>.server_data`), written for replicate <seed> of `study.seeds` from its auxiliary
set (only when a method reads it: study.server_data_from); see fedpipe.pipeline.server_data.

Reads params: study.algorithms, study.server_data_from, algorithms, dataset (the ``holdout`` kind:
``holdout_fraction``; ``public``: ``public_dataset``); data/generate/seed_<seed>/aux.safetensors. Writes
data/server_data/seed_<seed>/.
"""

import sys

from fedpipe.cli import run_stage, stage_argument
from fedpipe.config import dataset_config, load_params
from fedpipe.config.dataset import check_server_data_source
from fedpipe.config.stages import replicate_seed
from fedpipe.data import load_dataset
from fedpipe.io import md5_file
from fedpipe.pipeline.diffusion import aux_file
from fedpipe.pipeline.inputs import replicate_dir
from fedpipe.pipeline.server_data import (
    SERVER_DATA_DIR,
    needed_kinds,
    public_split,
    write_server_data,
)
from fedpipe.tracking import stage_run


def main() -> None:
    seed = replicate_seed(stage_argument(sys.argv, "seed"))
    params = load_params()
    kinds = needed_kinds(params)  # validates before any data is loaded
    check_server_data_source(kinds, dataset_config(params.get("dataset")))
    study = params.get("study") or {}
    read = {"study.algorithms": study.get("algorithms"),
            "study.server_data_from": study.get("server_data_from"),
            "algorithms": params.get("algorithms"), "dataset": params.get("dataset"), "seed": seed}
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
