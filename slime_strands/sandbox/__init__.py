"""Isolated, fast execution of model-written Python: the math agent's ``execute_python_code`` tool.

Model-written code is hostile input. Each snippet runs in a fresh process forked from a warm interpreter
(numpy and sympy already imported) that lives inside namespace isolation: bubblewrap, else ``unshare``.
Isolation fails closed: when neither works, runs raise :class:`SandboxIsolationError` (a
``ConfigurationError``) instead of running unisolated; rlimits only (``backend: limits``) must be asked for
and warns at every start. Every run gets its own unprivileged uid (when we are root), wall-clock / CPU /
memory / file-size / process limits, an empty environment and a private temp dir; when it ends or
overruns, everything it started is killed. camel-ai's SubprocessInterpreter is available as
``backend: camel`` for parity with slime's example: UNISOLATED.

    from slime_strands.sandbox import ensure_isolation, run_python
    await ensure_isolation(settings)  # at start-up: raises SandboxIsolationError if it cannot isolate
    result = await run_python("import sympy; print(sympy.factorint(2**64 - 1))")
    print(result.to_model_text())
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from strands import tool

from ..settings import SandboxSettings
from ._result import ExecutionResult, cut_middle
from ._sandbox import HOST, Sandbox, SandboxIsolationError, SandboxUnavailableError

__all__ = [
    "ExecutionResult",
    "Sandbox",
    "SandboxIsolationError",
    "SandboxUnavailableError",
    "configure_sandbox",
    "ensure_isolation",
    "execute_python_code",
    "run_python",
]

logger = logging.getLogger(__name__)


def configure_sandbox(settings: SandboxSettings) -> None:
    """Settings used by :func:`execute_python_code` and by :func:`run_python` without explicit settings.

    Idempotent. New settings replace the sandboxes of the old ones on every event loop: runs in flight
    finish on the old interpreter, which then stops; later runs start one with the new settings."""
    HOST.configure(settings)


async def ensure_isolation(settings: SandboxSettings) -> str:
    """Start this event loop's sandbox for ``settings`` (or reuse it) and return the backend it runs under.

    The preflight for slime's entry point, at the first sample: where the settings require isolation and
    this machine cannot provide it, it raises :class:`SandboxIsolationError` (a ``ConfigurationError``
    saying what failed and how to fix it) once, instead of a failed tool call in every episode. It also
    warms the interpreter the first runs use. ``limits`` and ``camel`` are unisolated on purpose and
    returned as they are (``limits`` logs its warning when it starts). A ``limits`` interpreter that cannot
    start raises :class:`SandboxUnavailableError`."""
    if settings.backend == "camel":
        logger.warning(
            "slime-strands sandbox: backend 'camel': model-written code runs UNISOLATED, no limits"
        )
        return "camel"
    return await HOST.sandbox(settings).start()


async def run_python(code: str, settings: SandboxSettings | None = None) -> ExecutionResult:
    """Run ``code`` in the sandbox for ``settings`` (default: the configured ones) on this event loop.

    Raises :class:`SandboxIsolationError` when the settings require isolation and none works here."""
    settings = settings or HOST.settings
    if settings.backend == "camel":
        return await _run_with_camel(code, settings)
    return await HOST.sandbox(settings).run(code)


async def _run_with_camel(code: str, settings: SandboxSettings) -> ExecutionResult:
    """camel-ai's SubprocessInterpreter, as slime's example uses it: no isolation, no limits but time."""
    try:
        from camel.interpreters import SubprocessInterpreter
    except ImportError as exc:
        return ExecutionResult(
            "",
            "",
            None,
            backend="camel",
            error=f"camel-ai is not installed ({exc}): pip install 'slime-strands[camel]'",
        )

    interpreter = SubprocessInterpreter(
        require_confirm=False,
        print_stdout=False,
        print_stderr=False,
        execution_timeout=int(settings.timeout_s),
    )
    started = time.perf_counter()
    output = await asyncio.get_running_loop().run_in_executor(None, interpreter.run, code, "python")
    text, truncated = cut_middle(str(output), settings.max_output_chars)
    return ExecutionResult(
        stdout=text,
        stderr="",
        exit_code=0,
        output_truncated=truncated,
        duration_s=time.perf_counter() - started,
        backend="camel",
        timeout_s=settings.timeout_s,
        memory_mb=settings.memory_mb,
    )


@tool
async def execute_python_code(code: str) -> dict[str, Any]:
    """Execute a Python 3 program and return what it printed (stdout, then stderr / traceback).

    numpy and sympy are available. Use print() to see results: the value of the last expression is not
    shown. There is no network access and no persistent state between calls (each call is a new process;
    files written are discarded). Calls are limited in time, memory and output size.

    Args:
        code: the complete Python program to run.
    """
    settings = HOST.settings
    try:
        result = await run_python(code, settings)
    except SandboxIsolationError as exc:  # never run unisolated: the call fails, saying why
        logger.error("%s", exc)
        return {"status": "error", "content": [{"text": f"[sandbox error: {exc}]"}]}
    # A raise, timeout or kill is a tool error (counted in the rollout metrics); the model sees the same text.
    return {
        "status": "success" if result.ok else "error",
        "content": [{"text": result.to_model_text(settings.max_output_chars)}],
    }
