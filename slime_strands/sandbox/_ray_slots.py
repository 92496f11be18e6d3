"""The Ray pool's slots: which worker has a free one, and who waits for one, from any event loop or thread.

A worker takes at most ``per_worker`` runs at once; a run takes the least busy worker with a free slot. When
none has one, the caller waits, first come first served, up to ``max_waiting`` callers; one more is refused at
once (memory stays bounded). A freed slot is handed to the first waiter directly (no later caller can take it
first); a waiter cancelled as it is handed one passes it on. While no worker is up and none is starting,
waiting would never end: callers are refused at once and waiters fail. Callers wait on their own event loop;
what they share is under one threading lock, so the hot path never hops to another thread.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import threading
from typing import Generic, Protocol, TypeVar

__all__ = ["Slots", "Unavailable"]


class Unavailable(Exception):
    """No slot can be had: too many callers wait, no worker is up, or the pool was closed (the message says)."""


class _Worker(Protocol):
    busy: int


W = TypeVar("W", bound=_Worker)


@dataclasses.dataclass(eq=False)
class _Waiter(Generic[W]):
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[W]
    worker: W | None = None
    """The worker whose slot it was handed (under the lock)."""
    settled: bool = False
    """That slot was given back (the waiter was cancelled), or the waiter was removed: nothing more to do."""


class Slots(Generic[W]):
    """The workers that take runs, their busy slots, and the callers waiting for one."""

    def __init__(self, per_worker: int, max_waiting: int) -> None:
        self._per_worker, self._max_waiting = per_worker, max_waiting
        self._lock = threading.Lock()
        self._workers: list[W] = []
        self._starting = 0
        self._waiters: collections.deque[_Waiter[W]] = collections.deque()
        self._closed: str | None = None
        self.peak_busy = 0
        """Most runs at the workers at once: never above the workers' slots."""

    # -- membership (the pool's management) --

    def starting(self, delta: int) -> None:
        """Workers being started: +1 when one is launched, -1 when it is up (after :meth:`add`) or failed."""
        with self._lock:
            self._starting += delta
            failed = self._fail_if_down()
        self._settle(failed, [])

    def add(self, worker: W) -> None:
        """``worker`` takes runs from now on."""
        with self._lock:
            self._workers.append(worker)
            handed = self._hand_over()
        self._settle([], handed)

    def remove(self, worker: W, *, replaced: bool) -> bool:
        """``worker`` takes no more runs (it is lost); ``replaced``: a replacement starts, counted at once so
        no caller is refused in between. False when it was not there (already removed)."""
        with self._lock:
            if worker not in self._workers:
                return False
            self._workers.remove(worker)
            self._starting += replaced
            failed = self._fail_if_down()
        self._settle(failed, [])
        return True

    def workers(self) -> list[W]:
        with self._lock:
            return list(self._workers)

    def close(self, why: str) -> list[W]:
        """Refuse every caller from now on with ``why``, fail the waiters, and return the workers."""
        with self._lock:
            self._closed = why
            failed, self._waiters = list(self._waiters), collections.deque()
            workers, self._workers = self._workers, []
        self._settle(failed, [])
        return workers

    def counts(self) -> tuple[int, int, int]:
        """(busy slots, waiting callers, workers starting)."""
        with self._lock:
            return sum(w.busy for w in self._workers), len(self._waiters), self._starting

    # -- use (any event loop) --

    async def acquire(self) -> W:
        """A worker with a free slot for this caller; :class:`Unavailable` when none can be had."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._waiters and (worker := self._least_busy()) is not None:
                return self._take(worker)
            if self._closed is not None or self._down():
                raise Unavailable(self._why_down())
            if len(self._waiters) >= self._max_waiting:
                raise Unavailable(
                    f"{len(self._waiters)} executions already wait for the Ray sandbox pool "
                    "(sandbox.ray.max_waiting): this one was not run"
                )
            waiter: _Waiter[W] = _Waiter(loop, loop.create_future())
            self._waiters.append(waiter)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._give_back(waiter)
            raise

    def release(self, worker: W) -> None:
        """The run on ``worker`` is over: its slot goes to the first waiter, if any."""
        with self._lock:
            worker.busy -= 1
            handed = self._hand_over()
        self._settle([], handed)

    # -- under the lock --

    def _least_busy(self) -> W | None:
        free = [w for w in self._workers if w.busy < self._per_worker]
        return min(free, key=lambda w: w.busy) if free else None

    def _take(self, worker: W) -> W:
        worker.busy += 1
        self.peak_busy = max(self.peak_busy, sum(w.busy for w in self._workers))
        return worker

    def _hand_over(self) -> list[_Waiter[W]]:
        handed = []
        while self._waiters and (worker := self._least_busy()) is not None:
            waiter = self._waiters.popleft()
            waiter.worker = self._take(worker)
            handed.append(waiter)
        return handed

    def _down(self) -> bool:
        return not self._workers and not self._starting

    def _why_down(self) -> str:
        return self._closed or (
            "no Ray sandbox worker is up and none is starting (lost workers are replaced, with a backoff): "
            "this code was not run"
        )

    def _fail_if_down(self) -> list[_Waiter[W]]:
        if not self._down():
            return []
        failed, self._waiters = list(self._waiters), collections.deque()
        return failed

    # -- outside the lock: each waiter is settled on its own loop --

    def _settle(self, failed: list[_Waiter[W]], handed: list[_Waiter[W]]) -> None:
        why = self._why_down()
        for waiter in failed:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits there any more
                waiter.loop.call_soon_threadsafe(_fail, waiter.future, why)
        for waiter in handed:
            try:
                waiter.loop.call_soon_threadsafe(self._deliver, waiter)
            except RuntimeError:  # its loop is closed: nobody will take the slot
                self._give_back(waiter)

    def _deliver(self, waiter: _Waiter[W]) -> None:
        with self._lock:
            if waiter.settled:
                return
            cancelled = waiter.future.cancelled()
        if cancelled:
            self._give_back(waiter)
        else:
            assert waiter.worker is not None
            waiter.future.set_result(waiter.worker)

    def _give_back(self, waiter: _Waiter[W]) -> None:
        """A waiter that will not run (cancelled, or its loop closed): out of the queue, or its slot passed on."""
        with self._lock:
            if waiter.settled:
                return
            waiter.settled = True
            if waiter.worker is None:
                with contextlib.suppress(ValueError):  # failed already
                    self._waiters.remove(waiter)
                return
        self.release(waiter.worker)


def _fail(future: asyncio.Future[W], why: str) -> None:
    if not future.done():
        future.set_exception(Unavailable(why))
