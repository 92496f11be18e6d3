"""``sandbox.placement: ray``: model-written code runs on a pool of Ray actors spread over the cluster.

The pool starts ``sandbox.ray.workers`` sandbox workers (:class:`~._ray_worker.SandboxWorker`: SPREAD
scheduling, ``cpus_per_worker`` CPUs and one unit of ``custom_resource`` each) in the Ray cluster this process
is connected to (inside slime: the rollout actor's), each hosting the local sandbox of the same settings with
``slots_per_worker`` runs at once. Its first start is the first sample's preflight: no Ray, Ray not
initialised, a cluster too small, a worker that does not start, or a node that cannot isolate is a
:class:`SandboxPoolError` / ``SandboxIsolationError`` (configuration errors) saying how to fix it.

Faults: an execution whose worker dies (its process or its node) or stops answering (no reply within
``timeout_s`` + :data:`ATTEMPT_MARGIN_S`) runs again once on another worker; when that one is lost too, the
model gets a tool error saying so. A lost worker is killed and replaced (SPREAD again). While no worker is
alive and none is starting, runs get a tool error at once instead of waiting. A call therefore ends within
two attempts of ``timeout_s`` + ``ATTEMPT_MARGIN_S`` each, once it has a slot.

Backpressure: at most ``workers`` x ``slots_per_worker`` runs are at the workers; up to ``max_waiting`` more
wait here, first come first served; one more gets a tool error at once, so memory stays bounded.

One pool serves every event loop and thread of the process (one per loop would multiply the actors): a run
takes its slot (``_ray_slots``) and awaits its worker on the caller's own loop, no other thread in between;
starting, watching and replacing workers happen on the pool's own event loop, on a daemon thread. Its actors
are owned by this process: Ray kills them if it dies; :meth:`RayPool.aclose` stops them first (each closes
its sandbox, then is killed).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .._aio import within
from .._ray_session import join_ray
from ..errors import ConfigurationError
from ..settings import SandboxSettings
from ._ray_slots import Slots, Unavailable
from ._ray_worker import SandboxWorker, WorkerInfo
from ._result import ExecutionResult
from ._runner import CodeRunner, Placement
from ._sandbox import SandboxIsolationError

__all__ = ["ATTEMPT_MARGIN_S", "RAY", "PoolState", "RayPlacement", "RayPool", "SandboxPoolError"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

ATTEMPT_MARGIN_S = 30.0
"""How long past ``timeout_s`` an execution may go without a reply before its worker counts as lost: the
worker's own grace for a hung interpreter (10 s), a restart of its interpreter, and the hop."""
_CLOSE_GRACE_S = 5.0  # a worker's own sandbox close, before it is killed
_REPLACE_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)  # between failed replacement starts; then every 30 s
_FIX_RESOURCES = (
    "lower sandbox.ray.workers or sandbox.ray.cpus_per_worker, add nodes to the Ray cluster, or set "
    "sandbox.placement: local"
)


class SandboxPoolError(ConfigurationError):
    """The Ray sandbox pool cannot start (Ray missing or not initialised, a cluster too small for it, workers
    that do not start): no snippet could run as the settings say. The message says how to fix it."""


class _Lost(Exception):
    """The worker running an execution was lost: it died, its node died, or it stopped answering."""


@dataclasses.dataclass(frozen=True)
class PoolState:
    """What the pool holds and has done (for logs, tests and the benchmark)."""

    workers: tuple[WorkerInfo, ...]
    starting: int
    busy: int
    waiting: int
    peak_busy: int
    """Most executions at the workers at once since the pool started: never above workers x slots."""
    retried: int
    """Executions run again because their worker was lost."""
    lost_workers: int
    failed: int
    """Executions whose worker was lost twice (the model got a tool error)."""


@dataclasses.dataclass(eq=False)
class _Worker:
    handle: Any
    started: Any  # the ObjectRef of its start call
    info: WorkerInfo | None = None
    busy: int = 0

    def __str__(self) -> str:
        return str(self.info) if self.info else "a worker that had not started"


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise SandboxPoolError(
            f"sandbox.placement: ray needs Ray, which cannot be imported here ({exc}): pip install "
            "'slime-strands[ray]' (on every node), or set sandbox.placement: local"
        ) from None
    return ray


class _OwnLoop:
    """An event loop on a daemon thread, where the pool starts, watches and replaces its workers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="slime-strands-sandbox-pool", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` there and wait for it here; cancelling the wait cancels it. RuntimeError: stopped."""
        try:
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:
            coro.close()
            raise
        return await asyncio.wrap_future(future)

    def submit(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` there, from any thread, without waiting; nothing when the loop is gone."""
        try:
            asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:
            coro.close()

    def stop(self) -> None:
        """Stop the loop (from any thread, its own included); its thread then ends."""
        with contextlib.suppress(RuntimeError):  # already closed
            self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join()


class RayPool(CodeRunner):
    """Runs each snippet on one of a pool of Ray sandbox workers; see the module docstring."""

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        self._pool = settings.ray
        self._own = _OwnLoop()
        self._slots: Slots[_Worker] = Slots(self._pool.slots_per_worker, self._pool.max_waiting)
        self._starting: set[_Worker] = set()  # launched, not up yet (killed if the pool closes)
        self._start_lock = asyncio.Lock()  # on the pool's loop
        self._started: str | None = None
        self._refused: ConfigurationError | None = None
        self._tasks: set[asyncio.Task[Any]] = set()  # on the pool's loop: starts, watches, replacements
        self._actor_class: Any = None
        self._lock = threading.Lock()  # the counters and flags below, from any thread
        self._active = 0
        self._retired = self._closing = False
        self._counts = collections.Counter[str]()

    # ---- the runner interface: any loop, any thread ----

    async def start(self) -> str:
        """Start every worker (at the first sample) and return the backend(s) isolating their runs."""
        if self._started is not None:
            return self._started
        try:
            return await self._own.call(self._start())
        except RuntimeError as exc:  # the pool's loop is gone
            raise SandboxPoolError("the Ray sandbox pool was closed") from exc

    async def run(self, code: str) -> ExecutionResult:
        await self.start()  # done at the first sample's preflight; a library caller gets the error here
        with self._lock:
            self._active += 1
        try:
            return await self._run(code)
        except Unavailable as exc:
            return self._error(str(exc))
        finally:
            with self._lock:
                self._active -= 1
                idle = self._retired and not self._active
            if idle:
                self.retire()

    def retire(self) -> None:
        with self._lock:
            self._retired = True
            idle = not self._active
        if idle:
            self._own.submit(self._close_and_stop())

    async def aclose(self) -> None:
        with contextlib.suppress(RuntimeError):
            await self._own.call(self._close())
        await asyncio.get_running_loop().run_in_executor(None, self._own.stop)

    def state(self) -> PoolState:
        busy, waiting, starting = self._slots.counts()
        with self._lock:
            counts = dict(self._counts)
        return PoolState(
            workers=tuple(w.info for w in self._slots.workers() if w.info is not None),
            starting=starting,
            busy=busy,
            waiting=waiting,
            peak_busy=self._slots.peak_busy,
            retried=counts.get("retried", 0),
            lost_workers=counts.get("lost", 0),
            failed=counts.get("failed", 0),
        )

    # ---- runs: on the caller's loop ----

    async def _run(self, code: str) -> ExecutionResult:
        try:
            return await self._attempt(code)
        except _Lost as first:
            if self._closing:
                return self._error("the Ray sandbox pool was closed while this code ran")
            self._count("retried")
            try:
                return await self._attempt(code)  # once more, on another worker
            except _Lost as second:
                self._count("failed")
                return self._error(
                    f"the Ray sandbox worker running this code was lost twice ({first}; then {second}): "
                    "its output is unknown"
                )

    async def _attempt(self, code: str) -> ExecutionResult:
        """One run on one worker; _Lost when that worker died or stopped answering (it is replaced)."""
        worker = await self._slots.acquire()
        ref = None
        patience = self.settings.timeout_s + ATTEMPT_MARGIN_S
        try:
            ref = worker.handle.run.remote(code)
            result: ExecutionResult = await within(ref, patience)
            return result
        except asyncio.CancelledError:
            if ref is not None:  # the worker's task is cancelled: its sandbox kills the run
                with contextlib.suppress(Exception):
                    _ray().cancel(ref)
            raise
        except asyncio.TimeoutError:
            why = f"no reply within {patience:g} s"
            self._lose(worker, why)
            raise _Lost(f"{worker}: {why}") from None
        except Exception as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, SandboxIsolationError):
                raise SandboxIsolationError(str(cause)) from None
            if not _worker_gone(exc):
                return self._error(f"the Ray sandbox worker on {worker} failed: {type(exc).__name__}: {exc}")
            self._lose(worker, type(exc).__name__)
            raise _Lost(f"{worker}: {type(exc).__name__}") from None
        finally:
            self._slots.release(worker)

    def _error(self, message: str) -> ExecutionResult:
        return ExecutionResult("", "", None, backend=self._started or "", error=message)

    def _count(self, what: str) -> None:
        with self._lock:
            self._counts[what] += 1

    # ---- workers: started, watched and replaced on the pool's loop ----

    async def _start(self) -> str:
        async with self._start_lock:
            if self._refused is not None:
                raise self._refused
            if self._started is None:
                try:
                    await self._start_workers()
                except ConfigurationError as exc:
                    self._refused = exc
                    raise
                self._started = ", ".join(sorted({w.info.backend for w in self._slots.workers() if w.info}))
            return self._started

    async def _start_workers(self) -> None:
        ray = _ray()
        if not ray.is_initialized():
            raise SandboxPoolError(
                "sandbox.placement: ray: Ray is not initialised in this process: call ray.init() first "
                "(slime's rollout actor has it; `slime-strands eval --sandbox-placement ray` joins RAY_ADDRESS "
                "or starts a local Ray), or set sandbox.placement: local"
            )
        await self._check_resources(ray)
        launched = [self._launch() for _ in range(self._pool.workers)]
        results = await asyncio.gather(*(self._await_start(w) for w in launched), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            for worker in launched:
                self._slots.remove(worker, replaced=False)  # not replaced: the pool did not start
                self._kill(worker)
            raise next((f for f in failures if isinstance(f, ConfigurationError)), failures[0])
        workers = self._slots.workers()
        logger.info(
            "slime-strands sandbox: Ray pool of %d workers x %d slots on %d node(s): %s",
            len(workers),
            self._pool.slots_per_worker,
            len({w.info.node_id for w in workers if w.info}),
            "; ".join(str(w) for w in workers),
        )

    async def _check_resources(self, ray: Any) -> None:
        """The cluster's totals can hold the pool (what is free now is the start timeout's business)."""
        total = await asyncio.get_running_loop().run_in_executor(None, ray.cluster_resources)
        pool = self._pool
        cpus = pool.workers * pool.cpus_per_worker
        if total.get("CPU", 0.0) < cpus:
            raise SandboxPoolError(
                f"sandbox.ray: {pool.workers} workers x {pool.cpus_per_worker:g} CPUs need {cpus:g} CPUs, but "
                f"the Ray cluster has {total.get('CPU', 0.0):g} in all: {_FIX_RESOURCES}"
            )
        custom = pool.custom_resource
        if custom is not None and total.get(custom, 0.0) < pool.workers:
            raise SandboxPoolError(
                f"sandbox.ray.custom_resource: {pool.workers} workers need one {custom!r} each, but the Ray "
                f"cluster has {total.get(custom, 0.0):g}: start the nodes meant for sandbox workers with "
                f"ray start --resources '{{\"{custom}\": N}}', or remove sandbox.ray.custom_resource"
            )

    def _actor(self) -> Any:
        if self._actor_class is None:
            ray, pool = _ray(), self._pool
            self._actor_class = ray.remote(SandboxWorker).options(
                num_cpus=pool.cpus_per_worker,
                resources={pool.custom_resource: 1} if pool.custom_resource else None,
                scheduling_strategy="SPREAD",
                max_concurrency=pool.slots_per_worker + 2,  # + its watch and its close
                max_restarts=0,  # the pool replaces it, started and checked again
            )
        return self._actor_class

    def _launch(self, counted: bool = False) -> _Worker:
        """Create one worker actor now; :meth:`_await_start` waits for it. ``counted``: already counted as
        starting (a replacement, counted when its predecessor was removed)."""
        handle = self._actor().remote(self.settings.in_one_worker())
        worker = _Worker(handle, handle.start.remote())
        if not counted:
            self._slots.starting(+1)
        self._starting.add(worker)
        return worker

    async def _await_start(self, worker: _Worker) -> None:
        """Wait until ``worker`` started (isolation checked on its node); then it takes runs."""
        try:
            worker.info = await within(worker.started, self._pool.start_timeout_s)
        except asyncio.CancelledError:
            self._kill(worker)
            raise
        except Exception as exc:
            self._kill(worker)
            raise await self._start_failure(exc) from None
        else:
            if self._closing:
                self._kill(worker)
            else:
                self._slots.add(worker)
                self._spawn(self._watch(worker))
        finally:
            self._starting.discard(worker)
            self._slots.starting(-1)

    async def _start_failure(self, exc: Exception) -> ConfigurationError:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, SandboxIsolationError):
            return SandboxIsolationError(str(cause))
        if isinstance(exc, asyncio.TimeoutError):
            return SandboxPoolError(
                f"a Ray sandbox worker did not start within sandbox.ray.start_timeout_s = "
                f"{self._pool.start_timeout_s:g} s ({await self._room()}): {_FIX_RESOURCES}, or raise "
                "sandbox.ray.start_timeout_s on slow nodes"
            )
        return SandboxPoolError(f"a Ray sandbox worker did not start: {type(exc).__name__}: {exc}")

    async def _room(self) -> str:
        """What a worker needs, what is free now, and what the pool's own started workers hold besides (Ray
        frees that when the pool gives up: 'free now' alone would understate the room the pool has)."""
        free = await asyncio.get_running_loop().run_in_executor(None, _ray().available_resources)
        wanted = {"CPU": self._pool.cpus_per_worker}
        if self._pool.custom_resource:
            wanted[self._pool.custom_resource] = 1.0
        room = (
            f"each worker needs {wanted}; free in the cluster now: { {k: free.get(k, 0.0) for k in wanted} }"
        )
        up = len(self._slots.workers())
        if up:
            held = {k: round(up * v, 6) for k, v in wanted.items()}
            room += f", besides the {held} that the {up} started worker(s) of the pool's {self._pool.workers} hold"
        return room

    async def _watch(self, worker: _Worker) -> None:
        """Learn at once when ``worker`` dies, even idle: its ``wait_until_stopped`` fails then."""
        try:
            await worker.handle.wait_until_stopped.remote()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._lose(worker, f"it died: {type(exc).__name__}")

    def _lose(self, worker: _Worker, why: str) -> None:
        """``worker`` is gone or hung (from any thread): kill it, and start a replacement (once the pool has
        started: a worker lost during the first start fails it)."""
        replace = not self._closing and self._started is not None
        if not self._slots.remove(worker, replaced=replace):
            return  # lost already
        self._kill(worker)
        if not replace:
            return
        self._count("lost")
        logger.warning("slime-strands sandbox: Ray sandbox worker on %s lost (%s); replacing it", worker, why)
        self._own.submit(self._replace())

    async def _replace(self) -> None:
        """Start a replacement (already counted as starting); while that fails, try again with a backoff."""
        if self._closing:
            self._slots.starting(-1)
            return
        self._spawn_current()  # cancelled if the pool closes
        counted = True
        for attempt in itertools.count():
            try:
                await self._await_start(self._launch(counted=counted))
                return
            except ConfigurationError as exc:
                delay = _REPLACE_BACKOFF_S[min(attempt, len(_REPLACE_BACKOFF_S) - 1)]
                logger.warning(
                    "slime-strands sandbox: a replacement Ray sandbox worker did not start (%s); next try in "
                    "%g s",
                    exc,
                    delay,
                )
                counted = False
                await asyncio.sleep(delay)

    def _kill(self, worker: _Worker) -> None:
        with contextlib.suppress(Exception):
            _ray().kill(worker.handle, no_restart=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._track(asyncio.ensure_future(coro))

    def _spawn_current(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._track(task)

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- closing: on the pool's loop ----

    async def _close_and_stop(self) -> None:
        await self._close()
        self._own.stop()

    async def _close(self) -> None:
        """Stop every worker (each closes its sandbox first) and fail whatever waits."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        workers = self._slots.close("the Ray sandbox pool was closed")
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for worker in list(self._starting):
            self._kill(worker)
        await asyncio.gather(*(self._stop_worker(w) for w in workers), return_exceptions=True)

    async def _stop_worker(self, worker: _Worker) -> None:
        with contextlib.suppress(Exception):
            await within(worker.handle.close.remote(), _CLOSE_GRACE_S)
        self._kill(worker)


def _worker_gone(exc: BaseException) -> bool:
    """Whether ``exc`` says the worker (or its node, or the result's copy) is gone, not the code."""
    errors = _ray().exceptions
    gone = (errors.RayActorError, errors.ObjectLostError, errors.WorkerCrashedError, errors.NodeDiedError)
    return isinstance(exc, gone)


class RayPlacement(Placement):
    """One pool per settings for the whole process (it serves every event loop)."""

    shared = True

    def make(self, settings: SandboxSettings) -> CodeRunner:
        return RayPool(settings)

    def join(self) -> Callable[[], None] | None:
        """Connect this process to Ray: ``RAY_ADDRESS``'s cluster, else a new local one; None when it
        already is (inside slime). Returns what disconnects it (and stops and removes a Ray it started)."""
        return join_ray(_ray(), SandboxPoolError)


RAY = RayPlacement()
