"""The image benchmark runs end to end in a small run (its figures are never asserted; that each image is held
once is: the benchmark checks it)."""

from __future__ import annotations

import pytest
from bench_runner import run_benchmark


@pytest.mark.timeout(300)
def test_small_image_benchmark_reports_bytes_per_image_turn():
    lines = run_benchmark("bench_images.py", "--turns", "2", "--size", "128x96").splitlines()
    assert lines[0] == "3 images of 128x96 over 3 requests (6 image-turns), Qwen3-VL"
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in lines if line.startswith("| ")}
    for name in ("PNG", "in each later request (image_data)", "saved in the trajectory file (once)"):
        assert int(rows[name].replace(",", "")) > 0, name
    assert lines[-2].startswith(
        "tokens per image: 70;"
    )  # 128x96 scaled up to Qwen3-VL's 65,536-pixel minimum
    assert "a copy per turn would hold" in lines[-1]
