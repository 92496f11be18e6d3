"""The client benchmark runs end to end in its tiny mode (figures are never asserted: speed is not a test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import qwen3_tokenizer_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLUMNS = [
    "scenario",
    "client",
    "turns",
    "tokens/traj",
    "CPU ms/turn median",
    "p99",
    "total",
    "turns/s",
    "RSS MB/traj",
    "max stall ms",
    "GC ms/turn",
    "max GC pause ms",
    "errors",
    "CPU vs strands-sglang",
    "turns/s vs strands-sglang",
]


@pytest.mark.timeout(300)
def test_quick_benchmark_prints_the_full_table_without_errors(tmp_path):
    env = {**os.environ, "SLIME_STRANDS_TEST_TOKENIZER": qwen3_tokenizer_path()}
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "bench_client.py"),
            "--quick",
            "--clients",
            "slime-strands,null",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.startswith("| scenario"))
    assert [c.strip() for c in header.strip("|").split("|")] == COLUMNS
    rows = [line for line in lines if line.startswith("| ") and line != header]
    figures = json.loads(out.read_text())
    assert len(figures) >= 3 and len(rows) == 2 * len(figures), proc.stdout  # every scenario x 2 clients
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == len(COLUMNS)
        assert cells[COLUMNS.index("errors")] == "0", row
        assert int(cells[COLUMNS.index("turns")]) > 0
    assert any(line.startswith("slime-strands: loop time per turn at the end") for line in lines)
    assert any(line.startswith("slime-strands: SGLangModel's own work per turn") for line in lines)
    for scenario in figures:
        for client, result in scenario["results"].items():
            assert result["errors"] == 0, (client, result["error_samples"])
            assert result["turns"] >= scenario["scenario"]["agents"] * 2  # a tool call, then the answer
