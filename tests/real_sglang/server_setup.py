"""Which SGLang server the tier talks to, and how it gets one.

The server runs from its own virtualenv, named by ``SLIME_STRANDS_SGLANG_PYTHON`` (its python): the tier
starts it (``server_process``) with the tiny model (``tiny_model``). Without that variable the tier SKIPS,
saying how to set it up, unless ``SLIME_STRANDS_REQUIRE_REAL_SGLANG=1`` (CI) makes that a failure.
``SLIME_STRANDS_SGLANG_URL`` names a server already running with the tier's flags and model instead (quick
local iterations; the tests that start servers of their own still need the venv).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from real_sglang.real_helpers import server_loads
from real_sglang.server_process import SGLangServerProcess
from real_sglang.tiny_model import make_tiny_model

__all__ = ["RunningServer", "running_server_url", "server_python", "start_server", "wait_idle"]

PYTHON_ENV = "SLIME_STRANDS_SGLANG_PYTHON"
URL_ENV = "SLIME_STRANDS_SGLANG_URL"
REQUIRE_ENV = "SLIME_STRANDS_REQUIRE_REAL_SGLANG"
IDLE_TIMEOUT_S = 120.0
SETUP_HINT = (
    "set up the server venv once: `bash scripts/real_sglang/build_venv.sh ~/.cache/slime-strands/sglang-venv`, "
    "then run: `SLIME_STRANDS_SGLANG_PYTHON=~/.cache/slime-strands/sglang-venv/bin/python pytest -q "
    "tests/real_sglang`"
)


@dataclass(frozen=True)
class RunningServer:
    """A server this session did not start (``SLIME_STRANDS_SGLANG_URL``)."""

    base_url: str


def running_server_url() -> str | None:
    url = os.environ.get(URL_ENV)
    return url.rstrip("/") if url else None


def server_python() -> str:
    """The server venv's python; skips (fails when the tier is required) without one."""
    python = os.environ.get(PYTHON_ENV)
    required = os.environ.get(REQUIRE_ENV, "") not in ("", "0")
    if not python:
        if required:
            pytest.fail(f"{REQUIRE_ENV} is set but {PYTHON_ENV} is not: {SETUP_HINT}", pytrace=False)
        pytest.skip(f"the real-SGLang tier needs {PYTHON_ENV}: {SETUP_HINT}")
    if not os.access(python, os.X_OK):
        pytest.fail(f"{PYTHON_ENV}={python} is not an executable python: {SETUP_HINT}", pytrace=False)
    return python


def start_server(tmp: Path, *, moe: bool = False, extra_args: tuple[str, ...] = ()) -> SGLangServerProcess:
    """The tiny model (dense or MoE) written under ``tmp`` and served; ServerStartError with its log if not."""
    model = make_tiny_model(tmp / ("tiny-qwen3-moe" if moe else "tiny-qwen3"), moe=moe)
    server = SGLangServerProcess(server_python(), model, tmp / "server.log", extra_args=extra_args)
    return server.start()


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
