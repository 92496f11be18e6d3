"""The one small interface behind every way of running model-written code, and behind every placement.

A :class:`CodeRunner` runs snippets for one :class:`~slime_strands.settings.SandboxSettings`: the warm
isolated interpreter (``_sandbox.Sandbox``, for the ``auto`` / ``bwrap`` / ``unshare`` / ``limits`` backends),
camel-ai's interpreter (``_camel``), a pool of Ray actors each hosting a local runner (``_ray_pool``). A
:class:`Placement` says where runners live and makes them. Nothing else in the package looks at a backend's
or a placement's name: the settings own the names, ``_placements`` maps each to its object once. A remote
sandbox service (an HTTP one such as SandboxFusion's ``POST /run_code``) is one more module: a runner and a
placement, registered in ``_placements`` under a name the settings accept.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

from ..settings import SandboxSettings
from ._result import ExecutionResult

__all__ = ["CodeRunner", "Placement"]


class CodeRunner(abc.ABC):
    """Runs snippets under one settings object; what ``run_python`` and ``execute_python_code`` call."""

    settings: SandboxSettings

    @abc.abstractmethod
    async def start(self) -> str:
        """Get ready now (a run gets ready on demand) and say what runs the code (e.g. ``bwrap``).

        Raises a ``ConfigurationError`` (``SandboxIsolationError`` among them) where no snippet could ever
        run as the settings require: the first sample stops with the fix instead of every tool call
        failing."""

    @abc.abstractmethod
    async def run(self, code: str) -> ExecutionResult:
        """Run one snippet. Never raises for what the code does, nor for a failure of the runner (the result
        says what happened); raises ``SandboxIsolationError`` where the settings require isolation and none
        works. Cancelling the call stops the run."""

    @abc.abstractmethod
    def retire(self) -> None:
        """Close once the runs in flight are done (from the loop that made a per-loop runner; from any
        thread for a shared one)."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop now, with every run still going."""


class Placement(abc.ABC):
    """Where runners live: how a runner for some settings is made, and who shares it."""

    shared: bool
    """True: one runner per settings for the whole process, whichever event loop calls it (it must be safe
    from any loop and thread). False: one per event loop and settings (asyncio pipes belong to a loop)."""

    @abc.abstractmethod
    def make(self, settings: SandboxSettings) -> CodeRunner:
        """A new runner for ``settings`` (not started: the first run or ``start()`` starts it)."""

    def join(self) -> Callable[[], None] | None:
        """Make the placement usable from this process, for a command that is not already inside what it
        needs (the Ray pool: join ``RAY_ADDRESS`` or start a local Ray). Returns what undoes it, or None
        when there was nothing to do."""
        return None
