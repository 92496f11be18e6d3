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

__all__ = ["RunningServer", "running_server_url", "server_python", "slime_paths", "start_server", "wait_idle"]

PYTHON_ENV = "SLIME_STRANDS_SGLANG_PYTHON"
URL_ENV = "SLIME_STRANDS_SGLANG_URL"
REQUIRE_ENV = "SLIME_STRANDS_REQUIRE_REAL_SGLANG"
SLIME_SOURCE_ENV = "SLIME_STRANDS_SLIME_SOURCE"
SLIME_DEPS_ENV = "SLIME_STRANDS_SLIME_DEPS"
IDLE_TIMEOUT_S = 120.0
SETUP_HINT = (
    'set it up with `eval "$(bash scripts/real_sglang/setup.sh ~/.cache/slime-strands)"`, then run '
    "`pytest -q tests/real_sglang`"
)


@dataclass(frozen=True)
class RunningServer:
    """A server this session did not start (``SLIME_STRANDS_SGLANG_URL``)."""

    base_url: str


def running_server_url() -> str | None:
    url = os.environ.get(URL_ENV)
    return url.rstrip("/") if url else None


def _setting(name: str) -> str:
    """An environment variable of the tier's set-up; skips without it, fails when the tier is required (CI)."""
    value = os.environ.get(name)
    if not value:
        if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
            pytest.fail(f"{REQUIRE_ENV} is set but {name} is not: {SETUP_HINT}", pytrace=False)
        pytest.skip(f"the real-SGLang tier needs {name}: {SETUP_HINT}")
    return value


def server_python() -> str:
    """The server venv's python (``SLIME_STRANDS_SGLANG_PYTHON``)."""
    python = _setting(PYTHON_ENV)
    if not os.access(python, os.X_OK):
        pytest.fail(f"{PYTHON_ENV}={python} is not an executable python: {SETUP_HINT}", pytrace=False)
    return python


def slime_paths() -> tuple[Path, Path]:
    """slime's unmodified source and the folder of what its rollout module imports (setup.sh makes both)."""
    source, deps = Path(_setting(SLIME_SOURCE_ENV)), Path(_setting(SLIME_DEPS_ENV))
    if not (source / "slime" / "rollout" / "sglang_rollout.py").is_file() or not deps.is_dir():
        pytest.fail(
            f"{SLIME_SOURCE_ENV}={source} / {SLIME_DEPS_ENV}={deps} are not set up: {SETUP_HINT}",
            pytrace=False,
        )
    return source, deps


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
