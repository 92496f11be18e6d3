"""One rollout worker: a Ray actor holding what slime's process holds for episodes, on its own event loop.

Its :class:`~slime_strands.agent.runtime.Runtime` (tokenizer loaded from the checkpoint, one pooled
``SGLangClient`` towards slime's router, the tools, the sandbox, the vision processor) is built from a
:class:`WorkerSetup` when it starts; ``run`` runs one :class:`~slime_strands.agent.runner.EpisodeJob` with the
in-process runner and returns its record. slime's abort reaches it through :meth:`RolloutWorker.abort` (the
driver forwards its ``GenerateState.aborted``); every episode here reads one flag, as every episode of slime's
process reads ``aborted``. Nothing here imports Ray at module level (``_pool`` makes this an actor class).
"""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass

from ..agent.record import EpisodeRecord
from ..agent.runner import IN_PROCESS, EpisodeJob
from ..agent.runtime import Runtime, client_for
from ..provider.abort_signal import AbortSignal
from ..settings import PluginSettings

__all__ = ["RolloutWorker", "WorkerCounts", "WorkerInfo", "WorkerSetup"]


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker needs to build its runtime (sent once, when it starts)."""

    settings: PluginSettings
    base_url: str
    """slime's router (or the server): the worker's client sends every turn there, with the same routing keys."""
    max_in_flight: int
    """Episodes the worker runs at once (its client's connection pool)."""
    tokenizer_path: str | None


@dataclass(frozen=True)
class WorkerInfo:
    """Where a worker runs (logged, and named in errors)."""

    node_id: str
    node_ip: str
    hostname: str
    pid: int

    def __str__(self) -> str:
        return f"{self.hostname} ({self.node_ip}), pid {self.pid}"


@dataclass(frozen=True)
class WorkerCounts:
    """What a worker did (the per-worker metrics)."""

    episodes: int
    in_flight: int


class RolloutWorker:
    """The actor; see the module docstring."""

    def __init__(self, setup: WorkerSetup) -> None:
        self._setup = setup
        client = client_for(setup.settings, setup.base_url, max_connections=setup.max_in_flight)
        self._runtime = Runtime(setup.settings, client, tokenizer_path=setup.tokenizer_path)
        self._aborted = False
        self._abort = AbortSignal(lambda: self._aborted)
        self._stopped = asyncio.Event()
        self._episodes = 0
        self._in_flight = 0

    async def start(self) -> WorkerInfo:
        """Load the tokenizer, the vision processor and the tools here; a ConfigurationError says why not."""
        import ray

        await self._runtime.tokenizer()
        await self._runtime.vision()
        self._runtime.tools()
        return WorkerInfo(
            node_id=ray.get_runtime_context().get_node_id(),
            node_ip=ray.util.get_node_ip_address(),
            hostname=socket.gethostname(),
            pid=os.getpid(),
        )

    async def run(self, job: EpisodeJob, aborted: bool) -> EpisodeRecord:
        """One episode; ``aborted``: slime's flag when the driver sent it (a new rollout clears it)."""
        self._aborted = aborted
        self._in_flight += 1
        try:
            record = await IN_PROCESS.run(
                self._runtime,
                job,
                tokenizer=await self._runtime.tokenizer(),
                vision=await self._runtime.vision(),
                abort=self._abort,
            )
        finally:
            self._in_flight -= 1
        self._episodes += 1
        return record

    async def abort(self) -> None:
        """slime aborted: every episode here stops as one in slime's process does."""
        self._aborted = True

    async def counts(self) -> WorkerCounts:
        return WorkerCounts(self._episodes, self._in_flight)

    async def wait_until_stopped(self) -> None:
        """Returns only at :meth:`close`: the pool awaits it to learn at once when this worker dies."""
        await self._stopped.wait()

    async def close(self) -> None:
        self._stopped.set()
        await self._runtime.mcp.aclose()  # this worker's shared MCP sessions
        await self._runtime.client.aclose()
