"""The leak guard (tests/leak_guard.py) run on a small suite of its own, in a pytest process of its own: a process a
test leaves behind fails the session, named with that test, and is killed; one already told to stop in a
teardown is given its grace and is not a leak."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

_TESTS = Path(__file__).resolve().parents[1]

_SUITE = """
import subprocess, sys

import pytest

LEFT = []


def test_leaves_a_sleeper():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    LEFT.append(process)
    print(f"PID {process.pid}")


@pytest.fixture
def slow_to_stop():
    # Ends a second after its TERM, as a server finishing its requests does.
    code = (
        "import signal, sys, time\\n"
        "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(0)))\\n"
        "print('ready', flush=True)\\n"
        "time.sleep(120)\\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "ready\\n"
    yield process
    process.terminate()  # not waited for: still alive when the session ends


def test_stops_its_process_in_teardown(slow_to_stop):
    assert slow_to_stop.poll() is None
"""


def _run_suite(tmp_path: Path, *selection: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_suite.py").write_text(textwrap.dedent(_SUITE))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-s",
            "-p",
            "no:cacheprovider",
            "-p",
            "leak_guard",
            *selection,
        ],
        cwd=tmp_path,
        env={**{k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}, "PYTHONPATH": str(_TESTS)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_process_left_behind_fails_the_session_names_its_test_and_is_killed(tmp_path: Path) -> None:
    result = _run_suite(tmp_path, "test_suite.py")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "2 passed" in out, out
    assert "1 process(es) left behind by the tests (killed now)" in out, out
    assert "started in test_suite.py::test_leaves_a_sleeper" in out, out
    assert "test_stops_its_process_in_teardown" not in out.split("left behind by the tests")[1], out
    pid = int(next(line for line in out.splitlines() if line.startswith("PID ")).split()[1])
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"the leaked process {pid} is still alive"
        time.sleep(0.1)


def test_a_process_stopping_in_teardown_is_given_its_grace(tmp_path: Path) -> None:
    result = _run_suite(tmp_path, "test_suite.py::test_stops_its_process_in_teardown")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "left behind" not in out, out
