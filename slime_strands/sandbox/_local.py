"""``sandbox.placement: local``: snippets run in this process, in a runner per event loop."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ConfigurationError
from ..settings import SandboxSettings
from ._backends import CHOICES
from ._camel import CamelInterpreter
from ._runner import CodeRunner, Placement
from ._sandbox import Sandbox

__all__ = ["LOCAL", "LocalPlacement"]

_RUNNERS: dict[str, Callable[[SandboxSettings], CodeRunner]] = {
    **dict.fromkeys(CHOICES, Sandbox),
    "camel": CamelInterpreter,
}
"""``sandbox.backend`` -> the runner class: the warm isolated interpreter, or camel-ai's."""


class LocalPlacement(Placement):
    """Runners in this process: asyncio pipes belong to a loop, so one per event loop and settings."""

    shared = False

    def make(self, settings: SandboxSettings) -> CodeRunner:
        runner = _RUNNERS.get(settings.backend)
        if runner is None:
            raise ConfigurationError(f"sandbox.backend: no local runner for {settings.backend!r}")
        return runner(settings)


LOCAL = LocalPlacement()
