"""Waiting with a time limit without ever losing a cancel.

On Python 3.10 and 3.11, ``asyncio.wait_for`` returns normally when it is cancelled just after what it
waits for completed: the cancel is dropped (fixed in 3.12). For slime that means an abort that lands in
that instant is ignored, and a sandbox run or a grading worker keeps its slot until its own timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["within"]

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout_s: float) -> T:
    """``asyncio.wait_for`` that always raises a cancel: what is awaited is cancelled with us, or at the
    timeout (then ``asyncio.TimeoutError``)."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except BaseException:
        task.cancel()
        raise
    if not done:
        task.cancel()
        raise asyncio.TimeoutError
    return task.result()
