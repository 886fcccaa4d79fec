"""Executors: who runs a round's client work (``fl.executor``).

An executor is handed the round's jobs, ``(client_id, client_state, data)`` sorted by client id, and
runs ``strategy.client_update`` (or ``strategy.probe``) for each: it sees a strategy's client side
only (:class:`~fedpipe.fl.strategy.ClientSide`, and the declarations and helpers of
:class:`~fedpipe.fl.strategy.Method`), never a server or evaluation hook, with the client's own stream
``(seed, "client-update", round, client)`` (``"client-probe"`` for probes), and returns the results
in job order. :class:`SerialExecutor` is the reference; the batched executor
(:mod:`fedpipe.fl.batched`) and the Ray executor (:mod:`fedpipe.fl.ray_executor`) compute the same
results, and the batched one falls back to this one for what it cannot vectorise. The engine's
``EXECUTORS`` table maps ``fl.executor`` to a factory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from fedpipe.data import ClientData
from fedpipe.fl.state import ClientState, ClientUpdate
from fedpipe.rng import torch_generator

if TYPE_CHECKING:
    from fedpipe.fl.strategy import ClientSide

Job = tuple[int, ClientState, ClientData]


class Executor(Protocol):
    def run(self, strategy: ClientSide, payloads: dict[int, Any], jobs: Sequence[Job],
            seed: int) -> list[tuple[ClientUpdate, ClientState, dict[str, float]]]: ...

    def probe(self, strategy: ClientSide, payloads: dict[int, Any], jobs: Sequence[Job],
              seed: int) -> dict[int, dict[str, float]]: ...


class SerialExecutor:
    """Runs the round's client work one client after another, in client-id order (deterministic)."""

    def run(self, strategy, payloads, jobs, seed):
        out = []
        for cid, cstate, data in jobs:
            p = payloads[cid]
            gen = torch_generator(seed, "client-update", p.round, cid)
            out.append(strategy.client_update(p, cstate, data, gen, cid))
        return out

    def probe(self, strategy, payloads, jobs, seed):
        out = {}
        for cid, cstate, data in jobs:
            p = payloads[cid]
            out[cid] = strategy.probe(p, cstate, data, torch_generator(seed, "client-probe",
                                                                         p.round, cid), cid)
        return out
