"""``rollout_workers.count: N``: agent episodes run on a pool of N Ray actors spread over slime's cluster.

The pool is an :class:`~slime_strands.agent.runner.EpisodeRunner`: ``generate`` hands it an episode's job and
gets the record back, as from the in-process runner. It starts its workers
(:class:`~._worker.RolloutWorker`: SPREAD scheduling, CPU only, one unit of ``custom_resource`` each) in the Ray
cluster this process is connected to (inside slime: the rollout actor's) at the first sample, logs their start
once, and stops them when the process ends (they are owned by it: Ray kills them with it, and an ``atexit``
hook kills them first). A worker that cannot start (Ray missing or not initialised, a cluster too small, a
tokenizer or a tool that does not load there) stops the run at that first sample with a
:class:`RolloutWorkersError` naming the worker and its message.

Assignment: the worker with the fewest episodes in flight, ties round-robin, at most ``max_in_flight`` each; the
rest wait first come first served, up to ``max_waiting`` (one more ends FAILED at once: memory stays bounded).
The job goes to the worker and its record comes back as Ray objects; the caller awaits them on its own loop
(never a thread blocked in ``ray.get``). slime's abort flag is read when a job is sent and, while it runs,
watched here: when it turns, the worker is told, and its episodes stop as in-process ones do (between turns,
and their requests, which slime's own abort of the router ends too).

Faults: an episode whose worker dies (its process or its node) runs once more from its start (or the
checkpoint it came with) on another worker, and ends FAILED when that one is lost too: never a hang, nothing
written twice. A lost worker is replaced; while none is up and its replacement cannot start, the run stops
with one :class:`RolloutWorkersError`.

One pool per configuration and event loop (slime's rollout has one loop); its management runs on that loop.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import dataclasses
import logging
import weakref
from typing import Any

from .._aio import within
from ..agent.record import EpisodeRecord, Termination
from ..agent.runner import EpisodeJob, EpisodeRunner
from ..agent.runtime import Runtime
from ..errors import ConfigurationError
from ..provider.abort_signal import AbortSignal
from ..settings import RolloutWorkersSettings
from ._worker import RolloutWorker, WorkerCounts, WorkerInfo, WorkerSetup

__all__ = ["PoolState", "RolloutWorkersError", "WorkerPool"]

logger = logging.getLogger(__name__)

_CLOSE_GRACE_S = 5.0
_FIX = "lower rollout_workers.count or rollout_workers.cpus_per_worker, add nodes, or set rollout_workers.count: 0"


class RolloutWorkersError(ConfigurationError):
    """The rollout workers cannot run episodes (none starts, or none is left and none can start): the message
    says why and how to fix it."""


class _Lost(Exception):
    """The worker running an episode died (its process or its node)."""


class _Unavailable(Exception):
    """No worker slot can be had for this episode (too many wait)."""


@dataclasses.dataclass(frozen=True)
class PoolState:
    """What the pool holds and has done (metrics, logs, tests, the benchmark)."""

    workers: tuple[WorkerInfo, ...]
    episodes: tuple[int, ...]
    """Episodes each worker of ``workers`` returned (this driver's count)."""
    in_flight: int
    waiting: int
    starting: int
    starts: int
    """Times the pool started (once per process and configuration)."""
    peak_in_flight: int
    retried: int
    """Episodes run again because their worker was lost."""
    lost_workers: int
    failed: int
    """Episodes whose worker was lost twice (they ended FAILED)."""


@dataclasses.dataclass(eq=False)
class _Worker:
    handle: Any
    info: WorkerInfo | None = None
    busy: int = 0
    episodes: int = 0
    told_abort: bool = False

    def __str__(self) -> str:
        return f"rollout worker on {self.info}" if self.info else "a rollout worker that had not started"


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RolloutWorkersError(
            f"rollout_workers.count > 0 needs Ray, which cannot be imported here ({exc}): pip install "
            "'slime-strands[ray]', or set rollout_workers.count: 0"
        ) from None
    return ray


_LIVE: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


@atexit.register
def _kill_all() -> None:
    """The process ends: no worker outlives it (Ray would kill its owned actors too, later)."""
    for pool in list(_LIVE):
        pool.kill()


class WorkerPool(EpisodeRunner):
    """Runs each episode on one of ``settings.count`` Ray rollout workers; see the module docstring."""

    def __init__(self, setup: WorkerSetup, settings: RolloutWorkersSettings) -> None:
        self.setup = setup
        self._settings = settings
        self._workers: list[_Worker] = []
        self._launched: set[_Worker] = set()
        self._starting = 0
        self._waiters: collections.deque[asyncio.Future[_Worker]] = collections.deque()
        self._next = 0
        self._start_task: asyncio.Future[None] | None = None
        self._down: RolloutWorkersError | None = None
        self._closing = False
        self._tasks: set[asyncio.Future[Any]] = set()
        self._actor_class: Any = None
        self._counts = collections.Counter[str]()
        self._peak = 0
        _LIVE.add(self)

    # ---- the runner interface: on the pool's loop ----

    async def run(
        self, runtime: Runtime, job: EpisodeJob, *, tokenizer: Any, vision: Any, abort: Any
    ) -> EpisodeRecord:
        await self.start()
        signal = abort if abort is None or isinstance(abort, AbortSignal) else AbortSignal(abort)
        try:
            try:
                return await self._attempt(job, signal)
            except _Lost as first:
                if self._closing:
                    return _failed(
                        job, f"the rollout worker pool was closed while this episode ran ({first})"
                    )
                self._counts["retried"] += 1
                try:
                    return await self._attempt(job, signal)  # once more, from its start or its checkpoint
                except _Lost as second:
                    self._counts["failed"] += 1
                    return _failed(
                        job, f"the rollout workers running this episode were lost twice ({first}; {second})"
                    )
        except _Unavailable as exc:
            return _failed(job, str(exc))

    async def start(self) -> None:
        """Start every worker (at the first sample); RolloutWorkersError / ConfigurationError say why not."""
        if self._start_task is None:
            self._start_task = asyncio.ensure_future(self._start_workers())
        await asyncio.shield(self._start_task)

    def state(self) -> PoolState:
        live = [w for w in self._workers if w.info is not None]
        return PoolState(
            workers=tuple(w.info for w in live if w.info is not None),
            episodes=tuple(w.episodes for w in live),
            in_flight=sum(w.busy for w in self._workers),
            waiting=len(self._waiters),
            starting=self._starting,
            starts=self._counts["starts"],
            peak_in_flight=self._peak,
            retried=self._counts["retried"],
            lost_workers=self._counts["lost"],
            failed=self._counts["failed"],
        )

    async def worker_counts(self) -> list[WorkerCounts]:
        """Each live worker's own counts (asked of the workers)."""
        refs = [w.handle.counts.remote() for w in self._workers]
        return list(await asyncio.gather(*refs))

    async def aclose(self) -> None:
        """Stop every worker (each closes its client) and fail whatever waits."""
        if self._closing:
            return
        self._closing = True
        _LIVE.discard(self)
        self._fail_waiters(RolloutWorkersError("the rollout worker pool was closed"))
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        workers, self._workers = self._workers, []
        for worker in list(self._launched):
            self._kill(worker)
        await asyncio.gather(*(self._stop_worker(w) for w in workers), return_exceptions=True)

    def kill(self) -> None:
        """Kill every worker now, from anywhere (the process ends)."""
        self._closing = True
        for worker in [*self._workers, *self._launched]:
            self._kill(worker)
        self._workers = []

    # ---- one attempt: on the caller's loop ----

    async def _attempt(self, job: EpisodeJob, abort: AbortSignal | None) -> EpisodeRecord:
        worker = await self._acquire()
        ref = None
        try:
            aborted = bool(abort is not None and abort())
            worker.told_abort = aborted
            ref = worker.handle.run.remote(job, aborted)
            record: EpisodeRecord = await self._result(ref, worker, abort)
            worker.episodes += 1
            return record
        except asyncio.CancelledError:
            if ref is not None:  # slime cancelled the sample: the worker's episode is cancelled too
                with contextlib.suppress(Exception):
                    _ray().cancel(ref)
            raise
        except Exception as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, ConfigurationError):
                raise ConfigurationError(f"on the {worker}: {cause}") from None
            if not _worker_gone(exc):
                return _failed(job, f"the {worker} failed: {type(exc).__name__}: {exc}")
            self._lose(worker, type(exc).__name__)
            raise _Lost(f"{worker}: {type(exc).__name__}") from None
        finally:
            self._release(worker)

    async def _result(self, ref: Any, worker: _Worker, abort: AbortSignal | None) -> EpisodeRecord:
        """The record of ``ref``; slime's abort, if it turns meanwhile, is passed on to ``worker``."""
        result = asyncio.ensure_future(ref)
        if abort is None:
            return await result
        watch = asyncio.ensure_future(abort.wait())
        try:
            done, _ = await asyncio.wait({result, watch}, return_when=asyncio.FIRST_COMPLETED)
            if result not in done and not worker.told_abort:
                worker.told_abort = True
                worker.handle.abort.remote()
            return await result
        finally:
            watch.cancel()
            result.cancel()

    # ---- slots: least in flight, ties round-robin, a bounded queue ----

    async def _acquire(self) -> _Worker:
        if not self._waiters and (worker := self._pick()) is not None:
            return self._take(worker)
        if self._down is not None:
            raise self._down
        if self._closing:
            raise _Unavailable("the rollout worker pool was closed: this episode was not run")
        if len(self._waiters) >= self._settings.max_waiting:
            raise _Unavailable(
                f"{len(self._waiters)} episodes already wait for a rollout worker (rollout_workers.max_waiting): "
                "this one was not run"
            )
        future: asyncio.Future[_Worker] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self._release(future.result())
            with contextlib.suppress(ValueError):
                self._waiters.remove(future)
            raise

    def _pick(self) -> _Worker | None:
        workers = self._workers
        if not workers:
            return None
        low = min(w.busy for w in workers)
        if low >= self.setup.max_in_flight:
            return None
        n = len(workers)
        for i in range(n):
            worker = workers[(self._next + i) % n]
            if worker.busy == low:
                self._next = (self._next + i + 1) % n
                return worker
        return None  # pragma: no cover - low is some worker's count

    def _take(self, worker: _Worker) -> _Worker:
        worker.busy += 1
        self._peak = max(self._peak, sum(w.busy for w in self._workers))
        return worker

    def _release(self, worker: _Worker) -> None:
        worker.busy -= 1
        self._hand_over()

    def _hand_over(self) -> None:
        while self._waiters and (worker := self._pick()) is not None:
            future = self._waiters.popleft()
            if not future.done():
                future.set_result(self._take(worker))

    def _fail_waiters(self, error: Exception) -> None:
        waiters, self._waiters = self._waiters, collections.deque()
        for future in waiters:
            if not future.done():
                future.set_exception(error)

    # ---- workers: started, watched, replaced ----

    async def _start_workers(self) -> None:
        ray = _ray()
        if not ray.is_initialized():
            raise RolloutWorkersError(
                "rollout_workers: Ray is not initialised in this process: call ray.init() first (slime's rollout "
                "actor has it; `slime-strands eval --rollout-workers N` joins RAY_ADDRESS or starts a local Ray), "
                "or set rollout_workers.count: 0"
            )
        await self._check_resources(ray)
        count = self._settings.count
        launched = [self._launch() for _ in range(count)]
        results = await asyncio.gather(*(self._await_start(w) for w in launched), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            for worker in launched:
                self._kill(worker)
            self._workers = []
            raise next((f for f in failures if isinstance(f, ConfigurationError)), failures[0])
        self._counts["starts"] += 1
        logger.info(
            "slime-strands: %d rollout workers x %d episodes on %d node(s): %s",
            len(self._workers),
            self.setup.max_in_flight,
            len({w.info.node_id for w in self._workers if w.info}),
            "; ".join(str(w.info) for w in self._workers),
        )

    async def _check_resources(self, ray: Any) -> None:
        total = await asyncio.get_running_loop().run_in_executor(None, ray.cluster_resources)
        settings = self._settings
        cpus = settings.count * settings.cpus_per_worker
        if total.get("CPU", 0.0) < cpus:
            raise RolloutWorkersError(
                f"rollout_workers: {settings.count} workers x {settings.cpus_per_worker:g} CPUs need {cpus:g} "
                f"CPUs, but the Ray cluster has {total.get('CPU', 0.0):g} in all: {_FIX}"
            )
        custom = settings.custom_resource
        if custom is not None and total.get(custom, 0.0) < settings.count:
            raise RolloutWorkersError(
                f"rollout_workers.custom_resource: {settings.count} workers need one {custom!r} each, but the Ray "
                f"cluster has {total.get(custom, 0.0):g}: start the nodes meant for rollout workers with "
                f"ray start --resources '{{\"{custom}\": N}}', or remove rollout_workers.custom_resource"
            )

    def _actor(self) -> Any:
        if self._actor_class is None:
            settings = self._settings
            self._actor_class = (
                _ray()
                .remote(RolloutWorker)
                .options(
                    num_cpus=settings.cpus_per_worker,
                    num_gpus=0,
                    resources={settings.custom_resource: 1} if settings.custom_resource else None,
                    scheduling_strategy="SPREAD",  # never a bundle of slime's placement group (its GPUs)
                    max_concurrency=self.setup.max_in_flight + 8,  # + its watch, aborts, counts and close
                    max_restarts=0,  # the pool replaces it
                )
            )
        return self._actor_class

    def _launch(self) -> _Worker:
        worker = _Worker(self._actor().remote(self.setup))
        self._launched.add(worker)
        self._starting += 1
        return worker

    async def _await_start(self, worker: _Worker) -> None:
        try:
            worker.info = await within(worker.handle.start.remote(), self._settings.start_timeout_s)
        except asyncio.CancelledError:
            self._kill(worker)
            raise
        except Exception as exc:
            self._kill(worker)
            raise await self._start_failure(exc) from None
        else:
            if self._closing:
                self._kill(worker)
                return
            self._workers.append(worker)
            self._spawn(self._watch(worker))
            self._hand_over()
        finally:
            self._launched.discard(worker)
            self._starting -= 1

    async def _start_failure(self, exc: Exception) -> ConfigurationError:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, ConfigurationError):
            return ConfigurationError(f"a rollout worker could not start: {cause}")
        if isinstance(exc, asyncio.TimeoutError):
            return RolloutWorkersError(
                f"a rollout worker did not start within rollout_workers.start_timeout_s = "
                f"{self._settings.start_timeout_s:g} s (each needs {self._settings.cpus_per_worker:g} CPU(s) "
                f"free): {_FIX}, or raise rollout_workers.start_timeout_s on slow nodes"
            )
        return RolloutWorkersError(f"a rollout worker did not start: {type(exc).__name__}: {exc}")

    async def _watch(self, worker: _Worker) -> None:
        """Learn at once when ``worker`` dies, even idle."""
        try:
            await worker.handle.wait_until_stopped.remote()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._lose(worker, f"it died: {type(exc).__name__}")

    def _lose(self, worker: _Worker, why: str) -> None:
        if worker not in self._workers:
            return
        self._workers.remove(worker)
        self._kill(worker)
        if self._closing:
            return
        self._counts["lost"] += 1
        logger.warning("slime-strands: %s lost (%s); starting a replacement", worker, why)
        self._starting += 1  # counted now: waiters keep waiting for it
        self._spawn(self._replace())

    async def _replace(self) -> None:
        self._starting -= 1
        try:
            worker = self._launch()
            await self._await_start(worker)
        except asyncio.CancelledError:
            raise
        except ConfigurationError as exc:
            if not self._workers and not self._starting:
                self._down = RolloutWorkersError(
                    f"no rollout worker is left and a replacement did not start ({exc}): the run cannot go on"
                )
                logger.error("slime-strands: %s", self._down)
                self._fail_waiters(self._down)
            else:
                logger.warning("slime-strands: a replacement rollout worker did not start (%s)", exc)
        else:
            self._down = None

    def _kill(self, worker: _Worker) -> None:
        with contextlib.suppress(Exception):
            _ray().kill(worker.handle, no_restart=True)

    async def _stop_worker(self, worker: _Worker) -> None:
        with contextlib.suppress(Exception):
            await within(worker.handle.close.remote(), _CLOSE_GRACE_S)
        self._kill(worker)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _failed(job: EpisodeJob, error: str) -> EpisodeRecord:
    logger.warning("slime-strands: an episode ended FAILED: %s", error)
    return EpisodeRecord(Termination.FAILED, evaluation=job.spec.evaluation, error=error)


def _worker_gone(exc: BaseException) -> bool:
    errors = _ray().exceptions
    gone = (errors.RayActorError, errors.ObjectLostError, errors.WorkerCrashedError, errors.NodeDiedError)
    return isinstance(exc, gone)
