"""The Ray executor (``fl.executor: ray``): a round's ``client_update`` (and ``probe``) calls run as
Ray tasks, on a local Ray instance or on an existing cluster (``fl.ray.address``).

Bit-identical to :class:`~fedpipe.fl.executors.SerialExecutor` on CPU. A task computes exactly what the
serial loop computes for its client:

- the same inputs: the strategy (pickled once per change, see below), the client's payload and state,
  its data;
- the same randomness: the generator is made inside the task from the same stream,
  ``(seed, "client-update", round, client)`` (``"client-probe"`` for probes), through
  :func:`fedpipe.rng.torch_generator`; nothing else draws random numbers;
- the same floating-point arithmetic: torch's results depend on its thread count in the last bits, so
  each task runs with the driver's thread count (``torch.get_num_threads()`` when the round starts,
  which a stage sets from ``FEDPIPE_THREADS``) and reserves that many CPUs, so Ray never runs more
  threads than cores; also the driver's default dtype.

Results come back in job order (the engine sorts by client id), so the order in which tasks finish
does not matter.

What is shipped, and when:

- **Client data once per run**: the first time a client is selected its :class:`ClientData` is put in
  Ray's object store (as numpy arrays, which tasks read without a copy from shared memory); later
  rounds pass the reference only.
- **The strategy once per change**: it is pickled without its scratch model (a working copy it
  rebuilds) and put in the object store; a round whose pickle is the same as the previous round's
  reuses the reference, and each worker unpickles a strategy once and keeps it.
- **Payload and client state every round** (they change every round).

Where it runs: with ``fl.ray.address`` null, a local instance is started on first use with as many
CPUs as ``FEDPIPE_WORKERS`` (default: the cores this process may use; at least the torch thread count),
no dashboard and Ray's own logging at WARNING; it lives as long as the process. Its session (sockets,
logs, spilled objects) goes into a folder of this user alone (:func:`private_temp_dir`:
``<temp>/fedpipe-ray-<uid>/ray``, the enclosing folder of mode 0700), not into Ray's default
``/tmp/ray``, which every user of the machine may write; with ``RAY_TMPDIR`` set, Ray's default under
it. With an address (a
cluster started with ``ray start --head`` on one machine and ``ray start --address=<head>:6379`` on the
others), fedpipe's own source is shipped to the cluster with the job (``runtime_env.py_modules``), so
every node runs the driver's code; each node needs the same Python packages (``pip install -e .``).
If the process is already connected to Ray (``ray.init`` called before), that connection is used.
``fl.ray.gpus_per_client`` GPUs are reserved by each task (Ray sets ``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import stat
import tempfile
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from fedpipe.config import ConfigError
from fedpipe.config.fl import RayConfig
from fedpipe.data import ClientData
from fedpipe.rng import torch_generator

log = logging.getLogger(__name__)

START_ATTEMPTS = 3
"""Tries to start a local Ray instance (Ray gives its raylet a fixed 30 s to come up)."""

SCRATCH_ATTRS = ("_scratch", "_slots", "_held", "_tied")
"""The base Strategy's working copy of the model: rebuilt where the strategy is unpickled."""


def local_cpus() -> int:
    """CPUs of a local instance: ``FEDPIPE_WORKERS`` if set (as :mod:`fedpipe.pipeline.workers`
    reads it; not imported here, the engine does not depend on the pipeline), else the cores this
    process may use."""
    raw = os.environ.get("FEDPIPE_WORKERS", "").strip()
    if not raw:
        return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                   else (os.cpu_count() or 1))
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError("FEDPIPE_WORKERS", raw, "an integer >= 1 (the number of worker processes)")
    return int(raw)


TEMP_PREFIX = "fedpipe-ray-"


def private_temp_dir() -> str | None:
    """The root folder of a local Ray instance's session: ``<temp>/fedpipe-ray-<uid>/ray``
    (``tempfile.gettempdir()``: ``$TMPDIR`` or ``/tmp``). Ray makes every folder of its session
    writable by all (mode 0777, for clusters shared between users), so the privacy is the
    enclosing folder's: ``fedpipe-ray-<uid>`` is made with mode 0700 and used only while it is a
    real folder of this user that no one else may enter; otherwise a fresh private one
    (``tempfile.mkdtemp``, 0700) encloses it. None where ``RAY_TMPDIR`` is set (Ray's own setting:
    the user chose) or on a system without user ids. Kept short: Ray's Unix sockets live under it,
    and a socket's path may not exceed 107 bytes."""
    if os.environ.get("RAY_TMPDIR") or not hasattr(os, "getuid"):
        return None
    uid = os.getuid()
    path = os.path.join(tempfile.gettempdir(), f"{TEMP_PREFIX}{uid}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return os.path.join(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{uid}-"), "ray")
    st = os.lstat(path)
    if not (stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077):
        # another user's, a link, or open to others (files may have been planted): not used
        log.warning("%s is not a folder of this user alone: the local Ray instance uses a fresh "
                    "one", path)
        path = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{uid}-")
    return os.path.join(path, "ray")


def reachable(address: str, timeout: float = 10.0) -> None:
    """A ``host:port`` (``ray://host:port``) that accepts no TCP connection is a ConfigError at once
    (Ray itself retries for minutes). ``auto`` is left to Ray."""
    import socket

    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise ConfigError("fl.ray.address", address, "the address of a running Ray cluster "
                          f"(ray start --head); nothing answers there: {e}") from None


def connect(cfg: RayConfig, threads: int = 1) -> None:
    """Connect to Ray (once per process): the cluster at ``cfg.address``, or a local instance.
    An unreachable address is a :class:`ConfigError` on ``fl.ray.address``."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report from a research run
    warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
    quiet = {"include_dashboard": False, "logging_level": logging.WARNING}
    if cfg.address is None:
        for attempt in range(START_ATTEMPTS):
            try:
                temp = private_temp_dir()
                ray.init(num_cpus=max(local_cpus(), threads),
                         **({"_temp_dir": temp} if temp else {}), **quiet)
                return
            except Exception as e:  # noqa: BLE001 (Ray raises a bare Exception for this)
                # Ray waits a fixed 30 s for its raylet to register; a heavily loaded machine can
                # take longer: start again, a few times
                if "timed out during startup" not in str(e) or attempt + 1 == START_ATTEMPTS:
                    raise
                log.warning("local Ray instance timed out during start-up; starting it again")
                ray.shutdown()
    import fedpipe

    reachable(cfg.address)
    try:
        ray.init(address=cfg.address, runtime_env={"py_modules": [fedpipe]}, **quiet)
    except (ConnectionError, RuntimeError, TimeoutError) as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise ConfigError("fl.ray.address", cfg.address,
                          f"the address of a running Ray cluster ({type(e).__name__}: {first})"
                          ) from None


def check_resources(cfg: RayConfig, threads: int) -> None:
    """Some node must offer ``threads`` CPUs (and ``gpus_per_client`` GPUs): otherwise the tasks
    would wait forever. Raises ConfigError naming the setting."""
    import ray

    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    cpus = max((n.get("CPU", 0) for n in nodes), default=0)
    if cpus < threads:
        raise ConfigError("FEDPIPE_THREADS", threads,
                          f"at most the CPUs of the largest Ray node ({cpus:g}): a client task "
                          "runs with the driver's torch thread count")
    if cfg.gpus_per_client > 0:
        gpus = max((n.get("GPU", 0) for n in nodes), default=0)
        if gpus < cfg.gpus_per_client:
            raise ConfigError("fl.ray.gpus_per_client", cfg.gpus_per_client,
                              f"at most the GPUs of the largest Ray node ({gpus:g})")


# -- what travels -----------------------------------------------------------------------------
def _numpy_ok(t: Any) -> bool:
    return (isinstance(t, torch.Tensor) and t.device.type == "cpu" and not t.requires_grad
            and t.dtype not in (torch.bfloat16,) and not t.is_sparse)


def pack_data(data: Any) -> tuple:
    """A client's data as it goes into the object store: a plain :class:`ClientData` as numpy
    arrays (read in a task without a copy), anything else as it is."""
    if type(data) is ClientData and _numpy_ok(data.x) and _numpy_ok(data.y):
        return ("numpy", data.x.cpu().numpy(), data.y.cpu().numpy(), data.skew)
    return ("object", data)


def unpack_data(packed: tuple) -> Any:
    if packed[0] == "object":
        return packed[1]
    _, x, y, skew = packed
    with warnings.catch_warnings():  # read-only shared memory; batches index (copy) it
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return ClientData(torch.from_numpy(x), torch.from_numpy(y), skew)


def strategy_blob(strategy: Any) -> bytes:
    """The strategy pickled without its scratch model."""
    import cloudpickle

    light = copy.copy(strategy)
    for attr in SCRATCH_ATTRS:
        light.__dict__.pop(attr, None)
    if hasattr(strategy, "_scratch"):
        light._scratch = None
    return cloudpickle.dumps(light)


# -- the task (runs in a Ray worker) --------------------------------------------------------------
_STRATEGIES: dict[str, Any] = {}  # per worker: strategy key -> unpickled strategy
_KEEP = 4


def _strategy(key: str, box: list) -> Any:
    s = _STRATEGIES.get(key)
    if s is None:
        import pickle

        import ray

        s = pickle.loads(ray.get(box[0]))
        while len(_STRATEGIES) >= _KEEP:
            _STRATEGIES.pop(next(iter(_STRATEGIES)))
        _STRATEGIES[key] = s
    return s


def client_task(kind: str, key: str, box: list, payload: Any, client_state: Any, data: tuple,
                seed: int, client_id: int, threads: int, dtype: torch.dtype) -> Any:
    """One client's ``client_update`` (``kind="update"``) or ``probe`` (``kind="probe"``), with the
    serial executor's stream, thread count and default dtype."""
    torch.set_num_threads(threads)
    torch.set_default_dtype(dtype)
    strategy = _strategy(key, box)
    cdata = unpack_data(data)
    if kind == "update":
        gen = torch_generator(seed, "client-update", payload.round, client_id)
        return strategy.client_update(payload, client_state, cdata, gen, client_id)
    gen = torch_generator(seed, "client-probe", payload.round, client_id)
    return strategy.probe(payload, client_state, cdata, gen, client_id)


# -- the executor ---------------------------------------------------------------------------------
class RayExecutor:
    """Runs a round's client work as Ray tasks (see the module docstring)."""

    def __init__(self, cfg: RayConfig | None = None):
        self.cfg = cfg if cfg is not None else RayConfig()
        self._remote = None
        self._data: dict[int, tuple[Any, Any]] = {}  # client id -> (its ClientData, object ref)
        self._strategy: tuple[str, Any] | None = None  # (key, ref) of the last strategy shipped

    @classmethod
    def from_config(cls, cfg: RayConfig) -> RayExecutor:
        """The run's executor (made before its first round): a cluster address is checked now."""
        if cfg.address is not None:
            reachable(cfg.address)
        return cls(cfg)

    def _setup(self, threads: int) -> Any:
        import ray

        connect(self.cfg, threads)
        if self._remote is None:
            check_resources(self.cfg, threads)
            self._remote = ray.remote(client_task)
        return self._remote.options(num_cpus=threads, num_gpus=self.cfg.gpus_per_client)

    def _data_ref(self, cid: int, data: Any) -> Any:
        import ray

        held = self._data.get(cid)
        if held is None or held[0] is not data:
            held = (data, ray.put(pack_data(data)))
            self._data[cid] = held
        return held[1]

    def _strategy_ref(self, strategy: Any) -> tuple[str, Any]:
        import ray

        blob = strategy_blob(strategy)
        key = hashlib.sha256(blob).hexdigest()
        if self._strategy is None or self._strategy[0] != key:
            self._strategy = (key, ray.put(blob))
        return self._strategy

    def _map(self, kind: str, strategy: Any, payloads: dict[int, Any], jobs: Sequence,
             seed: int) -> list:
        import ray

        if not jobs:
            return []
        threads = torch.get_num_threads()
        remote = self._setup(threads)
        key, ref = self._strategy_ref(strategy)
        dtype = torch.get_default_dtype()
        futures = [remote.remote(kind, key, [ref], payloads[cid], cstate, self._data_ref(cid, data),
                                 seed, cid, threads, dtype)
                   for cid, cstate, data in jobs]
        return ray.get(futures)

    def run(self, strategy, payloads, jobs, seed):
        return self._map("update", strategy, payloads, jobs, seed)

    def probe(self, strategy, payloads, jobs, seed):
        return dict(zip((cid for cid, _, _ in jobs),
                        self._map("probe", strategy, payloads, jobs, seed), strict=True))
