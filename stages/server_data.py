"""DVC stage `server_data`: the typed server data the study's classification methods declare
(`algorithms.<name>.server_data`), written from the auxiliary set; see fedpipe.pipeline.server_data.

Reads params: study, algorithms; data/generate/aux.safetensors. Writes data/server_data/.
"""

from fedpipe.cli import run_stage
from fedpipe.config import load_params
from fedpipe.pipeline.diffusion import AUX_FILE
from fedpipe.pipeline.server_data import needed_kinds, write_server_data


def main() -> None:
    kinds = needed_kinds(load_params())  # validates before any data is loaded
    manifest = write_server_data(kinds, AUX_FILE)
    print({k: v["algorithms"] for k, v in manifest["kinds"].items()} or "no server data needed")


if __name__ == "__main__":
    run_stage(main)
