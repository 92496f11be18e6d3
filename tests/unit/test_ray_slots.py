"""The Ray pool's slots (no Ray needed): first come first served, a bound on waiting callers, a cancelled
waiter passing its slot on, callers on other event loops and threads, and no waiting while nothing is up."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

from slime_strands.sandbox._ray_slots import Slots, Unavailable


@dataclasses.dataclass(eq=False)
class Worker:
    name: str
    busy: int = 0


async def _settle() -> None:
    for _ in range(5):  # handed slots are delivered by call_soon callbacks
        await asyncio.sleep(0)


async def test_the_least_busy_worker_is_taken_and_never_more_than_its_slots():
    slots: Slots[Worker] = Slots(per_worker=2, max_waiting=10)
    a, b = Worker("a"), Worker("b")
    slots.add(a)
    slots.add(b)
    taken = [await slots.acquire() for _ in range(4)]
    assert sorted(w.name for w in taken) == ["a", "a", "b", "b"]
    assert slots.counts() == (4, 0, 0) and slots.peak_busy == 4
    waiter = asyncio.create_task(slots.acquire())
    await _settle()
    assert not waiter.done() and slots.counts() == (4, 1, 0)
    slots.release(b)
    assert await waiter is b and slots.peak_busy == 4


async def test_a_run_takes_the_least_busy_worker_while_others_have_free_slots_too():
    """Slots are left free on every worker when the choice is checked: the run goes to the worker with the
    fewest runs, never to a busier one that still has room."""
    slots: Slots[Worker] = Slots(per_worker=3, max_waiting=10)
    a, b, c = Worker("a"), Worker("b"), Worker("c")
    for worker in (a, b, c):
        slots.add(worker)
    taken = [await slots.acquire() for _ in range(6)]  # 9 slots, 6 runs: spread 2-2-2, 3 slots still free
    assert sorted(w.name for w in taken) == ["a", "a", "b", "b", "c", "c"]
    slots.release(b)
    slots.release(b)
    slots.release(c)  # a: 2, b: 0, c: 1 busy; every worker has a free slot
    assert (await slots.acquire()) is b
    assert (a.busy, b.busy, c.busy) == (2, 1, 1)
    slots.release(a)
    slots.release(a)  # a: 0 is now the least busy; b and c (1 each) have room as well
    assert (await slots.acquire()) is a


async def test_waiters_are_served_in_order_and_a_late_caller_does_not_jump_the_queue():
    slots: Slots[Worker] = Slots(per_worker=1, max_waiting=10)
    only = Worker("only")
    slots.add(only)
    await slots.acquire()
    order: list[int] = []

    async def wait(i: int) -> None:
        await slots.acquire()
        order.append(i)
        slots.release(only)

    waiters = [asyncio.create_task(wait(i)) for i in range(3)]
    await _settle()
    slots.release(only)  # handed to waiter 0 directly ...
    late = asyncio.create_task(wait(99))  # ... so this caller queues behind the others
    await asyncio.gather(*waiters, late)
    assert order == [0, 1, 2, 99]


async def test_callers_beyond_max_waiting_are_refused_at_once():
    slots: Slots[Worker] = Slots(per_worker=1, max_waiting=2)
    slots.add(Worker("w"))
    await slots.acquire()
    waiting = [asyncio.create_task(slots.acquire()) for _ in range(2)]
    await _settle()
    with pytest.raises(Unavailable, match=r"2 executions already wait .*sandbox\.ray\.max_waiting"):
        await slots.acquire()
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert slots.counts() == (1, 0, 0)


async def test_a_waiter_cancelled_as_it_is_handed_a_slot_passes_it_on():
    slots: Slots[Worker] = Slots(per_worker=1, max_waiting=10)
    w = Worker("w")
    slots.add(w)
    await slots.acquire()
    first, second = asyncio.create_task(slots.acquire()), asyncio.create_task(slots.acquire())
    await _settle()
    slots.release(w)  # handed to `first`, delivered by a callback not run yet
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await second is w and w.busy == 1
    slots.release(w)
    assert slots.counts() == (0, 0, 0)


async def test_a_cancelled_waiter_leaves_the_queue():
    slots: Slots[Worker] = Slots(per_worker=1, max_waiting=10)
    w = Worker("w")
    slots.add(w)
    await slots.acquire()
    waiter = asyncio.create_task(slots.acquire())
    await _settle()
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert slots.counts() == (1, 0, 0)
    slots.release(w)
    assert w.busy == 0


async def test_a_waiter_on_another_thread_and_loop_gets_the_slot_freed_here():
    slots: Slots[Worker] = Slots(per_worker=1, max_waiting=10)
    w = Worker("w")
    slots.add(w)
    await slots.acquire()
    got: list[Worker] = []
    queued = threading.Event()

    async def elsewhere() -> None:
        task = asyncio.ensure_future(slots.acquire())
        while slots.counts()[1] == 0:
            await asyncio.sleep(0.001)
        queued.set()
        got.append(await task)

    thread = threading.Thread(target=asyncio.run, args=(elsewhere(),))
    thread.start()
    await asyncio.get_running_loop().run_in_executor(None, queued.wait)
    slots.release(w)
    await asyncio.get_running_loop().run_in_executor(None, thread.join)
    assert got == [w] and w.busy == 1


async def test_nothing_waits_while_no_worker_is_up_or_starting():
    slots: Slots[Worker] = Slots(per_worker=1, max_waiting=10)
    with pytest.raises(Unavailable, match="no Ray sandbox worker is up and none is starting"):
        await slots.acquire()
    slots.starting(+1)  # one on its way: callers wait for it
    waiter = asyncio.create_task(slots.acquire())
    await _settle()
    assert not waiter.done()
    slots.starting(-1)  # it failed to start: the waiter fails instead of waiting forever
    with pytest.raises(Unavailable, match="none is starting"):
        await waiter


async def test_a_lost_worker_with_a_replacement_keeps_callers_waiting_for_it():
    slots: Slots[Worker] = Slots(per_worker=1, max_waiting=10)
    old, new = Worker("old"), Worker("new")
    slots.add(old)
    await slots.acquire()
    waiter = asyncio.create_task(slots.acquire())
    await _settle()
    assert slots.remove(old, replaced=True) and not slots.remove(old, replaced=True)  # idempotent
    await _settle()
    assert not waiter.done()  # the replacement counts as starting from the removal on
    slots.add(new)
    slots.starting(-1)
    assert await waiter is new


async def test_closing_fails_the_waiters_and_refuses_later_callers():
    slots: Slots[Worker] = Slots(per_worker=1, max_waiting=10)
    w = Worker("w")
    slots.add(w)
    await slots.acquire()
    waiter = asyncio.create_task(slots.acquire())
    await _settle()
    assert slots.close("the pool was closed") == [w]
    with pytest.raises(Unavailable, match="the pool was closed"):
        await waiter
    with pytest.raises(Unavailable, match="the pool was closed"):
        await slots.acquire()
