"""AbortSignal: slime's abort flag (a plain attribute, polled) as something coroutines can wait for.

It lives in the provider because the model waits on it: when an episode's signal holds, ``SGLangModel`` aborts
its own turn in flight by its exact request ids. The episode's tools wait on the same signal
(``slime_strands.agent.resume``), so one poller per event loop serves them all.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable

__all__ = ["AbortSignal"]

_POLL_S = 0.05


class AbortSignal:
    """A predicate (slime's ``GenerateState.aborted``) that coroutines can also wait for.

    Calling it reads the predicate. :meth:`wait` returns once it holds: one poller task per event loop checks
    it every ``interval_s`` while anything waits, however many waiters there are."""

    def __init__(self, predicate: Callable[[], bool], interval_s: float = _POLL_S) -> None:
        self._predicate = predicate
        self._interval_s = interval_s
        self._waiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, set[asyncio.Future[None]]] = (
            weakref.WeakKeyDictionary()
        )
        self._pollers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
            weakref.WeakKeyDictionary()
        )

    def __call__(self) -> bool:
        return bool(self._predicate())

    async def wait(self) -> None:
        if self():
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiters = self._waiters.setdefault(loop, set())
        waiters.add(future)
        if loop not in self._pollers:
            self._pollers[loop] = loop.create_task(self._poll(loop, waiters))
        try:
            await future
        finally:
            waiters.discard(future)

    async def _poll(self, loop: asyncio.AbstractEventLoop, waiters: set[asyncio.Future[None]]) -> None:
        try:
            while waiters:
                await asyncio.sleep(self._interval_s)
                if self():  # every waiter is answered: none is left for another check to serve
                    for future in list(waiters):
                        if not future.done():
                            future.set_result(None)
                    return
        finally:
            self._pollers.pop(loop, None)
