"""The local runner: start the warm interpreter under the best isolation backend, send it runs, get results.

One :class:`Sandbox` per (event loop, settings): asyncio pipes belong to the loop that made them. Runs are
bounded by a semaphore (``concurrency``); the host never blocks its loop, and a dead or hung interpreter is
killed and replaced transparently (its in-flight runs get an error result, later runs work). A sandbox that
is replaced (new settings) or evicted closes once its last run is done; one whose loop shuts down
(``asyncio.run`` returning) closes with it. What the process learns about its machine (which backend worked,
uids to reap, warnings given) lives in :data:`~slime_strands.sandbox._host.HOST`.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import functools
import itertools
import json
import logging
import os
import random
import shutil
import sys
from collections.abc import AsyncGenerator, Callable
from typing import Any

from .._aio import within
from ..errors import ConfigurationError, SlimeStrandsError
from ..settings import SandboxSettings
from ._backends import BACKENDS, CHOICES, SYSTEM_DIRS, IsolationBackend, python_paths, sandbox_env
from ._host import HOST
from ._result import ExecutionResult, Figure
from ._runner import CodeRunner

__all__ = ["Sandbox", "SandboxIsolationError", "SandboxUnavailableError"]

logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 120.0  # importing numpy + sympy on a loaded node
_HOST_GRACE_S = 10.0  # beyond the run's own timeout before the interpreter counts as hung
_BYTES_PER_CHAR = 4
_INTERPRETER_PROCESSES = (
    4  # what a shared uid counts besides the runs: bwrap's init, the interpreter, its helpers
)
_PROBE = "print(6 * 7)"


def _mapped_ids(path: str) -> list[tuple[int, int]]:
    """(first, count) of the ids mapped into our user namespace (the whole range on a plain host)."""
    try:
        with open(path) as lines:
            return [(int(f[0]), int(f[2])) for f in (line.split() for line in lines) if len(f) == 3]
    except (OSError, ValueError):
        return [(0, 1 << 32)]


async def _spawn(
    backend: IsolationBackend, root: bool, settings: SandboxSettings
) -> asyncio.subprocess.Process:
    """The warm interpreter's process under ``backend`` (its command line may take a ``bwrap --help``)."""
    build = functools.partial(backend.command, root=root, tmp_mb=settings.tmp_size_mb)
    argv = await asyncio.get_running_loop().run_in_executor(None, build)
    if argv is None:
        raise SandboxUnavailableError(f"{backend.name}: not installed")
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=sandbox_env(),
            start_new_session=True,
            limit=1 << 26,
        )
    except OSError as exc:
        raise SandboxUnavailableError(f"{backend.name}: cannot start: {exc}") from exc


def _run_uids(count: int) -> list[int]:
    """``count`` consecutive unused uids (= gids) for runs: random, far above any real user's, within what
    our user namespace maps (a rootless container maps only a few thousand ids). None if too few are
    mapped: runs then share the interpreter's uid."""
    uid_ranges, gid_ranges = _mapped_ids("/proc/self/uid_map"), _mapped_ids("/proc/self/gid_map")
    spans = []
    for u_first, u_count in uid_ranges:
        for g_first, g_count in gid_ranges:
            low = max(u_first, g_first, 10_000)  # below: system and human users
            high = min(u_first + u_count, g_first + g_count, 2_000_000_000)  # exclusive
            if high - low >= count:
                spans.append((low, high))
    if not spans:
        HOST.warn_once(
            "slime-strands sandbox: fewer than "
            f"{count} unprivileged uids are mapped into this user namespace: runs share the sandbox "
            "interpreter's uid (they can signal it and each other)"
        )
        return []
    low, high = max(spans, key=lambda span: span[1] - span[0])
    if high - count >= 2_000_000:  # a host: far above any uid in use
        low = max(low, 2_000_000)
    first = random.randrange(low, high - count + 1)
    return list(range(first, first + count))


class SandboxUnavailableError(SlimeStrandsError, RuntimeError):
    """The sandbox interpreter died, hung or could not be restarted: one run fails, later runs retry."""


class SandboxIsolationError(ConfigurationError):
    """The settings require isolation (``auto``, ``bwrap``, ``unshare``) and no isolating backend works on
    this machine: no sample can run its code safely. The message says what failed and how to fix it."""


_FIX_ISOLATION = (
    "Model-written code never runs unisolated unless the settings say so. Fix: install bubblewrap "
    "(apt-get install -y bubblewrap); or allow unprivileged user namespaces (sysctl "
    "kernel.unprivileged_userns_clone=1 and kernel.apparmor_restrict_unprivileged_userns=0; in a container: "
    "a seccomp / AppArmor profile that permits unshare and mount, e.g. docker run --security-opt "
    "seccomp=unconfined --security-opt apparmor=unconfined); or opt out with `sandbox.backend: limits` "
    "(rlimits and, as root, a separate uid only: the code can then read world-readable host files and use "
    "the host network)."
)


class _StartFailed(Exception):
    """A backend's interpreter did not come up (reported as SandboxUnavailableError)."""


class _Interpreter:
    """One warm zygote process and its request / response pipe."""

    def __init__(
        self, backend: IsolationBackend, proc: asyncio.subprocess.Process, uids: list[int], concurrency: int
    ) -> None:
        self.backend, self.proc, self.uids, self.concurrency = backend, proc, uids, concurrency
        self.host_dir: str | None = None  # the run dirs' parent on the host (removed if we kill it)
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.ids = itertools.count()
        self.stderr: collections.deque[str] = collections.deque(maxlen=20)
        self.reader: asyncio.Task[None] | None = None
        self.drain: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls, backend: IsolationBackend, settings: SandboxSettings, concurrency: int
    ) -> _Interpreter:
        root = os.geteuid() == 0
        uids = _run_uids(concurrency) if root else []
        private_tmp = backend.private_tmp
        interp = cls(backend, await _spawn(backend, root, settings), uids, concurrency)
        interp.drain = asyncio.ensure_future(interp._drain_stderr())
        reap = [] if backend.isolating else sorted(HOST.orphan_uids)
        config = {
            "base_dir": "/tmp/runs" if private_tmp else None,  # None: the interpreter makes (and removes) one
            "uids": uids,
            "preload": list(settings.preload_modules) if settings.prewarm else [],
            "reap_uids": reap,
            "keeper": not backend.isolating,  # no namespace dies with it: a keeper kills what it forked
            "private_tmp": private_tmp,
            "tmp_size_mb": settings.tmp_size_mb,
            "system_dirs": list(SYSTEM_DIRS),
            "python_paths": python_paths(),
        }
        try:
            await interp._handshake(config, settings, reap)
        except BaseException as exc:
            await interp.close()  # first: the interpreter's last words reach last_stderr()
            if isinstance(
                exc, (_StartFailed, SandboxUnavailableError, OSError, ValueError, asyncio.TimeoutError)
            ):
                raise SandboxUnavailableError(
                    f"{backend.name}: {exc} ({interp.last_stderr() or 'no message'})"
                ) from exc
            raise
        return interp

    async def _handshake(self, config: dict[str, Any], settings: SandboxSettings, reap: list[int]) -> None:
        """Send the interpreter its configuration, wait until it is ready, and run the probe program once."""
        proc, backend = self.proc, self.backend
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(config).encode() + b"\n")
        await proc.stdin.drain()
        line = await within(proc.stdout.readline(), _START_TIMEOUT_S)
        ready = json.loads(line) if line else {}
        if not ready.get("ready"):
            raise _StartFailed("the interpreter did not start")
        if not config["private_tmp"]:
            self.host_dir = ready.get("base_dir")
        if ready.get("stdlib_private") and config["uids"]:
            HOST.warn_once(
                f"slime-strands sandbox ({backend.name}): the Python installation ({sys.base_prefix}) is not "
                "readable by the unprivileged run uid, so runs can import only preloaded modules; use the "
                "bwrap or unshare backend, or install Python outside a private directory such as /root"
            )
        HOST.orphan_uids.difference_update(reap)
        self.reader = asyncio.ensure_future(self._read_results())
        probe = await self.request(_PROBE, settings)
        if probe.get("stdout", "").strip() != "42":
            raise _StartFailed(f"the probe run failed: {probe}")

    def last_stderr(self) -> str:
        return " | ".join(self.stderr)[-2000:]

    async def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.stderr.append(line.decode("utf-8", "replace").rstrip()[:500])

    async def _read_results(self) -> None:
        assert self.proc.stdout is not None
        try:
            while line := await self.proc.stdout.readline():
                result = json.loads(line)
                future = self.pending.pop(result.get("id"), None)
                if future is not None and not future.done():
                    future.set_result(result)
        except (ValueError, asyncio.LimitOverrunError) as exc:
            logger.warning("slime-strands sandbox: bad reply from the interpreter: %r", exc)
        finally:
            self._fail_pending(f"the sandbox interpreter exited ({self.last_stderr() or 'no message'})")

    def _fail_pending(self, message: str) -> None:
        for future in self.pending.values():
            if not future.done():
                future.set_exception(SandboxUnavailableError(message))
        self.pending.clear()

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and self.reader is not None and not self.reader.done()

    def process_limit(self, settings: SandboxSettings) -> int:
        """RLIMIT_NPROC of a run. The kernel counts it per uid: with a uid of its own, a run's processes
        and threads alone. Runs that share the interpreter's uid share one count, which holds the
        interpreter's own processes and every concurrent run's, so each of ``concurrency`` runs gets
        ``max_processes`` of it (one run may use what the others leave): a per-run limit there made a
        run's pool fail with "can't start new thread" whenever its neighbours' pools were busy."""
        if self.uids:
            return settings.max_processes
        return settings.max_processes * self.concurrency + _INTERPRETER_PROCESSES

    async def request(self, code: str, settings: SandboxSettings) -> dict[str, Any]:
        assert self.proc.stdin is not None
        rid = next(self.ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[rid] = future
        message = {
            "id": rid,
            "code": code,
            "timeout_s": settings.timeout_s,
            "cpu_seconds": settings.cpu_seconds,
            "memory_mb": settings.memory_mb,
            "file_size_mb": settings.file_size_mb,
            "max_processes": self.process_limit(settings),
            "max_output_bytes": settings.max_output_chars * _BYTES_PER_CHAR,
            "figures": settings.return_figures,
        }
        patience = settings.timeout_s + _HOST_GRACE_S
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            await within(self.proc.stdin.drain(), patience)  # a hung interpreter stops reading
            return await within(future, patience)
        except asyncio.CancelledError:  # the caller gave up (e.g. slime aborted the rollout): stop the run
            with contextlib.suppress(OSError, RuntimeError):
                self.proc.stdin.write(json.dumps({"cancel": rid}).encode() + b"\n")
            raise
        finally:
            self.pending.pop(rid, None)

    async def close(self, hung: bool = False) -> None:
        if not self.backend.isolating and self.uids:
            HOST.orphan_uids.update(self.uids)
        # EOF first: the interpreter kills its runs, removes their files and exits; then signals. A hung
        # one does not read: SIGKILL the launcher at once (the namespace dies with it), except the keeper
        # of one without namespaces, whose SIGTERM makes it kill the server it forked (`unshare` ignores
        # SIGTERM).
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        stops: tuple[Callable[[], None] | None, ...] = (None, self.proc.terminate, self.proc.kill)
        if hung:
            stops = (self.proc.kill,) if self.backend.isolating else (self.proc.terminate, self.proc.kill)
        for stop in stops:
            if stop is not None:
                with contextlib.suppress(ProcessLookupError):
                    stop()
            with contextlib.suppress(asyncio.TimeoutError):
                await within(self.proc.wait(), 2)
                break
        if self.drain is not None:  # the process is gone: its stderr ends promptly
            with contextlib.suppress(BaseException):
                await within(self.drain, 1)
        for task in (self.reader, self.drain):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        self._fail_pending("the sandbox was closed")
        if self.host_dir:  # the runs' files (up to file_size_mb each): not on the event loop
            remove = functools.partial(shutil.rmtree, self.host_dir, ignore_errors=True)
            try:
                await asyncio.get_running_loop().run_in_executor(None, remove)
            except RuntimeError:  # the loop's executor is already shut down (loop closing): here, then
                remove()


class Sandbox(CodeRunner):
    """Runs model-written Python under isolation and limits; see ``SandboxSettings`` for the knobs."""

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings()
        if self.settings.backend not in CHOICES:
            raise ConfigurationError(
                f"Sandbox runs the warm interpreter under {', '.join(CHOICES)}, not backend "
                f"{self.settings.backend!r}: run_python(code, settings) runs every backend"
            )
        self.concurrency = self.settings.effective_concurrency
        self._slots = asyncio.Semaphore(self.concurrency)
        self._interp: _Interpreter | None = None
        self._starting = asyncio.Lock()
        self._active = 0
        self._retired = False
        self._guard: AsyncGenerator[None, None] | None = None
        self._refused: str | None = None  # why it cannot isolate here: every later run raises it at once

    @property
    def backend(self) -> str | None:
        """The backend in use (None before the first run)."""
        return self._interp.backend.name if self._interp else HOST.working_backends.get(self.settings.backend)

    async def _interpreter(self) -> _Interpreter:
        async with self._starting:
            if self._interp is not None and self._interp.alive:
                return self._interp
            if self._interp is not None:
                await self._interp.close()
                self._interp = None
            self._interp = await self._start()
            if self._guard is None:
                self._guard = self._close_at_loop_shutdown()
                await self._guard.__anext__()
            return self._interp

    async def _close_at_loop_shutdown(self) -> AsyncGenerator[None, None]:
        """An async generator the loop tracks: ``shutdown_asyncgens`` (run by ``asyncio.run`` and
        ``asyncio.Runner`` before closing the loop) finalizes it, which stops the interpreter cleanly
        instead of leaving it to a garbage-collected transport's SIGKILL."""
        try:
            yield
        finally:
            self._guard = None
            await self.aclose()

    async def _start(self) -> _Interpreter:
        """An interpreter under the wanted backend (``auto``: the first isolating one that works, the one
        that worked before first). Never falls back to running without isolation."""
        if self._refused is not None:
            raise SandboxIsolationError(self._refused)
        wanted = self.settings.backend
        worked = HOST.working_backends
        candidates = CHOICES[wanted]
        if worked.get(wanted) in BACKENDS:
            candidates = (BACKENDS[worked[wanted]], *candidates)
        errors = []
        for backend in dict.fromkeys(candidates):
            try:
                interp = await _Interpreter.start(backend, self.settings, self.concurrency)
            except SandboxUnavailableError as exc:
                errors.append(str(exc))
                continue
            if not backend.isolating:  # every start, not once: a log line is easy to miss in a Ray job
                logger.warning(
                    f"slime-strands sandbox: backend {backend.name!r} (set in the settings): model-written "
                    "code runs WITHOUT namespace isolation: rlimits, a scrubbed environment and (as root) a "
                    "separate uid only; it can read world-readable host files and use the host network. Use "
                    "`sandbox.backend: auto` (bubblewrap or unshare) to isolate it."
                )
            worked[wanted] = backend.name
            return interp
        if not any(c.isolating for c in candidates) or any(c.name in worked.values() for c in candidates):
            # It isolated in this process before: the machine allows it, this start failed (e.g. load).
            raise SandboxUnavailableError("the sandbox interpreter could not start: " + "; ".join(errors))
        what = (
            "no isolating sandbox backend works here"
            if len(candidates) > 1
            else f"{wanted} cannot isolate here"
        )
        self._refused = f"sandbox.backend: {wanted}: {what} ({'; '.join(errors)}). {_FIX_ISOLATION}"
        raise SandboxIsolationError(self._refused)

    async def start(self) -> str:
        """Start the interpreter now (runs start it on demand) and return the backend it runs under.

        Raises :class:`SandboxIsolationError` when the settings require isolation and no isolating
        backend works here (then every later run raises it too, at once)."""
        return (await self._interpreter()).backend.name

    async def run(self, code: str) -> ExecutionResult:
        """Execute ``code``; never raises for anything the code does (the result says what happened), nor
        for a dead or hung interpreter (an error result; the next run restarts it). Raises
        :class:`SandboxIsolationError` when the settings require isolation and none works here."""
        settings = self.settings
        self._active += 1
        try:
            async with self._slots:
                interp = None
                try:
                    interp = await self._interpreter()
                    reply = await interp.request(code, settings)
                except asyncio.TimeoutError:
                    await self._discard(interp, hung=True)
                    return self._error("the sandbox stopped answering; it was restarted")
                except (SandboxUnavailableError, OSError) as exc:  # OSError: broken pipe to a dead one
                    await self._discard(interp)
                    return self._error(str(exc))
        finally:
            self._active -= 1
            if self._retired and not self._active:
                self._close_soon()
        return ExecutionResult(
            stdout=reply.get("stdout", ""),
            stderr=reply.get("stderr", ""),
            exit_code=reply.get("exit_code"),
            signal=reply.get("signal"),
            timed_out=bool(reply.get("timed_out")),
            output_truncated=bool(reply.get("truncated")),
            duration_s=float(reply.get("duration_s", 0.0)),
            backend=interp.backend.name,
            timeout_s=settings.timeout_s,
            memory_mb=settings.memory_mb,
            error=reply.get("error"),
            figures=_figures(reply.get("figures")),
        )

    def _error(self, message: str) -> ExecutionResult:
        return ExecutionResult("", "", None, backend=self.backend or "", error=message)

    async def _discard(self, interp: _Interpreter | None, hung: bool = False) -> None:
        """Drop a dead or hung interpreter (not a newer one another run already started)."""
        async with self._starting:
            if interp is not None and self._interp is interp:
                self._interp = None
        if interp is not None:
            await interp.close(hung)

    def retire(self) -> None:
        """Close once the runs in flight are done (call on the sandbox's loop); a later run restarts it."""
        self._retired = True
        if not self._active:
            self._close_soon()

    def _close_soon(self) -> None:
        HOST.keep_until_done(asyncio.ensure_future(self.aclose()))

    async def aclose(self) -> None:
        """Stop the interpreter (and with it every run still going)."""
        async with self._starting:
            if self._interp is not None:
                await self._interp.close()
                self._interp = None


def _figures(saved: Any) -> tuple[Figure, ...]:
    """The figures the interpreter read from a run's directory (base64 in its reply)."""
    if not isinstance(saved, list):
        return ()
    return tuple(
        Figure(str(item["name"]), base64.b64decode(item["data"]))
        for item in saved
        if isinstance(item, dict) and isinstance(item.get("data"), str)
    )
