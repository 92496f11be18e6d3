"""The sandbox benchmark's Ray part runs end to end in a small run (figures are never asserted: speed is not a
test)."""

from __future__ import annotations

import pytest
from bench_runner import run_benchmark


@pytest.mark.timeout(400)
def test_the_ray_pool_benchmark_measures_the_hop_the_cpu_and_the_scaling():
    out = run_benchmark(
        "bench_sandbox.py",
        "--ray-only",
        "--hop-runs",
        "20",
        "--pool-sizes",
        "1,2",
        "--rounds",
        "1",
        "--repeats",
        "1",
        timeout=380,
    )
    lines = out.splitlines()
    hop = [
        line.split()
        for line in lines
        if line[:1] in ("1", "4") and len(line.split()) == 6 and "%" not in line
    ]
    assert [row[0] for row in hop] == ["1", "4"] and all(float(x) > 0 for row in hop for x in row[1:5])
    cpu = [line.rsplit(None, 2) for line in lines if line.startswith(("local ", "ray "))]
    assert [row[0] for row in cpu] == ["local", "ray", "ray call"] and all(row[2] == "ms" for row in cpu)
    scaling = [line.split() for line in lines if len(line.split()) == 7 and line.split()[4].endswith("%")]
    assert [(row[0], row[1], row[3]) for row in scaling] == [("1", "4", "40"), ("2", "8", "80")]
    assert scaling[0][5] == "1.00x" and scaling[1][5].endswith("x")
    assert any(line.startswith("One worker (") and "MiB resident" in line for line in lines)
