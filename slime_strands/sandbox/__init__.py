"""Isolated, fast execution of model-written Python: the math agent's ``execute_python_code`` tool.

Model-written code is hostile input. Each snippet runs in a fresh process forked from a warm interpreter
(numpy and sympy already imported) that lives inside namespace isolation: bubblewrap, else ``unshare``.
Isolation fails closed: when neither works, runs raise :class:`SandboxIsolationError` (a
``ConfigurationError``) instead of running unisolated; rlimits only (``backend: limits``) must be asked for
and warns at every start. Every run gets its own unprivileged uid (when we are root), wall-clock / CPU /
memory / file-size / process limits, an empty environment and a private temp dir; when it ends or
overruns, everything it started is killed. camel-ai's SubprocessInterpreter is available as
``backend: camel`` for parity with slime's example: UNISOLATED.

Where it runs is the placement: ``local`` (this process) or ``ray`` (a pool of Ray actors spread over the
cluster, each hosting the same sandbox; ``_ray_pool``). Backends and placements are objects behind one
interface (``_runner``): nothing compares their names outside ``_placements`` and ``_local``.

    from slime_strands.sandbox import ensure_isolation, run_python
    await ensure_isolation(settings)  # at start-up: raises SandboxIsolationError if it cannot isolate
    result = await run_python("import sympy; print(sympy.factorint(2**64 - 1))")
    print(result.to_model_text())
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from strands import tool

from ..errors import ConfigurationError
from ..provider.tool_output import FIGURE_NAME_KEY
from ..settings import SandboxSettings
from ._host import HOST
from ._placements import placement, runner
from ._ray_pool import PoolState, RayPool, SandboxPoolError
from ._result import ExecutionResult
from ._runner import CodeRunner, Placement
from ._sandbox import Sandbox, SandboxIsolationError, SandboxUnavailableError

__all__ = [
    "CodeRunner",
    "ExecutionResult",
    "Placement",
    "PoolState",
    "RayPool",
    "Sandbox",
    "SandboxIsolationError",
    "SandboxPoolError",
    "SandboxUnavailableError",
    "configure_sandbox",
    "ensure_isolation",
    "execute_python_code",
    "placement_session",
    "pool_summary",
    "run_python",
]

logger = logging.getLogger(__name__)


def configure_sandbox(settings: SandboxSettings) -> None:
    """Settings used by :func:`execute_python_code` and by :func:`run_python` without explicit settings.

    Idempotent. New settings replace the runners of the old ones everywhere: runs in flight finish on the old
    interpreter (or pool), which then stops; later runs start one with the new settings."""
    HOST.configure(settings)


async def ensure_isolation(settings: SandboxSettings) -> str:
    """Start the runner for ``settings`` (or reuse it) and return the backend it runs under.

    The preflight for slime's entry point, at the first sample: where the settings require isolation and
    this machine cannot provide it, it raises :class:`SandboxIsolationError` (a ``ConfigurationError``
    saying what failed and how to fix it) once, instead of a failed tool call in every episode; with
    ``placement: ray``, every worker starts and checks isolation on its node, and a pool that cannot start
    raises :class:`SandboxPoolError`. It also warms the interpreters the first runs use. ``limits`` and
    ``camel`` are unisolated on purpose and returned as they are (both log a warning when they start). A
    ``limits`` interpreter that cannot start raises :class:`SandboxUnavailableError`."""
    return await runner(settings).start()


async def run_python(code: str, settings: SandboxSettings | None = None) -> ExecutionResult:
    """Run ``code`` in the sandbox for ``settings`` (default: the configured ones), where its placement
    says: the same :class:`ExecutionResult` either way.

    Raises :class:`SandboxIsolationError` when the settings require isolation and none works here, and
    :class:`SandboxPoolError` when the Ray pool cannot start."""
    return await runner(settings or HOST.settings).run(code)


def pool_summary(settings: SandboxSettings) -> str | None:
    """One line saying which pool runs the model's code, once it started (``placement: ray``); None for a
    placement in this process. A command prints it: a user who asked for a pool sees that one was used."""
    pool = HOST.started_shared(settings)
    state = pool.state() if isinstance(pool, RayPool) else None
    if state is None or not state.workers:
        return None
    nodes = len({worker.node_id for worker in state.workers})
    backends = ", ".join(sorted({worker.backend for worker in state.workers})) or "none started"
    return (
        f"sandbox: the model's code runs on a Ray pool of {len(state.workers)} worker(s) x "
        f"{settings.ray.slots_per_worker} slot(s) on {nodes} node(s) (isolated by {backends})"
    )


@contextlib.contextmanager
def placement_session(settings: SandboxSettings) -> Iterator[None]:
    """For a command run outside any cluster (``slime-strands eval``): make the placement of ``settings``
    usable in this process for the block (Ray: join ``RAY_ADDRESS`` or start a local Ray), then stop the
    process-wide runners (the pools' workers) and undo what it did. Inside slime Ray is already there."""
    leave = placement(settings).join()
    try:
        yield
    finally:
        for shared in HOST.shared_runners():
            asyncio.run(shared.aclose())
        if leave is not None:
            leave()


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
    except ConfigurationError as exc:  # never run unisolated, nor without a pool: the call fails, saying why
        logger.error("%s", exc)
        return {"status": "error", "content": [{"text": f"[sandbox error: {exc}]"}]}
    # A raise, timeout or kill is a tool error (counted in the rollout metrics); the model sees the same text.
    # With sandbox.return_figures the image files the run saved follow it (a vision-language model sees them).
    # Each names its file (FIGURE_NAME_KEY): the model's side says "[figure NAME: attached]" beside one it
    # shows, and names the file and the reason for one it cannot.
    figures = [
        {"image": {"format": f.format, "source": {"bytes": f.data}, FIGURE_NAME_KEY: f.name}}
        for f in result.figures
        if f.format
    ]
    return {
        "status": "success" if result.ok else "error",
        "content": [{"text": result.to_model_text(settings.max_output_chars)}, *figures],
    }
