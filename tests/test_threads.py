"""A stage's torch thread count (fedpipe.cli.stage_threads): one by default, whatever the machine and
its load; ``FEDPIPE_THREADS=n`` as given; ``FEDPIPE_THREADS=auto`` one per core other processes leave
free (fedpipe.cli.auto_threads), at least one. The speed of each choice on a shared machine is a
ratio in benchmarks/parallel_threads.py, not a timed test."""

import os
import subprocess
import sys
import time

import pytest

from fedpipe.cli import (
    DEFAULT_THREADS,
    auto_threads,
    busy_cores,
    stage_threads,
)
from fedpipe.config import ConfigError

RULE = [  # cores usable, cores' worth of CPU others use -> threads
    (2, 0.0, 2), (2, 0.2, 2), (2, 0.3, 1), (2, 1.0, 1), (2, 1.9, 1), (2, 6.0, 1),
    (1, 0.0, 1), (1, 3.0, 1),
    (16, 0.0, 16), (16, 1.0, 15), (16, 4.6, 11), (16, 15.5, 1), (16, 40.0, 1),
]


@pytest.mark.parametrize("cores, busy, threads", RULE)
def test_auto_is_one_thread_per_free_core_at_least_one(cores, busy, threads):
    assert auto_threads(cores, busy) == threads


def test_auto_never_gives_more_threads_as_the_load_rises():
    for cores in (1, 2, 3, 8, 16):
        counts = [auto_threads(cores, b / 10) for b in range(0, 10 * cores + 30)]
        assert counts[0] == cores and counts[-1] == 1
        assert all(a >= b for a, b in zip(counts, counts[1:], strict=False)), (cores, counts)


def test_auto_refuses_nonsense():
    for cores, busy in ((0, 0.0), (2, -0.5)):
        with pytest.raises(ValueError):
            auto_threads(cores, busy)


def test_unset_is_one_thread_and_a_number_is_taken_as_given(monkeypatch):
    monkeypatch.delenv("FEDPIPE_THREADS", raising=False)
    assert stage_threads() == DEFAULT_THREADS == 1
    assert stage_threads("") == stage_threads(" ") == 1
    assert stage_threads("3") == 3 and stage_threads(" 2 ") == 2
    for bad in ("0", "two", "-3", "1.5", "AUTO x"):
        with pytest.raises(ConfigError, match="FEDPIPE_THREADS") as info:
            stage_threads(bad)
        assert "auto" in str(info.value) and "\n" not in str(info.value)


def test_auto_follows_the_measured_load(monkeypatch):
    import fedpipe.cli as cli

    cores = len(os.sched_getaffinity(0))
    for busy, want in ((0.0, cores), (float(cores), 1)):
        monkeypatch.setattr(cli, "busy_cores", lambda busy=busy: busy)
        assert stage_threads("auto") == want


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="no /proc/stat")
def test_busy_cores_sees_a_process_that_spins_on_a_core():
    """A child spinning on one core of this process's affinity counts as about one core busy
    there (other workers on the machine may add to it, never take from it)."""
    cpu = min(os.sched_getaffinity(0))
    spin = subprocess.Popen([sys.executable, "-c",
                             f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        time.sleep(0.3)
        assert busy_cores({cpu}, seconds=0.3) > 0.7
    finally:
        spin.kill()
        spin.wait()
    assert 0.0 <= busy_cores() <= len(os.sched_getaffinity(0)) + 1e-6
