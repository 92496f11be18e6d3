"""Runs a script of ``benchmarks/`` as a user would, in its own process: the benchmark tests check what it prints,
never its figures (speed is not a test)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_benchmark(script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 280) -> str:
    """``python benchmarks/<script> <args>``; fails the test with the end of its stderr unless it exits 0."""
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout
