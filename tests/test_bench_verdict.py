"""`make bench` (benchmarks/engine_overhead.py) ends in a verdict against its target."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from engine_overhead import TARGET, verdict  # noqa: E402


def test_the_engine_benchmark_states_met_or_missed_with_its_target():
    assert TARGET == 1.10
    assert verdict(1.089) == "verdict: met (ratio 1.089 <= target 1.10)"
    assert verdict(1.10).startswith("verdict: met")
    missed = verdict(1.149)
    assert missed.startswith("verdict: missed (ratio 1.149 > target 1.10")
