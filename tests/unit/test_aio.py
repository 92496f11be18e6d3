"""``within``: a time limit that never drops a cancel (``asyncio.wait_for`` does on Python 3.10 / 3.11)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from slime_strands._aio import within


async def _cancel_just_after_completion(wait):
    """Cancel the waiting task after what it awaits completed but before the task resumed."""
    done = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(wait(done, 10))
    await asyncio.sleep(0)  # the task is now waiting on ``done``
    done.set_result("result")
    task.cancel()
    return task


async def test_a_cancel_landing_just_after_completion_is_raised():
    task = await _cancel_just_after_completion(within)
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 fixed asyncio.wait_for")
async def test_asyncio_wait_for_drops_that_cancel_here():
    """Why ``within`` exists: the same step through ``asyncio.wait_for`` loses the cancel."""
    task = await _cancel_just_after_completion(asyncio.wait_for)
    assert await task == "result"


async def test_result_timeout_and_cancel_of_the_awaited():
    assert await within(asyncio.sleep(0, result=7), 1) == 7
    slow = asyncio.ensure_future(asyncio.sleep(3600))
    with pytest.raises(asyncio.TimeoutError):
        await within(slow, 0)
    await asyncio.sleep(0)
    assert slow.cancelled(), "what timed out is cancelled"
    waiter = asyncio.ensure_future(asyncio.sleep(3600))
    outer = asyncio.create_task(within(waiter, 3600))
    await asyncio.sleep(0)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert waiter.cancelled(), "what is awaited is cancelled with the caller"
