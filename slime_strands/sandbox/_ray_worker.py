"""One sandbox worker of the Ray pool: a Ray actor hosting the same local sandbox a rollout process would.

It runs in a Ray worker process on any node of the cluster (slime-strands must be installed there). Its
``start`` checks isolation on that node (the fail-closed rule: a node that cannot isolate refuses with
``SandboxIsolationError``, naming the node) and warms the interpreter; ``run`` is the local ``run_python``
there. The pool (``_ray_pool``) makes it a Ray actor class; nothing here imports Ray at module level.
"""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass

from ..settings import SandboxSettings
from ._host import HOST
from ._local import LOCAL
from ._result import ExecutionResult
from ._runner import CodeRunner
from ._sandbox import SandboxIsolationError

__all__ = ["SandboxWorker", "WorkerInfo"]


@dataclass(frozen=True)
class WorkerInfo:
    """Where a sandbox worker runs and what isolates its runs (logged, and named in errors)."""

    node_id: str
    node_ip: str
    hostname: str
    pid: int
    backend: str

    def __str__(self) -> str:
        return f"{self.hostname} ({self.node_ip}), pid {self.pid}"


class SandboxWorker:
    """The actor: ``settings`` are one worker's own (``SandboxSettings.in_one_worker``)."""

    def __init__(self, settings: SandboxSettings) -> None:
        self._settings = settings
        self._stopped = asyncio.Event()

    def _runner(self) -> CodeRunner:
        return HOST.runner(self._settings, LOCAL)

    async def start(self) -> WorkerInfo:
        """Start the sandbox here (isolation checked on this node) and say where it runs."""
        import ray

        where = f"{socket.gethostname()} ({ray.util.get_node_ip_address()})"
        try:
            backend = await self._runner().start()
        except SandboxIsolationError as exc:
            raise SandboxIsolationError(f"on the Ray node {where}: {exc}") from None
        return WorkerInfo(
            node_id=ray.get_runtime_context().get_node_id(),
            node_ip=ray.util.get_node_ip_address(),
            hostname=socket.gethostname(),
            pid=os.getpid(),
            backend=backend,
        )

    async def run(self, code: str) -> ExecutionResult:
        """One snippet in this worker's sandbox (a cancel of the Ray task kills the run)."""
        return await self._runner().run(code)

    async def wait_until_stopped(self) -> None:
        """Returns only at :meth:`close`: the pool awaits it to learn at once when this worker dies."""
        await self._stopped.wait()

    async def close(self) -> None:
        """Stop the sandbox (its interpreter and any run) before the pool kills this actor."""
        self._stopped.set()
        await self._runner().aclose()
