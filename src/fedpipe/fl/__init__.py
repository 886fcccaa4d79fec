"""FL engine: *how* rounds run (strategy hooks, executors, round loop, checkpoints)."""

from fedpipe.fl.engine import (
    ClientStore,
    DivergenceError,
    RunResult,
    load_checkpoint,
    run_federated,
    sample_clients,
    save_checkpoint,
)
from fedpipe.fl.executors import SerialExecutor
from fedpipe.fl.local import local_train
from fedpipe.fl.state import ClientState, ClientUpdate, Payload, ServerState, clone, weighted_average
from fedpipe.fl.strategy import (
    SERVER_DATA_KINDS,
    NoConfig,
    RoundInfo,
    ServerData,
    Strategy,
    require_server_data,
)

__all__ = [
    "SERVER_DATA_KINDS",
    "ClientState",
    "ClientStore",
    "DivergenceError",
    "RunResult",
    "SerialExecutor",
    "load_checkpoint",
    "run_federated",
    "sample_clients",
    "save_checkpoint",
    "local_train",
    "ClientUpdate",
    "Payload",
    "RoundInfo",
    "ServerData",
    "ServerState",
    "clone",
    "require_server_data",
    "weighted_average",
    "NoConfig",
    "Strategy",
]
