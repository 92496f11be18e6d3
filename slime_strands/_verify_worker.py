"""math-verify in long-lived worker processes with a wall-clock limit per question.

math-verify's own timeouts use ``signal.alarm``, which raises off the main thread (slime grades on its
rollout thread), and inputs such as ``9^{9^{9^{9}}}`` hang in C code no signal interrupts. So each
question goes to a worker process (warm: math-verify imported once) under an address-space limit; a
worker that overruns the deadline is killed and replaced. Run as ``python -m slime_strands._verify_worker``
it is the worker: JSON lines in, JSON lines out.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import sys
from collections.abc import AsyncGenerator
from typing import Any

from ._aio import within

logger = logging.getLogger(__name__)

_WORKER_MEMORY_BYTES = 4 << 30
_STARTUP_TIMEOUT_S = 120.0


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls) -> _Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            __name__,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        worker = cls(proc)
        try:
            ready = await within(worker._read(), _STARTUP_TIMEOUT_S)
        except BaseException:
            worker.kill()
            raise
        if not ready.get("ready"):
            worker.kill()
            raise RuntimeError(f"math-verify worker failed to start: {ready.get('error')}")
        return worker

    async def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line:
            raise EOFError("math-verify worker exited")
        return json.loads(line)

    async def ask(self, pred: str, gold: str, timeout_s: float) -> bool:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"pred": pred, "gold": gold}).encode() + b"\n")
        await self.proc.stdin.drain()
        answer = await within(self._read(), timeout_s)
        return bool(answer.get("ok"))

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()


class _Pool:
    """At most ``size`` workers per event loop, started on demand, replaced when they die or overrun."""

    def __init__(self, size: int) -> None:
        self._idle: list[_Worker] = []
        self._slots = asyncio.Semaphore(size)
        self.until_loop_ends: AsyncGenerator[None, None] | None = None
        """What closes the pool when its loop shuts down (held here: the loop keeps it only weakly)."""

    async def verify(self, pred: str, gold: str, timeout_s: float) -> bool:
        async with self._slots:
            worker = self._idle.pop() if self._idle else await _Worker.start()
            try:
                result = await worker.ask(pred, gold, timeout_s)
            except BaseException:
                worker.kill()
                with contextlib.suppress(Exception):
                    await within(worker.proc.wait(), 5)
                raise
            self._idle.append(worker)
            return result

    async def close(self) -> None:
        """Stop the idle workers (a closed pool's loop is ending: none is in use)."""
        workers, self._idle = self._idle, []
        for worker in workers:
            worker.kill()
            with contextlib.suppress(Exception):
                await within(worker.proc.wait(), 5)


class _Verifier:
    """The process's math-verify state, in one object: a worker pool per event loop (asyncio pipes belong to
    the loop that made them; a loop's shutdown closes its pool) and whether the missing
    package was reported."""

    def __init__(self) -> None:
        self._pools: dict[asyncio.AbstractEventLoop, _Pool] = {}
        self._warned_missing = False

    def available(self) -> bool:
        if importlib.util.find_spec("math_verify") is not None:
            return True
        if not self._warned_missing:
            self._warned_missing = True
            logger.warning(
                "slime-strands reward: math-verify is not installed, non-integer answers are compared as "
                "normalised strings; install slime-strands[math] for robust grading"
            )
        return False

    async def pool(self) -> _Pool:
        """This event loop's pool (created on first use, and closed when the loop shuts down)."""
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            pool = self._pools[loop] = _Pool(size=max(1, min(4, (os.cpu_count() or 2) // 2)))
            guard = pool.until_loop_ends = self._until_loop_ends(loop, pool)
            await anext(guard)
        return pool

    async def _until_loop_ends(
        self, loop: asyncio.AbstractEventLoop, pool: _Pool
    ) -> AsyncGenerator[None, None]:
        """Suspended while the loop runs; the loop's shutdown (the end of ``asyncio.run``, of any
        ``asyncio.Runner``) closes it, and so stops the pool's workers and forgets the loop. A pool's workers
        hold its loop (their pipes' transports do), so no collection of the loop could stop them instead."""
        try:
            yield
        finally:
            self._pools.pop(loop, None)
            await pool.close()


_VERIFIER = _Verifier()


async def verify_in_worker(pred: str, gold: str, *, timeout_s: float) -> bool:
    """Whether ``pred`` equals ``gold`` per math-verify; False on timeout, crash or missing answer."""
    if not pred.strip():
        return False
    if not _VERIFIER.available():
        return "".join(pred.split()) == "".join(gold.split())
    try:
        return await (await _VERIFIER.pool()).verify(pred, gold, timeout_s)
    except asyncio.TimeoutError:
        logger.warning(
            "slime-strands reward: math-verify overran %.1fs on %.80r; graded wrong", timeout_s, pred
        )
    except (EOFError, RuntimeError, OSError, ValueError) as exc:
        logger.warning("slime-strands reward: math-verify worker failed (%s); graded wrong", exc)
    return False


def _wrap(answer: str) -> str:
    return answer if "\\boxed" in answer or "$" in answer else f"\\boxed{{{answer}}}"


def _serve() -> None:
    """Worker loop: answers go to the original stdout; anything math-verify prints goes to stderr."""
    import resource

    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (_WORKER_MEMORY_BYTES, _WORKER_MEMORY_BYTES))
        from math_verify import parse, verify
    except Exception as exc:
        out.write(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"}) + "\n")
        return
    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        try:
            request = json.loads(line)
            gold, pred = parse(_wrap(request["gold"])), parse(_wrap(request["pred"]))
            ok = bool(gold) and bool(pred) and bool(verify(gold, pred))
        except BaseException:  # MemoryError, RecursionError, math-verify's own TimeoutException
            ok = False
        out.write(json.dumps({"ok": ok}) + "\n")


if __name__ == "__main__":
    _serve()
