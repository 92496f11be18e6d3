"""The TRUSTED side of a grading run, executed in the sandbox as the run's program (standard library only).

Why two processes: a program that shares a process with its tests can forge their verdict (exit 0 before they
run, replace ``check`` or ``AssertionError``, print a fake result, patch the exit status). Here the model's program
never runs in this process. This side removes its own program file, makes itself non-dumpable (a process of the
same uid can neither read its memory nor open its fds through ``/proc``), then starts a FRESH interpreter
(``_program_host.py``: exec'd, so none of this process's memory is in it) that loads the program and answers calls
of its entry point. The tests (trusted data) run here, the entry point a proxy that sends each call's arguments
and decodes its return value strictly as plain data: nothing the program returns can execute here. The verdict is
one line of this process's stdout, behind a secret nonce the host put only in this process's source: the
program's own output goes to a pipe this side reads (and bounds), never to the run's stdout, so it cannot forge
the line; a program that floods, crashes, hangs or kills this side only loses its own verdict (the host then
scores 0).

The host prefixes this source with ``_JOB = {...}``: nonce, program, entry point, setup, tests, timeout,
failure_lines and the host interpreter file (``_program_host.py``'s source).
"""

import base64
import builtins
import contextlib
import ctypes
import json
import linecache
import math
import os
import select
import signal
import subprocess
import sys
import time
import traceback

_MAX_FRAME = 8 << 20  # a reply longer than this is refused (the program's memory, not ours)
_KEEP_OUTPUT = 2000


class _Broken(BaseException):
    """The program stopped answering (exited, crashed, hung past the deadline, sent garbage)."""


class _ProgramError(Exception):
    """The entry point raised an exception that is not a builtin one (its name and message are kept)."""


def _encode(value, depth=0):
    if depth > 100:
        raise ValueError("nested too deeply")
    kind = type(value)
    if value is None:
        return ["n"]
    if kind is bool:
        return ["b", value]
    if kind is int:
        return ["i", str(value)]
    if kind is float:
        return ["f", repr(value) if not math.isfinite(value) else value]
    if kind is str:
        return ["s", value]
    if kind in (bytes, bytearray):
        return ["y", base64.b64encode(value).decode()]
    if kind is complex:
        return ["c", [_encode(value.real), _encode(value.imag)]]
    tags = {list: "l", tuple: "t", set: "S", frozenset: "F"}
    if kind in tags:
        return [tags[kind], [_encode(item, depth + 1) for item in value]]
    if kind is dict:
        return ["d", [[_encode(k, depth + 1), _encode(v, depth + 1)] for k, v in value.items()]]
    raise TypeError(f"a test passed a {kind.__name__}: only plain data crosses to the program")


def _decode(item, depth=0):
    """A value the (hostile) program sent: plain data only, every shape checked."""
    if depth > 100 or not isinstance(item, list) or not item or not isinstance(item[0], str):
        raise ValueError("malformed value")
    tag, rest = item[0], item[1:]
    if tag == "n" and not rest:
        return None
    if len(rest) != 1:
        raise ValueError("malformed value")
    payload = rest[0]
    if tag == "b" and isinstance(payload, bool):
        return payload
    if tag == "s" and isinstance(payload, str):
        return payload
    if tag == "i" and isinstance(payload, str) and len(payload) <= 4300:
        return int(payload)
    if tag == "f" and isinstance(payload, (float, int, str)) and not isinstance(payload, bool):
        if isinstance(payload, str) and payload not in ("nan", "inf", "-inf"):
            raise ValueError("malformed float")
        return float(payload)
    if tag == "y" and isinstance(payload, str):
        return base64.b64decode(payload, validate=True)
    if tag == "c" and isinstance(payload, list) and len(payload) == 2:
        parts = [_decode(p, depth + 1) for p in payload]
        if not all(type(p) in (int, float) for p in parts):
            raise ValueError("malformed complex")
        return complex(parts[0], parts[1])
    if not isinstance(payload, list):
        raise ValueError("malformed value")
    if tag == "d":
        result = {}
        for pair in payload:
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError("malformed dict")
            result[_decode(pair[0], depth + 1)] = _decode(pair[1], depth + 1)
        return result
    kinds = {"l": list, "t": tuple, "S": set, "F": frozenset}
    if tag in kinds:
        return kinds[tag](_decode(x, depth + 1) for x in payload)
    raise ValueError("malformed value")


class _Program:
    """The program's interpreter, and calls of its entry point."""

    def __init__(self, job, deadline):
        self.deadline = deadline
        self.output = bytearray()
        self.total_output = 0
        self.broken = None
        self.calls = 0
        requests_r, self.requests = os.pipe()
        self.replies, replies_w = os.pipe()
        self.out, out_w = os.pipe()
        self.buffer = b""
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", job["host"], str(requests_r), str(replies_w)],
            stdin=subprocess.DEVNULL,
            stdout=out_w,
            stderr=out_w,
            pass_fds=(requests_r, replies_w),
            close_fds=True,
            env={},
        )
        for fd in (requests_r, replies_w, out_w):
            os.close(fd)
        os.set_blocking(self.replies, False)
        os.set_blocking(self.out, False)
        self._send({"program": job["program"], "entry_point": job["entry_point"]})

    def _send(self, message):
        data = json.dumps(message).encode()
        frame = len(data).to_bytes(4, "big") + data
        try:
            while frame:
                _, ready, _ = select.select(
                    [], [self.requests], [], max(0.0, self.deadline - time.monotonic())
                )
                if not ready:
                    self._break("timeout", "the program did not read its input before the time limit")
                frame = frame[os.write(self.requests, frame) :]
        except OSError:
            self._break("crashed", "the program's interpreter exited")

    def _break(self, status, detail):
        if self.broken is None:
            self.broken = (status, detail)
        with contextlib.suppress(OSError):
            self.proc.kill()
        raise _Broken(detail)

    def _drain_output(self):
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(self.out, 1 << 16):
                self.total_output += len(chunk)
                room = _KEEP_OUTPUT - len(self.output)
                if room > 0:
                    self.output += chunk[:room]

    def receive(self):
        """The program's next reply (a list), or _Broken."""
        if self.broken is not None:
            raise _Broken(self.broken[1])
        while True:
            if len(self.buffer) >= 4:
                size = int.from_bytes(self.buffer[:4], "big")
                if size > _MAX_FRAME:
                    self._break("crashed", f"the program sent a reply of {size} bytes")
                if len(self.buffer) >= 4 + size:
                    frame, self.buffer = self.buffer[4 : 4 + size], self.buffer[4 + size :]
                    try:
                        message = json.loads(frame)
                    except (ValueError, RecursionError):
                        self._break("crashed", "the program sent a malformed reply")
                    if not isinstance(message, list) or not message:
                        self._break("crashed", "the program sent a malformed reply")
                    return message
            left = self.deadline - time.monotonic()
            if left <= 0:
                self._break("timeout", "time limit reached")
            ready, _, _ = select.select([self.replies, self.out], [], [], left)
            if self.out in ready:
                self._drain_output()
            if self.replies in ready:
                try:
                    chunk = os.read(self.replies, 1 << 20)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    self._break("crashed", self._exit_text())
                self.buffer += chunk

    def _exit_text(self):
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=max(0.1, min(2.0, self.deadline - time.monotonic())))
        self._drain_output()
        code = self.proc.returncode
        if code is None:
            return "the program closed its reply channel"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"the program's process was killed by {signal.Signals(-code).name}"
            return f"the program's process was killed by signal {-code}"
        return f"the program's process exited with status {code}"

    def __call__(self, *args, **kwargs):
        if self.broken is not None:
            raise _Broken(self.broken[1])
        self.calls += 1
        self._send([[_encode(a) for a in args], {str(k): _encode(v) for k, v in kwargs.items()}])
        reply = self.receive()
        try:
            if reply[0] == "ok" and len(reply) == 2:
                return _decode(reply[1])
            if reply[0] == "raise" and len(reply) == 4 and all(isinstance(x, str) for x in reply[1:]):
                name, message = reply[1], reply[2]
                kind = getattr(builtins, name, None)
                if isinstance(kind, type) and issubclass(kind, Exception):
                    raise kind(message)
                raise _ProgramError(f"{name}: {message}")
        except (ValueError, TypeError, RecursionError, OverflowError) as exc:
            if reply[0] != "raise":
                self._break("crashed", f"the program sent an unreadable value ({exc})")
            raise
        self._break("crashed", "the program sent a malformed reply")

    def output_text(self):
        self._drain_output()
        text = bytes(self.output).decode("utf-8", "replace")
        if self.total_output > len(self.output):
            text += f"\n... [{self.total_output - len(self.output)} more bytes]"
        return text

    def close(self):
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=2)
        for fd in (self.requests, self.replies, self.out):
            with contextlib.suppress(OSError):
                os.close(fd)


def _first_lines(text, count):
    lines = text.strip("\n").splitlines()
    kept = [line[:300] for line in lines[:count]]
    if len(lines) > count:
        kept.append(f"... [{len(lines) - count} more lines]")
    return "\n".join(kept)


def _test_failure(exc, index, count):
    """The failing test's traceback, its own frames only (the harness's are noise), first lines."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<test")]
    lines = traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc)
    return _first_lines(f"test {index}:\n" + "".join(lines), count)


def _run(job):
    deadline = time.monotonic() + float(job["timeout_s"])
    count = int(job["failure_lines"])
    tests = job["tests"]
    verdict = {"status": "passed", "passed": 0, "total": len(tests), "failures": [], "detail": ""}
    program = _Program(job, deadline)
    try:
        try:
            ready = program.receive()
        except _Broken as exc:
            verdict.update(status=program.broken[0], detail=f"before the tests ran: {exc}")
            return verdict
        if ready[0] == "load_error":
            trace = ready[2] if len(ready) == 3 and isinstance(ready[2], str) else ""
            verdict.update(status="load_error", detail=_first_lines(trace, count))
            return verdict
        if ready[0] == "no_entry":
            verdict.update(
                status="no_entry_point", detail=f"the program defines no function {job['entry_point']!r}"
            )
            return verdict
        if ready != ["ready"]:
            verdict.update(status="crashed", detail="the program sent a malformed reply")
            return verdict
        for index, test in enumerate(tests):
            namespace = {"__name__": "__test__"}
            exec(compile(job["setup"], "<setup>", "exec"), namespace)
            namespace[job["entry_point"]] = namespace["candidate"] = program
            broken_before = program.broken
            name = f"<test {index}>"
            linecache.cache[name] = (
                len(test),
                None,
                test.splitlines(True),
                name,
            )  # the failing line is shown
            try:
                exec(compile(test, name, "exec"), namespace)
                if program.broken is not None and broken_before is None:
                    raise _Broken(program.broken[1])  # the test swallowed it: it still failed
            except _Broken:
                verdict["failures"].append(f"test {index}: {program.broken[1]}")
                verdict["status"] = program.broken[0]
                for skipped in range(index + 1, len(tests)):
                    verdict["failures"].append(f"test {skipped}: not run ({program.broken[1]})")
                break
            except BaseException as exc:
                verdict["failures"].append(_test_failure(exc, index, count))
                verdict["status"] = "failed"
                continue
            if program.broken is None:
                verdict["passed"] += 1
    finally:
        verdict["program_output"] = _first_lines(program.output_text(), count)
        program.close()
    if verdict["failures"]:
        verdict["detail"] = verdict["failures"][0]
    verdict["failures"] = verdict["failures"][:5]
    return verdict


def _main():
    job = _JOB  # noqa: F821 - the host prefixes it
    with contextlib.suppress(OSError, NameError):
        os.unlink(__file__)
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(
            4, 0, 0, 0, 0
        )  # PR_SET_DUMPABLE 0: no /proc/<pid>/mem, fd, environ for the program
    try:
        verdict = _run(job)
    except BaseException as exc:  # the harness itself failed: a verdict saying so (never a pass)
        verdict = {
            "status": "harness_error",
            "passed": 0,
            "total": len(job["tests"]),
            "failures": [],
            "detail": f"{type(exc).__name__}: {exc}"[:500],
        }
    line = job["nonce"] + json.dumps(verdict)
    os.write(1, ("\n" + line + "\n").encode())


_main()
