"""The round loop (*how* rounds run): client selection, per-client payloads and state, executors,
evaluation (global and personal models), checkpoints, resume, and the divergence guard (a non-finite
loss or update, or a local loss more than ``fl.divergence_factor`` times the initial model's loss:
:func:`guard_growth`).

One round (round protocol v2, docs/architecture.md):

1. ``strategy.select_clients(state, r, available, n, rng, probe)`` with ``rng`` the stream
   ``(seed, "client-sampling", r)``; ``probe`` runs ``strategy.probe`` on candidates through the
   executor (stream ``(seed, "client-probe", r, client)``).
2. ``strategy.payload(state, r, client)`` for each selected client.
3. The executor runs ``strategy.client_update`` for each (stream ``(seed, "client-update", r,
   client)``); updates come back sorted by client id, and the client states are stored.
4. ``strategy.aggregate(state, rnd)`` and ``strategy.server_update(state, rnd)`` with ``rnd`` a
   :class:`~fedpipe.fl.strategy.RoundInfo` (round, seed, updates, server data, score).
5. ``strategy.round_metrics(state, rnd)``: the server step's scalars (Equitable-FL's clustering
   NMI), recorded in the round's history row.
6. Every ``fl.eval_every`` rounds: ``evaluate(state, personal)``, ``personal`` being each client's
   own model (``strategy.personalized_model``, stream ``(seed, "personalize", r, client)``) for a
   method that has them. Its per-client rows get a ``participant`` column (1.0 for the round's
   clients), so metrics over the round's participants (Equitable-FL's CD, eq. 9) can be read off.

So results do not depend on the order in which clients run, and a resumed run replays exactly the
rounds it missed.

Checkpoints: ``<dir>/server.safetensors`` (server weights and groups, history, the client manifest)
and one file per client and version, ``<dir>/clients/<id>-r<round>.safetensors``, written before the
server file that names them (each atomically); files the manifest does not name are removed after.
A killed run therefore always resumes from a consistent set, and client state is loaded only when
that client is needed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from tqdm.auto import tqdm

from fedpipe.config.fl import FLConfig
from fedpipe.data import ClientData
from fedpipe.device import module_device
from fedpipe.errors import DivergenceError, InputError
from fedpipe.fl.batched import BatchedExecutor
from fedpipe.fl.executors import Executor, SerialExecutor
from fedpipe.fl.state import (
    ClientState,
    ClientUpdate,
    ServerState,
    Weights,
    all_finite,
    flatten_groups,
    unflatten_groups,
)
from fedpipe.fl.strategy import RoundInfo, Score, ServerData, Strategy, uniform_selection
from fedpipe.io import read_tensors, save_tensors, set_aside
from fedpipe.rng import numpy_rng, torch_generator

log = logging.getLogger(__name__)

SERVER_FILE = "server.safetensors"
CLIENTS_DIR = "clients"
CLIENT_FILE = re.compile(r"(?P<client>\d+)-r(?P<round>\d+)\.safetensors")
"""A client's state file: ``<client id>-r<round after which it was saved>.safetensors``."""
OWNER_KEY = "fedpipe.client"
"""Metadata key of a client's state file: {"client": id, "round": round} (its owner)."""

Evaluate = Callable[[ServerState, dict[int, Weights] | None], dict[str, Any]]


def sample_clients(num_clients: int, per_round: int, seed: int, round_: int) -> list[int]:
    """The default selection of round ``round_``: ``per_round`` distinct clients, sorted by id."""
    return uniform_selection(range(num_clients), per_round,
                             numpy_rng(seed, "client-sampling", round_))


# -- executors ---------------------------------------------------------------------------------
def _ray_executor(fl: FLConfig) -> Executor:
    from fedpipe.fl.ray_executor import RayExecutor  # Ray is imported only when asked for

    return RayExecutor.from_config(fl.ray)


EXECUTORS: dict[str, Callable[[FLConfig], Executor]] = {
    "serial": lambda fl: SerialExecutor(),
    "batched": lambda fl: BatchedExecutor(),
    "ray": _ray_executor,
}
"""``fl.executor`` -> a factory given the run's :class:`FLConfig`."""


# -- per-client state ------------------------------------------------------------------------
class ClientStore:
    """Per-client state: ``get`` / ``put`` by client id. With a ``directory``, :meth:`save` writes
    the states changed since the last save as one file per client (``<id>-r<round>``) and returns
    the manifest {client id: file name}; :meth:`load` reads a manifest and loads each client's file
    only when that client is first asked for."""

    def __init__(self, directory: Path | None = None, device: torch.device | None = None):
        self.directory = directory
        self.device = device  # where states read from files go (None: where they were read)
        self.states: dict[int, ClientState] = {}
        self.files: dict[int, str] = {}  # saved version of each client
        self.dirty: set[int] = set()

    def __contains__(self, cid: int) -> bool:
        return cid in self.states or cid in self.files

    def ids(self) -> list[int]:
        return sorted(set(self.states) | set(self.files))

    def get(self, cid: int) -> ClientState:
        if cid not in self.states and cid in self.files:
            name = self.files[cid]  # "" = an empty state (nothing written)
            state = read_client_file(self.directory / name, cid) if name else {}
            self.states[cid] = groups_to(state, self.device)
        return self.states[cid]

    def put(self, cid: int, state: ClientState) -> None:
        self.states[cid] = state
        self.dirty.add(cid)

    def all(self) -> dict[int, ClientState]:
        return {cid: self.get(cid) for cid in self.ids()}

    def save(self, round_done: int) -> dict[int, str]:
        assert self.directory is not None
        self.directory.mkdir(parents=True, exist_ok=True)
        for cid in sorted(self.dirty):
            if not any(self.states[cid].values()):
                self.files[cid] = ""
                continue
            name = client_file_name(cid, round_done)
            save_tensors(self.directory / name, flatten_groups(self.states[cid]),
                         {OWNER_KEY: json.dumps({"client": cid, "round": round_done})})
            self.files[cid] = name
        self.dirty.clear()
        return dict(self.files)

    def load(self, manifest: dict[int, str]) -> None:
        self.states, self.files, self.dirty = {}, dict(manifest), set()

    def prune(self) -> None:
        """Remove client files that the manifest does not name (older versions, killed saves)."""
        if self.directory is None or not self.directory.is_dir():
            return
        keep = set(self.files.values())
        for f in self.directory.iterdir():
            if CLIENT_FILE.fullmatch(f.name) and f.name not in keep:
                f.unlink()


def groups_to(groups: dict[str, Weights], device: torch.device | None) -> dict[str, Weights]:
    """``groups`` with every tensor on ``device`` (as they are for None or the CPU: files are read
    there)."""
    if device is None or device.type == "cpu":
        return groups
    return {g: {k: v.to(device) for k, v in w.items()} for g, w in groups.items()}


def client_file_name(cid: int, round_done: int) -> str:
    """The file of client ``cid``'s state as it was after round ``round_done``."""
    return f"{cid}-r{round_done}.safetensors"


def read_client_file(path: Path, cid: int | None = None) -> ClientState:
    """A client's state file, verified against its content hash and finite, and, read for client
    ``cid``'s slot, owned by that slot: the client and round its metadata records (written with the
    state, under the same hash) are the ones its name gives, and the name is client ``cid``'s. A
    file copied or renamed into another client's slot, or another round's, is an InputError like a
    corrupt one: a resume never trains a client on another client's (or round's) state."""
    tensors, meta = read_tensors(path)
    if cid is not None:
        problem = _owner_problem(path.name, meta, cid)  # meta: the object under OWNER_KEY
        if problem is not None:
            raise InputError(path, problem, None)
    state = unflatten_groups(tensors)
    if not _extras_finite(state):
        raise InputError(path, "holds non-finite values", None)
    return state


def _owner_problem(name: str, owner: Any, cid: int) -> str | None:
    """Why the file ``name`` with recorded owner ``owner`` ({"client", "round"}) cannot be client
    ``cid``'s state (None: it can)."""
    match = CLIENT_FILE.fullmatch(name)
    if match is None or int(match["client"]) != cid:
        return f"is not a state file of client {cid} (its name should be {cid}-r<round>.safetensors)"
    if not isinstance(owner, dict) or "client" not in owner or "round" not in owner:
        return "records no owner (client and round): not a state file this pipeline wrote"
    if (owner["client"], owner["round"]) != (cid, int(match["round"])):
        return (f"holds the state of client {owner['client']} after round {owner['round']}, not of "
                f"client {cid} after round {match['round']} (copied or renamed into this slot)")
    return None


@dataclass
class RunResult:
    state: ServerState
    client_states: dict[int, ClientState]
    history: list[dict[str, float]] = field(default_factory=list)
    resumed_from: int = 0
    rounds_done: int = 0
    client_history: list[dict[str, Any]] = field(default_factory=list)
    """Per-client evaluation rows: {"round", "client", <metric>: value} every eval round."""
    personal: dict[int, Weights] | None = None
    """Each client's own model after the last round (methods with personal models)."""
    train_seconds_total: float = 0.0
    """The model's whole training time: the seconds of every process that trained it, resumes
    included (:data:`SECONDS_FILE`); wall time, so never in the history or any DVC output."""


# -- checkpoints -------------------------------------------------------------------------------
SECONDS_FILE = "train_seconds.json"
"""Beside a checkpoint: each process's training seconds (its rounds' wall time, to the end of its
last finished round), so that a killed and resumed run reports its whole training time
(``train_seconds_total``, with each round's record to ``on_round``: MLflow). Not part of the
checkpoint's hashed state, and not a DVC output (checkpoints are none): wall time never reaches a
file DVC hashes."""


def earlier_seconds(directory: Path | None, fingerprint: str, start: int) -> list[float]:
    """The training seconds of the earlier processes of the run resumed at round ``start`` from the
    checkpoint in ``directory``: none for a fresh run (``start`` 0), or where the side file is
    missing, unreadable or of another run (another fingerprint)."""
    if directory is None or start == 0:
        return []
    try:
        saved = json.loads((directory / SECONDS_FILE).read_text(encoding="utf-8"))
        seconds = [float(x) for x in saved["processes"]]
    except (OSError, ValueError, TypeError, KeyError):
        return []
    if saved.get("fingerprint") != fingerprint or not all(x >= 0 for x in seconds):
        return []
    return seconds


def write_seconds(directory: Path, fingerprint: str, processes: list[float]) -> None:
    """:data:`SECONDS_FILE` in ``directory``, replaced atomically (a kill leaves the old one)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{SECONDS_FILE}.tmp"
    tmp.write_text(json.dumps({"fingerprint": fingerprint, "processes": processes}),
                   encoding="utf-8")
    os.replace(tmp, directory / SECONDS_FILE)


def save_checkpoint(directory: Path, round_done: int, state: ServerState, store: ClientStore,
                    history: list[dict], fingerprint: str,
                    client_history: list[dict] | None = None, scale: Scale | None = None) -> None:
    """Client files first, then the server file naming them (each atomic), then old files go.
    ``scale``, the divergence guard's (:func:`initial_scale`), is kept so that a resumed run is
    measured against the same loss."""
    manifest = store.save(round_done)
    tensors = {f"w/{k}": v for k, v in state.weights.items()} | flatten_groups(state.extra, "x/")
    meta = {"round": round_done, "history": history, "fingerprint": fingerprint,
            "server_meta": state.meta, "clients": {str(c): f for c, f in manifest.items()},
            "client_history": client_history or [], "scale": list(scale) if scale else None}
    save_tensors(directory / SERVER_FILE, tensors, {"fedpipe.checkpoint": json.dumps(meta)})
    store.prune()


def load_checkpoint(directory: Path) -> tuple[dict, ServerState, ClientStore]:
    """The checkpoint in ``directory``, its server file verified against its content hash and
    finite (InputError naming the file otherwise); client files are checked by
    :func:`_readable_checkpoint` and read when needed."""
    path = directory / SERVER_FILE
    tensors, meta = read_tensors(path)
    if "clients" not in meta:
        raise InputError(path, "has no checkpoint metadata (not a checkpoint)", None)
    weights = {k[2:]: v for k, v in tensors.items() if k.startswith("w/")}
    state = ServerState(weights, unflatten_groups(tensors, "x/"), meta["server_meta"])
    if not (all_finite(state.weights) and _extras_finite(state.extra)):
        raise InputError(path, "holds non-finite values", None)
    store = ClientStore(directory / CLIENTS_DIR)
    store.load({int(c): f for c, f in meta["clients"].items()})
    return meta, state, store


def _readable_checkpoint(directory: Path) -> tuple[dict, ServerState, ClientStore] | None:
    """The checkpoint in ``directory`` (None if there is none). One that cannot be resumed (a
    truncated, corrupt or non-finite server or client file, bytes that do not match the hash they
    were written with, a manifest naming a missing file, a client file that is not its slot's
    client's state after the round its name gives: swapped, copied or renamed) is set aside (the
    folder renamed to ``<name>.corrupt-<time>``, with one log line naming the file) and the run
    starts fresh: a bad checkpoint is never resumed, and never blocks its stage. Every client file
    is read once here (then dropped: states are loaded again when needed)."""
    if not (directory / SERVER_FILE).is_file():
        return None
    try:
        meta, state, store = load_checkpoint(directory)
        for cid, name in store.files.items():
            if name:
                read_client_file(directory / CLIENTS_DIR / name, cid)
                if int(CLIENT_FILE.fullmatch(name)["round"]) > int(meta["round"]):
                    raise InputError(directory / CLIENTS_DIR / name, "is from a round after the "
                                     f"checkpoint's ({meta['round']})", None)
        return meta, state, store
    except Exception as e:  # noqa: BLE001 (any unreadable part: InputError, KeyError, ...)
        what = str(e) if isinstance(e, InputError) else f"{type(e).__name__}: {e}"
        set_aside(directory, f"checkpoint not resumed: {(what.strip().splitlines() or [''])[0]}")
        return None


# -- the loop ----------------------------------------------------------------------------------
def settings_in_play(strategy: Strategy, section: str) -> str:
    """The settings a divergence may come from, as given (the error names them all and guesses at
    none): the local training of ``section`` (``fl`` or ``diffusion_fl``) and the algorithm's own
    hyperparameters."""
    local = strategy.local
    parts = [f"{section}.local.{k}={getattr(local, k)}"
             for k in ("lr", "optimizer", "momentum", "weight_decay", "grad_clip", "lr_decay")
             if hasattr(local, k)]
    cfg = strategy.cfg
    if dataclasses.is_dataclass(cfg):
        own = ", ".join(f"{f.name}={getattr(cfg, f.name)}" for f in dataclasses.fields(cfg))
        if own:
            parts.append(f"algorithms.{strategy.name} ({own})")
    return "settings in play: " + ", ".join(parts)


def _guard_losses(updates: Sequence[ClientUpdate], round_: int, hint: str = "") -> None:
    """Non-finite local loss: stop, naming the round and client (free: losses are already floats)."""
    for u in updates:
        loss = u.metrics.get("loss", 0.0)
        if not np.isfinite(loss):
            raise DivergenceError(f"diverged: round {round_ + 1}, client {u.client_id}: "
                                  f"non-finite local loss ({loss}); {hint}")


class Scale(NamedTuple):
    """What :func:`guard_growth` measures a local loss against: a loss and what it was."""

    loss: float
    what: str


def initial_scale(strategy: Strategy, executor: Executor, payloads: dict[int, Any],
                  jobs: Sequence[tuple[int, ClientState, ClientData]], seed: int) -> Scale | None:
    """The initial model's mean task loss on round 1's clients (``strategy.probe`` on each one's
    first ``local.batch_size`` samples: one batch's memory and time, once per run), weighted by
    samples; None when there is nothing finite and non-zero to measure. The guard's scale: a run
    whose loss explodes within round 1 and then sits at chance (a 4-client FedAvg at lr 3 on
    digits: 2.3 at the start, 6e12 in round 1, 1.4 after) is caught in round 1, which a scale taken
    from round 1's own loss would miss."""
    size = max(int(getattr(strategy.local, "batch_size", 1)), 1)
    heads = [(c, st, d if len(d) <= size else ClientData(d.x[:size], d.y[:size], d.skew))
             for c, st, d in jobs]
    if not heads:
        return None
    reports = executor.probe(strategy, payloads, heads, seed)
    weights = np.array([len(d) for _, _, d in heads], dtype=np.float64)
    losses = np.array([reports[c].get("loss", np.nan) for c, _, _ in heads], dtype=np.float64)
    loss = float((weights * losses).sum() / weights.sum()) if weights.sum() > 0 else float("nan")
    return Scale(loss, "the initial model's loss on round 1's clients") if (
        np.isfinite(loss) and loss != 0) else None


def first_loss(history: Sequence[dict[str, float]]) -> Scale | None:
    """The run's first recorded training loss (None before one): the scale of :func:`guard_growth`
    where the initial loss is unknown (a checkpoint written before it was recorded)."""
    for rec in history:
        if "train_loss" in rec and np.isfinite(rec["train_loss"]) and rec["train_loss"] != 0:
            return Scale(float(rec["train_loss"]),
                         f"the first training loss, round {int(rec['round'])}")
    return None


def guard_growth(updates: Sequence[ClientUpdate], round_: int, scale: Scale | None,
                 factor: float, hint: str = "", section: str = "fl") -> None:
    """A local loss more than ``factor`` times (in magnitude) the run's ``scale`` (its initial
    loss, :func:`initial_scale`): stop, naming the round, the client whose loss is largest, and the
    settings in play. A run whose loss grows to 1e28 but stays finite (FedAvg on digits with SGD lr
    3) is as diverged as one whose loss is NaN, and never passes as a result.

    The default ``fl.divergence_factor`` (1e4) was measured: the largest local loss of any client
    in any round over the initial loss, at each study's own settings on digits, was 0.75 for the
    default study's fedavg, fedprox, scaffold and feddyn (seeds 0-4), 1.07 for equitable_smoke's 7
    methods (seeds 0-1), 1.11 for fedptr_smoke's (seed 0) but feddc's 3.9 (its penalty terms, round
    20), 0.99 for fednh_smoke's 10 and 0.59 for fedddpm_smoke's diffusion-track fedavg, fedprox,
    scaffold and mofedsam (60 rounds): 2,500 times below the bound or more. FedAvg at lr 3 passes it
    in round 1 (1e8 to 1e12 times the initial loss)."""
    if scale is None:
        return
    bound = factor * abs(scale.loss)
    loss, cid = max(((abs(u.metrics.get("loss", 0.0)), u.client_id) for u in updates),
                    default=(0.0, -1))
    if loss > bound:
        raise DivergenceError(
            f"diverged: round {round_ + 1}, client {cid}: local loss {loss:.4g} is more than "
            f"{section}.divergence_factor={factor:g} times {scale.what} ({scale.loss:.4g}); {hint}")


def _extras_finite(groups: dict[str, Weights]) -> bool:
    return all(all_finite(g) for g in groups.values())


def _guard_state(state: ServerState, updates: Sequence[ClientUpdate], round_: int,
                 hint: str = "") -> None:
    """Non-finite update: checked once on the aggregate; only then are the clients scanned to name
    the culprit (one finiteness check per tensor per round instead of per client)."""
    if all_finite(state.weights) and _extras_finite(state.extra):
        return
    bad = [u.client_id for u in updates if not (all_finite(u.weights) and _extras_finite(u.extra))]
    who = f"client {bad[0]}" if bad else "server aggregation"
    raise DivergenceError(f"diverged: round {round_ + 1}, {who}: non-finite model update; {hint}")


def personal_models(strategy: Strategy, state: ServerState, store: ClientStore,
                    clients: Sequence[ClientData], seed: int, round_: int) -> dict[int, Weights]:
    """Every client's own model (a client never selected yet starts from ``init_client``)."""
    out = {}
    for cid, data in enumerate(clients):
        cstate = store.get(cid) if cid in store else strategy.init_client(cid)
        w = strategy.personalized_model(state, cstate, data,
                                        torch_generator(seed, "personalize", round_, cid), cid)
        if w is not None:
            out[cid] = w
    return out


def _split_record(res: dict[str, Any], round_: int) -> tuple[dict[str, float], list[dict]]:
    """Scalars for the history; per-client vectors (lists) as rows {round, client, metric...}."""
    scalars = {k: float(v) for k, v in res.items() if not isinstance(v, list | tuple | np.ndarray)}
    vectors = {k: list(v) for k, v in res.items() if k not in scalars}
    rows = []
    if vectors:
        n = len(next(iter(vectors.values())))
        for cid in range(n):
            rows.append({"round": round_, "client": cid,
                         **{k: float(v[cid]) for k, v in vectors.items()}})
    return scalars, rows


def run_federated(strategy: Strategy, model: torch.nn.Module, clients: Sequence[ClientData],
                  fl: FLConfig, seed: int, *,
                  evaluate: Evaluate | None = None,
                  checkpoint_dir: str | Path | None = None, fingerprint: str = "",
                  stop_after: int | None = None, server_data: ServerData | None = None,
                  score: Score | None = None,
                  on_round: Callable[[dict[str, float]], None] | None = None,
                  progress: bool = True, section: str = "fl") -> RunResult:
    """Run ``fl.rounds`` rounds of ``strategy`` from ``model``'s initial weights.

    ``evaluate(state, personal)`` scores the global model (and, for a method with personal models,
    ``personal`` = {client: weights}); it returns scalars (into the history, prefixed ``test_``) and
    per-client lists (into ``client_history``). With ``checkpoint_dir``, a checkpoint is written
    every ``fl.checkpoint_every`` rounds, after any round ending ``fl.checkpoint_seconds`` after the
    last one, and after the last round; one with the same ``fingerprint`` found
    there is resumed from. ``stop_after`` stops after that many rounds in total (simulates an
    interruption; used by tests). A strategy ends training early by setting
    ``state.meta["stopped_at"]`` in a hook (FedDDPM+'s QuickTest): the engine records that round,
    checkpoints it and stops. ``server_data`` and ``score`` reach the server hooks in
    :class:`~fedpipe.fl.strategy.RoundInfo`. ``section`` is the params section of ``fl``
    (``fl`` or ``diffusion_fl``), named when a round diverges.
    """
    hint = settings_in_play(strategy, section)
    n = len(clients)
    train = strategy.training_clients(clients)  # Centralized: one pooled client
    pooled = train is not clients  # then every client takes part in every round
    per_round = fl.clients_per_round(len(train))
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
    start, history, client_history = 0, [], []
    scale: Scale | None = None  # the guard's scale (initial_scale), measured in round 1
    state = strategy.init_server(model)
    store = ClientStore(ckpt / CLIENTS_DIR if ckpt is not None else None)
    saved = _readable_checkpoint(ckpt) if ckpt is not None else None
    if saved is not None:
        meta, saved_state, saved_store = saved
        if meta.get("fingerprint") == fingerprint:
            start, history = int(meta["round"]), list(meta["history"])
            scale = Scale(*meta["scale"]) if meta.get("scale") else first_loss(history)
            client_history = list(meta.get("client_history", []))
            state, store = saved_state, saved_store
            device = module_device(model)  # the run's device (a checkpoint is read on the CPU)
            state = ServerState(groups_to({"w": state.weights}, device)["w"],
                                groups_to(state.extra, device), state.meta)
            store.device = device
            log.info("resuming from checkpoint at round %d", start)
        else:
            log.info("ignoring checkpoint with a different fingerprint (other params or data)")
    executor = EXECUTORS[fl.executor](fl)
    available = list(range(len(train)))

    def client_state(cid: int) -> ClientState:
        if cid not in store:
            store.put(cid, strategy.init_client(cid))
        return store.get(cid)

    def probe_for(state_: ServerState, r: int):
        def probe(candidates: Sequence[int]) -> dict[int, dict[str, float]]:
            cands = sorted(int(c) for c in candidates)
            payloads = {c: strategy.payload(state_, r, c) for c in cands}
            return executor.probe(strategy, payloads,
                                  [(c, client_state(c), train[c]) for c in cands], seed)
        return probe

    end = start if state.meta.get("stopped_at") is not None else fl.rounds  # stopped early before
    bar = tqdm(range(start, end), desc=f"{strategy.name}", unit="round",
               initial=start, total=fl.rounds, disable=not progress, leave=False,
               mininterval=1.0)
    rounds_done = start
    personal, personal_round = None, -1
    saved_at = time.monotonic()  # when the last checkpoint was written (fl.checkpoint_seconds)
    earlier = earlier_seconds(ckpt, fingerprint, start)  # the processes before a resume
    began, total = time.perf_counter(), sum(earlier)
    for r in bar:
        selected = strategy.select_clients(state, r, available, per_round,
                                           numpy_rng(seed, "client-sampling", r), probe_for(state, r))
        selected = sorted(int(c) for c in selected)
        payloads = {cid: strategy.payload(state, r, cid) for cid in selected}
        jobs = [(cid, client_state(cid), train[cid]) for cid in selected]
        if r == 0:  # the loss a diverging run is measured against, before any training
            scale = initial_scale(strategy, executor, payloads, jobs, seed)
        results = executor.run(strategy, payloads, jobs, seed)
        updates = tuple(u for u, _, _ in results)
        _guard_losses(updates, r, hint)
        guard_growth(updates, r, scale, fl.divergence_factor, hint, section)
        for cid, (_, cstate, _) in zip(selected, results, strict=True):
            store.put(cid, cstate)
        rnd = RoundInfo(index=r, total=fl.rounds, seed=seed, updates=updates,
                        server_data=server_data, score=score, selected=tuple(selected))
        state = strategy.aggregate(state, rnd)
        _guard_state(state, updates, r, hint)
        state = strategy.server_update(state, rnd)
        sizes = np.array([u.num_samples for u in updates], dtype=np.float64)
        losses = np.array([u.metrics.get("loss", np.nan) for u in updates])
        record: dict[str, float] = {"round": float(r + 1)}
        if sizes.sum() > 0:  # a round in which no client trained (aux_only) has no clients' loss
            record["train_loss"] = float((sizes * losses).sum() / sizes.sum())
        record["clients"] = float(len(selected))
        record |= {k: float(v) for k, v in strategy.round_metrics(state, rnd).items()}
        stopped = state.meta.get("stopped_at") is not None  # the strategy ended training
        interrupted = stop_after is not None and r + 1 >= stop_after
        # the last round trained is always scored: the run's end or the strategy's stop (FedDDPM+
        # can stop before the first eval_every round), not a simulated interruption
        if evaluate is not None and ((r + 1) % fl.eval_every == 0 or r + 1 == fl.rounds or stopped):
            if strategy.personalizes:
                personal, personal_round = personal_models(strategy, state, store, clients, seed,
                                                           r), r + 1
            res = evaluate(state, personal if strategy.personalizes else None)
            if any(isinstance(v, list | tuple | np.ndarray) for v in res.values()):
                res = {**res, "participant": [float(pooled or c in selected) for c in range(n)]}
            scalars, rows = _split_record(res, r + 1)
            record |= {f"test_{k}": v for k, v in scalars.items()}
            client_history += rows
        history.append(record)
        rounds_done = r + 1
        now = time.perf_counter() - began
        total = sum(earlier) + now
        if ckpt is not None:
            write_seconds(ckpt, fingerprint, [*earlier, now])
        if on_round is not None:  # the whole training time so far: MLflow's, not the history's
            on_round({**record, "train_seconds_total": total})
        bar.set_postfix({k: f"{v:.4f}" for k, v in record.items()
                         if k in ("train_loss", "test_accuracy")})
        last = r + 1 == fl.rounds or stopped or interrupted
        due = (r + 1) % fl.checkpoint_every == 0 or (
            fl.checkpoint_seconds > 0 and time.monotonic() - saved_at >= fl.checkpoint_seconds)
        if ckpt is not None and (due or last):
            save_checkpoint(ckpt, r + 1, state, store, history, fingerprint, client_history,
                            scale)
            saved_at = time.monotonic()
        if stopped or interrupted:
            break
    bar.close()
    if strategy.personalizes and personal_round != rounds_done:
        personal = personal_models(strategy, state, store, clients, seed, max(rounds_done - 1, 0))
    return RunResult(state, store.all(), history, resumed_from=start, rounds_done=rounds_done,
                     client_history=client_history, personal=personal, train_seconds_total=total)
