"""The pacing benchmark runs end to end in a small run (figures are never asserted: speed is not a test)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(300)
def test_small_pacing_benchmark_runs_both_ways_to_the_answer():
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "bench_pacing.py"),
            "--rounds",
            "60",
            "--pace",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| turns")]
    # 61 model calls, 60 per-turn figures: rows of 50 turns (2-51, then 52-61), each measured in both runs
    assert [row.split("|")[1].strip() for row in rows] == ["2-51", "52-61"]
    for row in rows:
        one, paced, ratio = (cell.strip() for cell in row.strip("|").split("|")[1:])
        assert float(one) > 0 and float(paced) > 0 and ratio.endswith("x")
    endings = [line for line in lines if " model calls, " in line]
    assert [line.split(":")[0] for line in endings] == ["one invocation", "paced by 8"]
    assert all(": 61 model calls, " in line and line.endswith("ended end_turn") for line in endings), endings
