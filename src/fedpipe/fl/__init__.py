"""FL engine: *how* rounds run (strategy hooks, executors, round loop, checkpoints)."""

from fedpipe.fl.engine import (
    DivergenceError,
    RunResult,
    SerialExecutor,
    load_checkpoint,
    run_federated,
    sample_clients,
    save_checkpoint,
)
from fedpipe.fl.local import local_train
from fedpipe.fl.state import ClientUpdate, Payload, ServerState, clone, weighted_average
from fedpipe.fl.strategy import NoConfig, Strategy

__all__ = [
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
    "ServerState",
    "clone",
    "weighted_average",
    "NoConfig",
    "Strategy",
]
