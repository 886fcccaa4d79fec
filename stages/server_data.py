"""DVC stage `server_data`: the typed server data the study's classification methods declare
(`algorithms.<name>.server_data`), written from the auxiliary set; see fedpipe.pipeline.server_data.

Reads params: study.algorithms, algorithms, dataset (the ``holdout`` kind: ``holdout_fraction``;
``public``: ``public_dataset``); data/generate/aux.safetensors. Writes data/server_data/.
"""

from fedpipe.cli import run_stage
from fedpipe.config import dataset_config, load_params
from fedpipe.config.stages import read_seed
from fedpipe.data import load_dataset
from fedpipe.io import md5_file
from fedpipe.pipeline.diffusion import AUX_FILE
from fedpipe.pipeline.server_data import needed_kinds, public_split, write_server_data
from fedpipe.tracking import stage_run


def main() -> None:
    params = load_params()
    kinds = needed_kinds(params)  # validates before any data is loaded
    read = {"study.algorithms": (params.get("study") or {}).get("algorithms"),
            "algorithms": params.get("algorithms"), "dataset": params.get("dataset")}
    with stage_run("server_data", read, read_seed(params)) as run:
        holdout = public = None
        if "holdout" in kinds:
            holdout = load_dataset(dataset_config(params.get("dataset"))).holdout
        if "public" in kinds:
            public = public_split(params)
        manifest = write_server_data(kinds, AUX_FILE, holdout=holdout, public=public)
        if set(kinds) - {"holdout", "public"}:
            run.log_file_hashes("input", {str(AUX_FILE): md5_file(AUX_FILE)})
        run.log_tags({f"server_data.{k}": ",".join(v["algorithms"])
                      for k, v in manifest["kinds"].items()})
    print({k: v["algorithms"] for k, v in manifest["kinds"].items()} or "no server data needed")


if __name__ == "__main__":
    run_stage(main)
