"""The server data the classification methods declare, as the training stages read it: which kinds a
study needs (from its methods' configs), where the server_data stage writes them, and their check
and reader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedpipe.algorithms import (
    ALGORITHMS,
    algorithm_config,
    check_algorithms,
)
from fedpipe.config import ConfigError
from fedpipe.config.core import build, check_sections
from fedpipe.config.fl import StudyConfig
from fedpipe.data import ClientData
from fedpipe.fl import ServerData
from fedpipe.io import check_input, load_tensors, read_json_input

SERVER_DATA_DIR = Path("data/server_data")


GENERATED_KINDS = ("aux", "distill")
"""The kinds written from the generated auxiliary set (the others come from real datasets)."""


MANIFEST = "manifest.json"


def needed_kinds(params: dict[str, Any]) -> dict[str, list[str]]:
    """{kind: the study's classification algorithms that need it} (validated, no data loaded)."""
    check_sections(params)
    study = build(StudyConfig, params.get("study"), "study")
    check_algorithms(study.algorithms, "study.algorithms")
    algos = params.get("algorithms") or {}  # each study method's section validated below
    if not isinstance(algos, dict):
        raise ConfigError("algorithms", algos, "a mapping of algorithm name to its settings")
    kinds: dict[str, list[str]] = {}
    for name in study.algorithms:
        kind = ALGORITHMS[name].server_data_kind(algorithm_config(name, algos.get(name)))
        if kind != "none":
            kinds.setdefault(kind, []).append(name)
    generated = sorted(set(kinds) & set(GENERATED_KINDS))
    if generated and study.server_data_from != "generate":
        users = ", ".join(n for k in generated for n in kinds[k])
        raise ConfigError("study.server_data_from", study.server_data_from,
                          f"generate: {users} read the generated auxiliary set (server_data "
                          f"{', '.join(generated)}; study.diffusion_seeds must then be study.seeds)")
    return kinds


def check_server_data(kind: str, root: str | Path = SERVER_DATA_DIR, stage: str = "server_data"
                      ) -> None:
    """The server data of ``kind`` is there and readable (InputError naming `dvc repro <stage>`
    otherwise); called before any compute by the federate stage of a method that declares it."""
    check_input(Path(root) / f"{kind}.safetensors", stage, ("images", "labels"))


def load_server_data(kind: str, who: str, root: str | Path = SERVER_DATA_DIR,
                     stage: str = "server_data") -> ServerData:
    """The server data of ``kind`` written by the stage ``stage`` into ``root`` (``who`` needs it)."""
    path = Path(root) / f"{kind}.safetensors"
    check_server_data(kind, root, stage)
    t = load_tensors(path, stage)
    labelled = bool((t["labels"] >= 0).all())
    manifest = Path(root) / MANIFEST
    info = (read_json_input(manifest, stage).get("kinds", {}).get(kind, {}) if manifest.is_file()
            else {})
    return ServerData(kind, ClientData(t["images"], t["labels"]), labelled,
                      info.get("source", str(path)))
