"""Where ``generate`` runs its episodes: the one place ``rollout_workers`` is looked at.

:func:`runner_for` gives the in-process runner for ``rollout_workers.count: 0`` (the default) and otherwise the
process's :class:`WorkerPool` of that configuration on this loop (built once; its workers start at the first
episode). See ``_pool`` for the pool, ``_worker`` for one worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterator

from .._ray_session import join_ray
from ..agent.runner import IN_PROCESS, EpisodeRunner
from ..agent.runtime import Runtime
from ..settings import PluginSettings
from ._pool import PoolState, RolloutWorkersError, WorkerPool
from ._worker import WorkerInfo, WorkerSetup

__all__ = [
    "PoolState",
    "RolloutWorkersError",
    "WorkerInfo",
    "WorkerPool",
    "WorkerSetup",
    "pools",
    "runner_for",
]

_POOLS: list[tuple[asyncio.AbstractEventLoop, WorkerPool]] = []


def runner_for(runtime: Runtime) -> EpisodeRunner:
    """The runner of ``runtime``'s settings: in this process, or this loop's pool of rollout workers."""
    workers = runtime.settings.rollout_workers
    if workers.count == 0:
        return IN_PROCESS
    per_worker = workers.max_in_flight or max(1, math.ceil(runtime.client.max_connections / workers.count))
    setup = WorkerSetup(runtime.settings, runtime.client.base_url, per_worker, runtime.tokenizer_path)
    loop = asyncio.get_running_loop()
    for held_loop, pool in list(_POOLS):
        if held_loop.is_closed():  # a finished loop's pool: nothing awaits it any more
            pool.kill()
            _POOLS.remove((held_loop, pool))
        elif held_loop is loop and pool.setup == setup:
            return pool
    pool = WorkerPool(setup, workers)
    _POOLS.append((loop, pool))
    return pool


def pools() -> list[WorkerPool]:
    """The pools of this process (metrics, tests)."""
    return [pool for _, pool in _POOLS]


@contextlib.contextmanager
def workers_session(settings: PluginSettings) -> Iterator[None]:
    """For a command run outside slime (``slime-strands eval``) with rollout workers: join ``RAY_ADDRESS``'s
    cluster, else start a local Ray, for the block; then stop every pool's workers and leave what it joined."""
    if settings.rollout_workers.count == 0:
        yield
        return
    from ._pool import _ray

    leave = join_ray(_ray(), lambda message: RolloutWorkersError(f"rollout_workers: {message}"))
    try:
        yield
    finally:
        for pool in pools():
            pool.kill()
        _POOLS.clear()
        if leave is not None:
            leave()


def worker_metrics() -> dict[str, float]:
    """The rollout workers' own metrics (un-prefixed; empty without workers): episodes each worker returned,
    workers lost, episodes run again and FAILED for it, summed over the process's pools."""
    out: dict[str, float] = {}
    index = 0
    for pool in pools():
        state = pool.state()
        for episodes in state.episodes:
            out[f"workers/episodes/{index}"] = float(episodes)
            index += 1
        for key in ("lost_workers", "retried", "failed"):
            out[f"workers/{key}"] = out.get(f"workers/{key}", 0.0) + float(getattr(state, key))
    if out:
        out["workers/count"] = float(index)
    return out
