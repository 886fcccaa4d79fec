"""Independent per-client jobs in worker processes (the warm-up's local DDPMs).

A job must draw all its randomness from its own seeded streams (:mod:`fedpipe.rng`), so that its
result does not depend on which process runs it or when. torch's results depend on its thread count in
the last bits, so a job always runs with one thread, in a worker or in the calling process
(:func:`one_thread`): the results are the same for every ``FEDPIPE_WORKERS`` and every machine's core
count. Workers are spawned (not forked: a forked
child of a process that already ran torch's OpenMP pool can hang) and run one torch thread each, so
``n`` workers use ``n`` cores without oversubscribing them.

``FEDPIPE_WORKERS`` sets the number of processes (default: the cores this process may use; ``1`` runs
jobs in the calling process). It changes only the wall time, so it is not a DVC param: changing it
re-runs nothing.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

ENV = "FEDPIPE_WORKERS"


def worker_count() -> int:
    """``FEDPIPE_WORKERS`` if set (an integer >= 1), else the number of usable cores."""
    raw = os.environ.get(ENV)
    if raw is None or raw.strip() == "":
        return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                   else (os.cpu_count() or 1))
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        from fedpipe.config import ConfigError

        raise ConfigError(ENV, raw, "an integer >= 1 (the number of worker processes)")
    return n


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with one torch thread (what a worker process has), then restore the count: a
    job's floating-point results depend on torch's thread count, so a job run in the calling process
    gives the same bits as in a worker."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _init_worker() -> None:
    import signal

    import torch

    torch.set_num_threads(1)
    # Ctrl-C reaches the whole process group: the calling process handles it (and stops the
    # workers), so a worker does not print a traceback of its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def map_in_processes(fn: Callable[[Any], Any], jobs: Iterable[Any], workers: int,
                     ahead: int = 2) -> Iterator[Any]:
    """``fn(job)`` for every job in ``workers`` spawned processes; results in completion order (each
    result should name its job). An exception in a job is raised here. When the caller stops early
    (an exception, Ctrl-C), the workers are stopped at once rather than waited for: a job's output is
    written atomically, so a stopped job leaves nothing half-written.

    At most ``ahead x workers`` jobs are submitted and not yet yielded, and a result is let go once
    yielded: a warm-up at paper size returns 100 clients' UNets (143 MB each on CIFAR), each tensor
    a shared-memory file descriptor until freed, which, all held, ran out of descriptors and memory."""
    ctx = mp.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker)
    todo = iter(jobs)
    pending: set[Future] = set()

    def fill() -> None:
        for job in itertools.islice(todo, max(ahead * workers - len(pending), 0)):
            pending.add(pool.submit(fn, job))

    try:
        fill()
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            while done:
                fut = done.pop()
                pending.discard(fut)
                result = fut.result()
                del fut  # the future holds the result: only the caller does now
                fill()
                yield result
                del result
    except BaseException:
        for f in pending:
            f.cancel()
        # no public API stops a running job; the pool's processes are terminated directly
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
