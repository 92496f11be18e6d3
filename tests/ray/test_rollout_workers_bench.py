"""The rollout-worker benchmark runs end to end in a small run on a real local Ray and prints its whole table
(figures are never compared with targets: speed is not a test)."""

from __future__ import annotations

import json
import math
import os

import pytest
from bench_runner import run_benchmark
from conftest import qwen3_tokenizer_path

COLUMNS = [
    "agents",
    "path",
    "episodes",
    "turns",
    "wall s",
    "turns/s",
    "turns/s vs in-process",
    "CPU ms/turn total",
    "driver",
    "driver vs in-process",
    "workers",
    "Ray other",
    "server (share of all CPU)",
    "cores busy",
    "hop p50 ms",
    "hop p99 ms",
    "errors",
]


def _number(text: str) -> float:
    value = float(text.split()[0].rstrip("x%").replace(",", ""))
    assert math.isfinite(value), text
    return value


@pytest.mark.timeout(400)
def test_the_benchmark_prints_every_path_with_figures_and_ratios(tmp_path):
    env = {**os.environ, "SLIME_STRANDS_TEST_TOKENIZER": qwen3_tokenizer_path()}
    out = tmp_path / "figures.json"
    args = ("--agents", "4", "--workers", "0,2", "--warmup", "2", "--json", str(out))
    stdout = run_benchmark("bench_rollout_workers.py", *args, env=env, timeout=380)
    lines = stdout.splitlines()
    assert lines[0] == "`python benchmarks/bench_rollout_workers.py " + " ".join(args) + "`"
    header = next(line for line in lines if line.startswith("| agents"))
    assert [c.strip() for c in header.strip("|").split("|")] == COLUMNS
    rows = [dict(zip(COLUMNS, (c.strip() for c in line.strip("|").split("|")), strict=True)) for line in lines
            if line.startswith("| 4 |")]  # fmt: skip
    assert [row["path"] for row in rows] == ["in-process", "2 workers"], stdout
    for row in rows:
        assert row["errors"] == "0" and row["episodes"] == "4", row
        assert int(row["turns"]) >= 4 * 2  # every episode: tool calls, then the answer
        for column in ("wall s", "turns/s", "CPU ms/turn total", "driver", "cores busy"):
            assert _number(row[column]) > 0, (column, row)
        for column in ("Ray other", "server (share of all CPU)", "hop p50 ms", "hop p99 ms"):
            assert _number(row[column]) >= 0, (column, row)
        assert _number(row["hop p99 ms"]) >= _number(row["hop p50 ms"])
        assert row["server (share of all CPU)"].endswith("%)")
    local, pooled = rows
    assert local["turns/s vs in-process"] == "1.00x" and local["driver vs in-process"] == "100.0%"
    assert _number(local["workers"]) == 0 and _number(pooled["workers"]) > 0  # the episodes ran there
    assert _number(pooled["turns/s vs in-process"]) > 0 and _number(pooled["driver vs in-process"]) > 0
    (summary,) = [line for line in lines if line.startswith("4 agents, 2 workers: driver ")]
    assert "(target <= 10%)" in summary and "(target >= 1.5x)" in summary and "workers at" in summary
    figures = json.loads(out.read_text())
    assert [f["cell"]["workers"] for f in figures] == [0, 2]
    assert len(figures[1]["hop_ms"]) == 4 and sum(figures[1]["worker_episodes"]) == 4
    assert len(figures[1]["worker_episodes"]) == 2
