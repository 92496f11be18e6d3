"""The client benchmark runs end to end in its tiny mode (figures are never asserted: speed is not a test)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from typing import Any

import pytest
from bench_runner import ROOT, run_benchmark
from conftest import qwen3_tokenizer_path

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
    "slime-strands CPU vs this",
    "slime-strands turns/s vs this",
]


@pytest.mark.timeout(300)
def test_quick_benchmark_prints_the_full_table_without_errors(tmp_path):
    env = {**os.environ, "SLIME_STRANDS_TEST_TOKENIZER": qwen3_tokenizer_path()}
    out = tmp_path / "figures.json"
    stdout = run_benchmark(
        "bench_client.py",
        "--quick",
        "--clients",
        "slime-strands,null,bare-model",
        "--json",
        str(out),
        env=env,
    )
    lines = stdout.splitlines()
    header = next(line for line in lines if line.startswith("| scenario"))
    assert [c.strip() for c in header.strip("|").split("|")] == COLUMNS
    rows = [line for line in lines if line.startswith("| ") and line != header]
    figures = json.loads(out.read_text())
    lengths = [f for f in figures if "bare-model" in f["results"]]
    assert len(lengths) == 2 and len(figures) >= 3, stdout  # the bare model: length scenarios only
    assert len(rows) == 2 * len(figures) + len(lengths), stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == len(COLUMNS)
        assert cells[COLUMNS.index("errors")] == "0", row
        assert int(cells[COLUMNS.index("turns")]) > 0
    assert any(line.startswith("slime-strands: loop time per turn at the end") for line in lines)
    for how in ("in a Strands Agent", "driven by a bare loop, no Agent"):
        assert any(line.startswith(f"SGLangModel's own work per tool-call turn, {how}: ~") for line in lines)
    for scenario in figures:
        for client, result in scenario["results"].items():
            assert result["errors"] == 0, (client, result["error_samples"])
            # every episode of every agent: a tool call, then the answer
            assert result["turns"] >= scenario["scenario"]["agents"] * scenario["scenario"]["episodes"] * 2


def _bench_module():
    spec = importlib.util.spec_from_file_location(
        "bench_client", os.path.join(ROOT, "benchmarks", "bench_client.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_client"] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def test_repeated_runs_show_each_clients_median_run_and_the_ratio_range():
    bench = _bench_module()
    scenario = bench.Scenario("4 agents, 1k", 4, 1000)

    def run(client: str, cpu_s: float, wall_s: float, errors: int = 0) -> Any:
        cell = bench.Cell(client, scenario.name, 4, 1000, "http://127.0.0.1:1")
        return bench.Result(
            cell, turns=100, errors=errors, wall_s=wall_s, process_cpu_s=cpu_s, turn_cpu_ms=[1.0]
        )

    ours = [
        run("slime-strands", 0.30, 1.0),
        run("slime-strands", 0.40, 1.0, errors=1),
        run("slime-strands", 0.20, 0.5),
    ]
    theirs = [
        run("strands-sglang", 0.60, 2.0),
        run("strands-sglang", 0.40, 1.0),
        run("strands-sglang", 0.50, 1.0),
    ]
    same_gc = [run("strands-sglang+gc", 0.30, 1.0)] * 3
    runs = {"slime-strands": ours, "strands-sglang": theirs, "strands-sglang+gc": same_gc}
    table = bench.format_table([(scenario, runs)], "cmd")
    rows = {
        line.split("|")[2].strip(): [c.strip() for c in line.strip("|").split("|")]
        for line in table.splitlines()
        if line.startswith("| 4 agents")
    }
    mine, peer, peer_gc = rows["slime-strands"], rows["strands-sglang"], rows["strands-sglang+gc"]
    assert mine[COLUMNS.index("total")] == "3.00" and peer[COLUMNS.index("total")] == "5.00"  # median runs
    # per repetition: CPU 0.5, 1.0, 0.4 -> median 0.50, range 0.40-1.00; turns/s 2.0, 1.0, 2.0
    assert peer[COLUMNS.index("slime-strands CPU vs this")] == "0.50x (0.40-1.00)"
    assert peer[COLUMNS.index("slime-strands turns/s vs this")] == "2.00x (1.00-2.00)"
    # against the same client under slime-strands' GC setting: CPU 1.0, 1.33, 0.67; turns/s 1.0, 1.0, 2.0
    assert peer_gc[COLUMNS.index("slime-strands CPU vs this")] == "1.00x (0.67-1.33)"
    assert peer_gc[COLUMNS.index("slime-strands turns/s vs this")] == "1.00x (1.00-2.00)"
    assert mine[COLUMNS.index("slime-strands CPU vs this")] == "-"
    assert mine[COLUMNS.index("errors")] == "1"  # every run's errors, not the median run's
    single = bench.format_table(
        [(scenario, {"slime-strands": ours[:1], "strands-sglang": theirs[:1]})], "cmd"
    )
    assert "| 0.50x | 2.00x |" in single


def test_own_work_compares_tool_call_turns_by_the_length_they_started_at():
    bench = _bench_module()
    lengths = [bench.Scenario(f"4 agents, {n // 1000}k", 4, n) for n in (1000, 8000, 100_000)]

    def runs(call_turns: list[tuple[int, float]]) -> dict[str, list[Any]]:
        cell = bench.Cell("slime-strands", "s", 4, 1000, "http://127.0.0.1:1")
        return {"slime-strands": [bench.Result(cell, turns=10, process_cpu_s=1.0, call_turn_own=call_turns)]}

    rows = [
        (lengths[0], runs([])),  # a 1k trajectory: a prompt turn and the final answer, no such turn
        (lengths[1], runs([(1000, 0.4), (1100, 0.5), (8000, 0.6)])),
        (lengths[2], runs([(900, 0.3), (60_000, 5.0), (100_000, 0.8), (120_000, 1.0)])),
        (bench.Scenario("512 agents, 4 x 1 MB tool output", 512, 3000, large_outputs=4), runs([(1000, 9.0)])),
    ]
    (line,) = bench._own_work_by_length(rows)
    assert line == (
        "SGLangModel's own work per tool-call turn, in a Strands Agent: ~1,000 tokens: 0.40 ms (3 turns), "
        "~8,000 tokens: 0.60 ms (1 turns), ~100,000 tokens: 0.90 ms (2 turns) (2.25x from the shortest to the longest)"
    )
