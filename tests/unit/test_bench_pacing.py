"""The pacing benchmark runs end to end in a small run (figures are never asserted: speed is not a test)."""

from __future__ import annotations

import pytest
from bench_runner import run_benchmark


@pytest.mark.timeout(300)
def test_small_pacing_benchmark_runs_both_ways_to_the_answer():
    lines = run_benchmark("bench_pacing.py", "--rounds", "60", "--pace", "8").splitlines()
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| turns")]
    # 61 model calls, 60 per-turn figures: rows of 50 turns (2-51, then 52-61), each measured in both runs
    assert [row.split("|")[1].strip() for row in rows] == ["2-51", "52-61"]
    for row in rows:
        one, paced, ratio = (cell.strip() for cell in row.strip("|").split("|")[1:])
        assert float(one) > 0 and float(paced) > 0 and ratio.endswith("x")
    endings = [line for line in lines if " model calls, " in line]
    assert [line.split(":")[0] for line in endings] == ["one invocation", "paced by 8"]
    assert all(": 61 model calls, " in line and line.endswith("ended end_turn") for line in endings), endings
