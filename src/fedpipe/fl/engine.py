"""The round loop (*how* rounds run): client sampling, per-client state, executors, evaluation,
checkpoints, resume, and the divergence guard.

Random streams: ``(seed, "client-sampling", round)`` picks the round's clients;
``(seed, "client-update", round, client_id)`` seeds a client's local training. So results do not
depend on the order in which clients run, and a resumed run replays exactly the rounds it missed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from safetensors import safe_open
from tqdm.auto import tqdm

from fedpipe.config.fl import FLConfig
from fedpipe.data import ClientData
from fedpipe.fl.state import ClientUpdate, ServerState, all_finite
from fedpipe.fl.strategy import ClientState, Strategy
from fedpipe.io import save_tensors
from fedpipe.rng import numpy_rng, torch_generator

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.safetensors"


class DivergenceError(RuntimeError):
    """A non-finite loss or update (message names the round and client)."""


def sample_clients(num_clients: int, per_round: int, seed: int, round_: int) -> list[int]:
    """``per_round`` distinct clients for round ``round_``, sorted by id."""
    if per_round >= num_clients:
        return list(range(num_clients))
    rng = numpy_rng(seed, "client-sampling", round_)
    return sorted(int(c) for c in rng.choice(num_clients, size=per_round, replace=False))


class Executor(Protocol):
    def run(self, strategy: Strategy, payload, jobs: Sequence[tuple[int, ClientState, ClientData]],
            seed: int) -> list[tuple[ClientUpdate, ClientState, dict[str, float]]]: ...


class SerialExecutor:
    """Runs the round's client updates one after another, in client-id order (deterministic)."""

    def run(self, strategy, payload, jobs, seed):
        out = []
        for cid, cstate, data in jobs:
            gen = torch_generator(seed, "client-update", payload.round, cid)
            out.append(strategy.client_update(payload, cstate, data, gen, cid))
        return out


EXECUTORS: dict[str, Callable[[], Executor]] = {"serial": SerialExecutor}


@dataclass
class RunResult:
    state: ServerState
    client_states: dict[int, ClientState]
    history: list[dict[str, float]] = field(default_factory=list)
    resumed_from: int = 0
    rounds_done: int = 0


# -- checkpoints -------------------------------------------------------------------------------
def save_checkpoint(path: Path, round_done: int, state: ServerState,
                    client_states: dict[int, ClientState], history: list[dict],
                    fingerprint: str) -> None:
    """One safetensors file (atomic): server weights/extra, client states, and JSON metadata."""
    tensors = {f"server.w.{k}": v for k, v in state.weights.items()}
    tensors |= {f"server.x.{k}": v for k, v in state.extra.items()}
    for cid, cs in client_states.items():
        tensors |= {f"client.{cid}.{k}": v for k, v in cs.items()}
    meta = {"round": round_done, "history": history, "fingerprint": fingerprint,
            "server_meta": state.meta, "clients": sorted(client_states)}
    save_tensors(path, tensors, {"fedpipe.checkpoint": json.dumps(meta)})


def load_checkpoint(path: Path) -> tuple[dict, ServerState, dict[int, ClientState]]:
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["fedpipe.checkpoint"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    weights, extra = {}, {}
    clients: dict[int, ClientState] = {int(c): {} for c in meta["clients"]}
    for k, v in tensors.items():
        kind, rest = k.split(".", 1)
        if kind == "server":
            sub, name = rest.split(".", 1)
            (weights if sub == "w" else extra)[name] = v
        else:
            cid, name = rest.split(".", 1)
            clients[int(cid)][name] = v
    return meta, ServerState(weights, extra, meta["server_meta"]), clients


# -- the loop ----------------------------------------------------------------------------------
def _guard_losses(updates: Sequence[ClientUpdate], round_: int) -> None:
    """Non-finite local loss: stop, naming the round and client (free: losses are already floats)."""
    for u in updates:
        loss = u.metrics.get("loss", 0.0)
        if not np.isfinite(loss):
            raise DivergenceError(f"diverged: round {round_ + 1}, client {u.client_id}: "
                                  f"non-finite local loss ({loss}); lower fl.local.lr or set "
                                  f"fl.local.grad_clip")


def _guard_state(state: ServerState, updates: Sequence[ClientUpdate], round_: int) -> None:
    """Non-finite update: checked once on the aggregate; only then are the clients scanned to name
    the culprit (one finiteness check per tensor per round instead of per client)."""
    if all_finite(state.weights) and all_finite(state.extra):
        return
    bad = [u.client_id for u in updates if not (all_finite(u.weights) and all_finite(u.extra))]
    who = f"client {bad[0]}" if bad else "server aggregation"
    raise DivergenceError(f"diverged: round {round_ + 1}, {who}: non-finite model update; "
                          f"lower fl.local.lr or set fl.local.grad_clip")


def run_federated(strategy: Strategy, model: torch.nn.Module, clients: Sequence[ClientData],
                  fl: FLConfig, seed: int, *,
                  evaluate: Callable[[ServerState], dict[str, float]] | None = None,
                  checkpoint_dir: str | Path | None = None, fingerprint: str = "",
                  stop_after: int | None = None, ctx: Any = None,
                  on_round: Callable[[dict[str, float]], None] | None = None,
                  progress: bool = True) -> RunResult:
    """Run ``fl.rounds`` rounds of ``strategy`` from ``model``'s initial weights.

    With ``checkpoint_dir``, a checkpoint is written every ``fl.checkpoint_every`` rounds and after
    the last; a checkpoint with the same ``fingerprint`` found there is resumed from. ``stop_after``
    stops after that many rounds in total (simulates an interruption; used by tests). A strategy ends
    training early by setting ``state.meta["stopped_at"]`` in a hook (FedDDPM+'s QuickTest): the
    engine records that round, checkpoints it and stops.
    """
    n = len(clients)
    per_round = fl.clients_per_round(n)
    ckpt = Path(checkpoint_dir) / CHECKPOINT if checkpoint_dir is not None else None
    start, history = 0, []
    state = strategy.init_server(model)
    client_states: dict[int, ClientState] = {}
    if ckpt is not None and ckpt.is_file():
        meta, saved_state, saved_clients = load_checkpoint(ckpt)
        if meta.get("fingerprint") == fingerprint:
            start, history = int(meta["round"]), list(meta["history"])
            state, client_states = saved_state, saved_clients
            log.info("resuming from checkpoint at round %d", start)
        else:
            log.info("ignoring checkpoint with a different fingerprint (other params or data)")
    executor = EXECUTORS[fl.executor]()
    end = start if state.meta.get("stopped_at") is not None else fl.rounds  # stopped early before
    bar = tqdm(range(start, end), desc=f"{strategy.name}", unit="round",
               initial=start, total=fl.rounds, disable=not progress, leave=False,
               mininterval=1.0)
    rounds_done = start
    for r in bar:
        selected = sample_clients(n, per_round, seed, r)
        for cid in selected:
            if cid not in client_states:
                client_states[cid] = strategy.init_client(cid)
        payload = strategy.payload(state, r)
        results = executor.run(strategy, payload,
                               [(cid, client_states[cid], clients[cid]) for cid in selected], seed)
        updates = [u for u, _, _ in results]
        _guard_losses(updates, r)
        for cid, (_, cstate, _) in zip(selected, results, strict=True):
            client_states[cid] = cstate
        state = strategy.aggregate(state, updates)
        _guard_state(state, updates, r)
        state = strategy.server_update(state, r, ctx)
        sizes = np.array([u.num_samples for u in updates], dtype=np.float64)
        losses = np.array([u.metrics.get("loss", np.nan) for u in updates])
        record: dict[str, float] = {"round": float(r + 1),
                                    "train_loss": float((sizes * losses).sum() / sizes.sum()),
                                    "clients": float(len(selected))}
        if evaluate is not None and ((r + 1) % fl.eval_every == 0 or r + 1 == fl.rounds):
            record |= {f"test_{k}": v for k, v in evaluate(state).items()}
        history.append(record)
        rounds_done = r + 1
        if on_round is not None:
            on_round(record)
        bar.set_postfix({k: f"{v:.4f}" for k, v in record.items()
                         if k in ("train_loss", "test_accuracy")})
        stopped = state.meta.get("stopped_at") is not None  # the strategy ended training
        interrupted = stop_after is not None and r + 1 >= stop_after
        last = r + 1 == fl.rounds or stopped or interrupted
        if ckpt is not None and ((r + 1) % fl.checkpoint_every == 0 or last):
            save_checkpoint(ckpt, r + 1, state, client_states, history, fingerprint)
        if stopped or interrupted:
            break
    bar.close()
    return RunResult(state, client_states, history, resumed_from=start, rounds_done=rounds_done)
