"""Seed streams: every random draw in fedpipe comes from a generator derived from
``(seed, purpose, *keys)`` (e.g. ``(seed, "partition")`` or ``(seed, "client", round, client_id)``).

The derivation uses numpy's ``SeedSequence`` with the purpose hashed into the spawn key, so streams
for different purposes, rounds or clients are independent, and a result never depends on the order
in which clients run. The global numpy / torch RNGs are never used.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def _purpose_key(purpose: str) -> int:
    # A stable 32-bit integer for a purpose name (Python's hash() is salted per process).
    return int.from_bytes(hashlib.sha256(purpose.encode()).digest()[:4], "little")


def seed_sequence(seed: int, purpose: str, *keys: int) -> np.random.SeedSequence:
    """The SeedSequence of one stream. ``keys`` are non-negative ints (round, client id, ...)."""
    for k in keys:
        if int(k) < 0:
            raise ValueError(f"stream keys must be non-negative, got {keys}")
    return np.random.SeedSequence(int(seed), spawn_key=(_purpose_key(purpose), *map(int, keys)))


def numpy_rng(seed: int, purpose: str, *keys: int) -> np.random.Generator:
    """A numpy Generator (PCG64) for one stream."""
    return np.random.Generator(np.random.PCG64(seed_sequence(seed, purpose, *keys)))


def torch_seed(seed: int, purpose: str, *keys: int) -> int:
    """A 63-bit integer seed for a torch Generator, derived from the same stream."""
    return int(seed_sequence(seed, purpose, *keys).generate_state(2, np.uint32).view(np.uint64)[0]
               >> np.uint64(1))


def torch_generator(seed: int, purpose: str, *keys: int, device: str | torch.device = "cpu"
                    ) -> torch.Generator:
    """A torch Generator for one stream (on ``device``)."""
    g = torch.Generator(device=device)
    g.manual_seed(torch_seed(seed, purpose, *keys))
    return g
