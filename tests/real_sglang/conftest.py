"""The real-SGLang tier: fixtures that start SGLang 0.5.23 itself (a tiny random-weight Qwen3 on the CPU) and a
recording proxy in front of it.

The server runs from its own virtualenv, named by ``SLIME_STRANDS_SGLANG_PYTHON`` (its python). Without it
the tier SKIPS, saying how to set it up, unless ``SLIME_STRANDS_REQUIRE_REAL_SGLANG=1`` (CI) makes that a
failure. One server serves the whole session; every test starts on an idle server (the fixture waits for it)
and gets a fresh proxy, so what it records is its own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from recording_proxy import RecordingProxy
from real_helpers import server_loads
from server_process import SGLangServerProcess
from tiny_model import make_tiny_model

PYTHON_ENV = "SLIME_STRANDS_SGLANG_PYTHON"
URL_ENV = "SLIME_STRANDS_SGLANG_URL"
"""A server already running with the tier's flags (server_process.CPU_FLAGS) and model (tiny_model.py), for
quick local iterations: the session fixture then uses it instead of starting one (the MoE test still needs
the server venv)."""
REQUIRE_ENV = "SLIME_STRANDS_REQUIRE_REAL_SGLANG"
IDLE_TIMEOUT_S = 120.0
SETUP_HINT = (
    "set up the server venv once: `bash scripts/real_sglang/build_venv.sh ~/.cache/slime-strands/sglang-venv`, "
    "then run: `SLIME_STRANDS_SGLANG_PYTHON=~/.cache/slime-strands/sglang-venv/bin/python pytest -q "
    "tests/real_sglang`"
)


def server_python() -> str:
    """The server venv's python; skips (fails when the tier is required) without one."""
    python = os.environ.get(PYTHON_ENV)
    required = os.environ.get(REQUIRE_ENV, "") not in ("", "0")
    if not python:
        message = f"the real-SGLang tier needs {PYTHON_ENV}: {SETUP_HINT}"
        if required:
            pytest.fail(f"{REQUIRE_ENV} is set but {PYTHON_ENV} is not: {SETUP_HINT}", pytrace=False)
        pytest.skip(message)
    if not os.access(python, os.X_OK):
        pytest.fail(f"{PYTHON_ENV}={python} is not an executable python: {SETUP_HINT}", pytrace=False)
    return python


def start_server(tmp: Path, *, moe: bool = False, extra_args: tuple[str, ...] = ()) -> SGLangServerProcess:
    model = make_tiny_model(tmp / ("tiny-qwen3-moe" if moe else "tiny-qwen3"), moe=moe)
    server = SGLangServerProcess(server_python(), model, tmp / "server.log", extra_args=extra_args)
    return server.start()


@dataclass(frozen=True)
class RunningServer:
    """A server this session did not start (``SLIME_STRANDS_SGLANG_URL``)."""

    base_url: str


@pytest.fixture(scope="session")
def sglang_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServerProcess | RunningServer]:
    """SGLang 0.5.23 serving the tiny Qwen3 (window 1,024 tokens, KV pool 4,096) for the whole session."""
    url = os.environ.get(URL_ENV)
    if url:
        yield RunningServer(url.rstrip("/"))
        return
    server = start_server(tmp_path_factory.mktemp("real-sglang"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def proxy(sglang_server: SGLangServerProcess | RunningServer) -> Iterator[RecordingProxy]:
    """A fresh recording proxy in front of an idle server."""
    wait_idle(sglang_server.base_url)
    with RecordingProxy(sglang_server.base_url) as recording:
        yield recording
    wait_idle(sglang_server.base_url)


def wait_idle(base_url: str, timeout_s: float = IDLE_TIMEOUT_S) -> None:
    """Wait (bounded) until the server runs and queues nothing: a test must not inherit another's requests."""
    deadline = time.monotonic() + timeout_s
    while True:
        loads = server_loads(base_url)
        if loads.running == 0 and loads.waiting == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the server is still busy after {timeout_s:.0f} s: {loads}")
        time.sleep(0.2)  # polling the server's own load report, with the deadline above
