"""The sandbox's process-wide state: one object (:data:`HOST`) instead of module globals.

Everything the sandbox keeps for the life of the process (the configured settings, the runners of every event
loop and the process-wide ones, which backend worked here, warnings given, uids to reap) lives here: the
sandbox's public functions and its runners read and change that state nowhere else.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import weakref

from ..settings import SandboxSettings
from ._runner import CodeRunner, Placement

__all__ = ["HOST", "SandboxHost"]

logger = logging.getLogger(__name__)

_MAX_PER_LOOP = 4  # per-loop runners (warm interpreters) kept per event loop; the least recently used closes


class SandboxHost:
    """The sandbox's process-wide state.

    * the settings ``execute_python_code`` and ``run_python`` use unless given others (:meth:`configure`);
    * the runners: per event loop and settings for a per-loop placement (local), at most ``_MAX_PER_LOOP``
      per loop, least recently used retired first; a loop that is garbage-collected drops its own; one per
      settings for the process for a shared placement (a Ray pool serves every loop) (:meth:`runner`);
    * ``working_backends``: requested backend -> the one that started (``auto`` tries it first; once
      isolation worked here, a later failure to start is transient, not a refusal of the machine);
    * ``orphan_uids``: run uids of interpreters without namespaces that died; the next one reaps them;
    * warnings already given (:meth:`warn_once`) and runners closing in the background (a task needs a
      reference until it is done).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # loops on several threads configure and look up runners
        self._settings = SandboxSettings()
        self._per_loop: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, collections.OrderedDict[SandboxSettings, CodeRunner]
        ] = weakref.WeakKeyDictionary()
        self._shared: dict[SandboxSettings, CodeRunner] = {}
        self.working_backends: dict[str, str] = {}
        self.orphan_uids: set[int] = set()
        self._warned: set[str] = set()
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def settings(self) -> SandboxSettings:
        """The configured settings (the defaults until :meth:`configure`)."""
        return self._settings

    def configure(self, settings: SandboxSettings) -> None:
        """Make ``settings`` the configured ones; the runners of the previous ones are retired everywhere
        (runs in flight finish on them, then they stop). Idempotent."""
        with self._lock:
            previous, self._settings = self._settings, settings
        if previous != settings:
            self.retire(previous)

    def runner(self, settings: SandboxSettings, placement: Placement) -> CodeRunner:
        """The runner for ``settings`` (created on first use): the running loop's own for a per-loop
        placement, the process's for a shared one."""
        if placement.shared:
            with self._lock:
                runner = self._shared.get(settings)
                if runner is None:
                    runner = self._shared[settings] = placement.make(settings)
            return runner
        loop = asyncio.get_running_loop()
        with self._lock:
            per_loop = self._per_loop.setdefault(loop, collections.OrderedDict())
            runner = per_loop.get(settings)
            if runner is None:
                runner = per_loop[settings] = placement.make(settings)
            per_loop.move_to_end(settings)
            evicted = [per_loop.popitem(last=False)[1] for _ in range(len(per_loop) - _MAX_PER_LOOP)]
        for old in evicted:
            old.retire()
        return runner

    def retire(self, settings: SandboxSettings) -> None:
        """Close every runner for ``settings`` once its runs are done (from any thread)."""
        with self._lock:
            found = [
                (loop, runners.pop(settings))
                for loop, runners in self._per_loop.items()
                if settings in runners
            ]
            shared = self._shared.pop(settings, None)
        for loop, runner in found:
            with contextlib.suppress(RuntimeError):  # a closed loop: its interpreter went with its transports
                loop.call_soon_threadsafe(runner.retire)
        if shared is not None:
            shared.retire()

    def started_shared(self, settings: SandboxSettings) -> CodeRunner | None:
        """The process-wide runner for ``settings`` when there is one (none is created)."""
        with self._lock:
            return self._shared.get(settings)

    def shared_runners(self) -> list[CodeRunner]:
        """The process-wide runners, forgotten here (the caller closes them)."""
        with self._lock:
            runners, self._shared = list(self._shared.values()), {}
        return runners

    def warn_once(self, message: str) -> None:
        """Log a warning about the machine (not about one run) once per process."""
        if message not in self._warned:
            self._warned.add(message)
            logger.warning(message)

    def keep_until_done(self, task: asyncio.Task[None]) -> None:
        """Hold a background task (a retired runner closing) until it finishes: the loop keeps only a weak
        reference to it."""
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)


HOST = SandboxHost()
"""The process's one :class:`SandboxHost`."""
