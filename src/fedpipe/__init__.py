"""fedpipe: a reproducible research pipeline for federated learning under non-IID data.

Layers (see docs/architecture.md): config -> data -> models -> tasks -> fl -> algorithms -> metrics
-> tracking; `fedpipe.io` (atomic writes, hashing) and `fedpipe.rng` (seed streams) are utilities
every layer may use.
"""

__version__ = "0.1.0"
