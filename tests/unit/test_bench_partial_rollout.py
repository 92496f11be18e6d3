"""The partial-rollout benchmark runs end to end through slime's real rollout loop in a small run (figures are
never asserted: speed is not a test). It needs slime's source, as the benchmark does."""

from __future__ import annotations

import pytest
from bench_runner import run_benchmark
from partial_kit import real_slime
from slime_helpers import SLIME_SOURCE_ENV


@pytest.mark.timeout(300)
def test_small_partial_rollout_benchmark_runs_both_ways():
    with real_slime() as slime:
        if slime is None:
            pytest.skip(f"slime's source is not at hand: set {SLIME_SOURCE_ENV} (CI always has it)")
    args = ("--steps", "2", "--batch", "1", "--turns", "2", "--long-factor", "3", "--turn-s", "0.01")
    lines = run_benchmark("bench_partial_rollout.py", *args).splitlines()
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| step")]
    assert [tuple(cell.strip() for cell in row.strip("|").split("|")[:2]) for row in rows] == [
        ("0", "continue"), ("0", "restart"), ("1", "continue"), ("1", "restart"),
    ]  # fmt: skip
    for row in rows:
        generated, trained = (int(cell) for cell in row.strip("|").split("|")[3:5])
        assert trained > 0 and generated > 0
    totals = [line for line in lines if " turns generated, " in line]
    assert [line.split(":")[0] for line in totals] == ["continue", "restart"]
    assert " 0 saved " in totals[1], "restarting saves nothing"
