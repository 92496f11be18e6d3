"""Waiting for a smoke that is still running: CI starts ``scripts/slime_cpu_smoke.sh`` in the background and runs
the rest of the suite meanwhile, so the tier's tests (ordered last, see tests/conftest.py) may start before it ends.

``SLIME_STRANDS_SLIME_TRAIN_STATUS=FILE`` names the file the smoke's runner writes once the WHOLE smoke has ended
(every configuration it runs): one line, the script's exit status, written at once (a rename), so a half-written
file is never read. ``SLIME_STRANDS_SLIME_TRAIN_LOG=FILE`` names the smoke's log, whose end a failure quotes, and
``SLIME_STRANDS_SLIME_TRAIN_WAIT_S`` how long to wait (default 45 minutes). Without the status variable nothing is
waited for: the output folder is read as it is.

The wait is keyed on the status file, never on ``smoke.json``: a smoke of several configurations writes one per
configuration, and the first of them says nothing about the others.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "LOG_ENV",
    "STATUS_ENV",
    "WAIT_ENV",
    "WAIT_FIXTURE",
    "WAIT_TIMEOUT_S",
    "SmokeNotFinished",
    "SmokeWait",
    "log_tail",
    "wait_for_smoke",
    "wait_from_environment",
]

STATUS_ENV = "SLIME_STRANDS_SLIME_TRAIN_STATUS"
LOG_ENV = "SLIME_STRANDS_SLIME_TRAIN_LOG"
WAIT_ENV = "SLIME_STRANDS_SLIME_TRAIN_WAIT_S"
WAIT_FIXTURE = (
    "smoke_finished"  # the session fixture (conftest.py) that waits; tests/conftest.py orders by it
)
# Generous: on 2 shared cores several configurations, beside the rest of the suite, take 10 to 20 minutes.
WAIT_TIMEOUT_S = 45 * 60
_POLL_S = 2.0
_TAIL_LINES = 80


class SmokeNotFinished(Exception):
    """The smoke failed, or did not end in time, or its status file is not one: the message says which, with
    the end of its log."""


@dataclass(frozen=True)
class SmokeWait:
    """What to wait for, as the environment names it."""

    status: Path
    log: Path | None
    timeout_s: float


def log_tail(log: Path | None, lines: int = _TAIL_LINES) -> str:
    """The last ``lines`` lines of the smoke's log, or a line saying why there are none."""
    if log is None:
        return f"(no log: set {LOG_ENV} to quote it)"
    try:
        text = log.read_text(errors="replace")
    except OSError as error:
        return f"(its log {log} cannot be read: {error.strerror})"
    return f"the end of {log}:\n" + "\n".join(text.splitlines()[-lines:])


def _read_status(status: Path) -> int | None:
    """The exit status the file holds, None while it does not exist yet (or is still empty)."""
    try:
        text = status.read_text().strip()
    except FileNotFoundError:
        return None
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise SmokeNotFinished(
            f"{STATUS_ENV}={status} holds {text[:80]!r}, not an exit status: the smoke's runner writes one integer"
        ) from None


def wait_for_smoke(wait: SmokeWait) -> None:
    """Returns once the status file says the smoke ended with status 0; raises SmokeNotFinished when it says
    another status or when the timeout passes first. Polls the file: the smoke runs in another process tree."""
    status, log, timeout_s = wait.status, wait.log, wait.timeout_s
    deadline = time.monotonic() + timeout_s
    while (code := _read_status(status)) is None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SmokeNotFinished(
                f"the slime-train smoke did not end within {timeout_s:.0f} s (no status in {status}); "
                + log_tail(log)
            )
        time.sleep(min(_POLL_S, left))
    if code != 0:
        raise SmokeNotFinished(f"the slime-train smoke failed (exit status {code}); " + log_tail(log))


def wait_from_environment() -> SmokeWait | None:
    """The wait the environment asks for, None without ``SLIME_STRANDS_SLIME_TRAIN_STATUS``."""
    status = os.environ.get(STATUS_ENV)
    if not status:
        return None
    log = os.environ.get(LOG_ENV)
    raw = os.environ.get(WAIT_ENV, "")
    try:
        timeout_s = float(raw) if raw else float(WAIT_TIMEOUT_S)
    except ValueError:
        timeout_s = -1.0
    if not timeout_s > 0:
        raise SmokeNotFinished(
            f"{WAIT_ENV}={raw!r} is not a number of seconds above 0: set e.g. {WAIT_ENV}=2700"
        )
    return SmokeWait(Path(status), Path(log) if log else None, timeout_s)
