"""Whether an SGLang server (or router) answers, per base URL: one log line when it stops answering and one when
it answers again; requests that time out (a busy server) said apart, once per stretch with a count; and a count
of failed attempts in a row for callers that act on it.

In training, slime's fault tolerance restarts engines behind the router while every request keeps retrying
(``max_retries``, 60 by default, with backoff): a line per failed attempt would be thousands of lines, and
none at all is minutes of silence. So the first attempt that fails (a refused or dropped connection, or a 5xx
answer) after an answer logs a warning, the next answer logs how long the server was away, and nothing in
between. ``slime-strands eval`` reads :attr:`Reachability.failures_in_a_row` to check the server's health and
stop within seconds when it is gone (``slime_strands.cli.eval.server_watch``).

A request that outlasts the client's timeout reached a server that accepted it: a busy one (a queue longer
than the timeout), or one whose scheduler hangs, never one that refuses connections. Logging each such timeout
as "stopped answering" and the next answer as "answers again" wrote 68 lines for 34 timeouts (3,967 in a
worse-sized run) and drowned the one line that matters when a server really dies. So timeouts are counted in a
*stretch*: its first timeout logs one WARNING saying what happens (the server answers other generations
meanwhile, or none) and what to change (the timeout, or the concurrency); the stretch ends once no request
timed out for as long as a retry of the last one could take to time out (its abort, a backoff, a timeout),
and the first answer after that logs the count at INFO. A timeout when no generation was answered within the
timeout counts as a failed attempt too, so that eval's watch asks ``/health``; an answered ``/abort_request``
of a given-up request is no sign of life (a hung scheduler answers those).

The state is per base URL and per process, shared by every client that talks to it (a training and an eval
configuration with the same router log once).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

__all__ = ["Reachability", "reachability_of"]

logger = logging.getLogger("slime_strands.provider.client")

_LOCK = threading.Lock()
_BY_URL: dict[str, Reachability] = {}


@dataclass
class _TimeoutStretch:
    """Requests timing out: since when, the latest, how many, at what timeout; generations answered meanwhile."""

    started: float
    last: float
    count: int
    timeout_s: float
    quiet_s: float
    """How long after its last timeout the stretch may still go on (a retry of it timing out in turn)."""
    answered: int = 0


class Reachability:
    """The answering state of one base URL; safe to update from any thread and event loop."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._lock = threading.Lock()
        self._failures = 0
        self._since: float | None = None
        self._last_generated: float | None = None
        """When the server last answered a ``/generate`` (monotonic): a timeout within that long is a busy
        server's."""
        self._slow: _TimeoutStretch | None = None

    @property
    def failures_in_a_row(self) -> int:
        """Attempts that failed since the last answer (a timeout counts only when no generation was answered
        within the timeout: a server that answers others is busy, not failing)."""
        return self._failures

    @property
    def failing(self) -> bool:
        return self._failures > 0

    def failed(self, why: str) -> None:
        """An attempt got no usable answer (``why``: the error or the status); logged when it is the first."""
        with self._lock:
            self._failures += 1
            first = self._since is None
            if first:
                self._since = time.monotonic()
        if first:
            logger.warning(
                "SGLang at %s stopped answering (%s); its requests keep retrying with backoff (max_retries), "
                "and a line will say when it is back",
                self.base_url,
                why,
            )

    def timed_out(self, what: str, timeout_s: float | None, retried_within_s: float | None = None) -> None:
        """An attempt (``what``: method and path) got no answer within the client's ``timeout_s``: counted in a
        stretch of timeouts, said once when it starts. A retry of it may time out in turn up to
        ``retried_within_s`` later (the timeout and the longest backoff): the stretch lasts that long after it.
        When no generation was answered within the timeout either, it is a failure too (eval's watch then asks
        ``/health``)."""
        if timeout_s is None:  # no request timeout: a transport's own, not a wait given up
            self.failed(f"{what}: timed out")
            return
        now = time.monotonic()
        last = self._last_generated
        busy = last is not None and now - last <= timeout_s
        quiet_s = max(timeout_s, retried_within_s or 0.0)
        with self._lock:
            self._failures += not busy
            ended, stretch = self._end_stretch(now), self._slow
            if stretch is None:
                self._slow = _TimeoutStretch(now, now, 1, timeout_s, quiet_s)
            else:
                stretch.count, stretch.last = stretch.count + 1, now
                stretch.timeout_s = max(stretch.timeout_s, timeout_s)
                stretch.quiet_s = max(stretch.quiet_s, quiet_s)
        if ended is not None:
            self._log_stretch(ended)
        if stretch is None:
            state = (
                "while it answers others (%s): it is busy, not down"
                if busy
                else "and it answered no generation in that time (%s): it is overloaded, or hung"
            )
            logger.warning(
                f"requests to SGLang at %s time out at %g s {state}; they are retried. Raise the request timeout "
                "(request_timeout_s, null: no limit) or lower the concurrency (slime's --sglang-server-concurrency, "
                "eval's --concurrency); a line will count them once they stop",
                self.base_url,
                timeout_s,
                what,
            )

    def answered(self, *, generated: bool = False) -> None:
        """An attempt got an answer (any status below 500; ``generated``: a ``/generate`` one); logged when the
        server was failing, or when a stretch of timeouts is over."""
        now = time.monotonic()
        if generated:
            self._last_generated = now
        if self._failures == 0 and self._slow is None:  # the common case, without the lock
            return
        with self._lock:
            since, failures = self._since, self._failures
            self._since, self._failures = None, 0
            ended = self._end_stretch(now)
            if generated and self._slow is not None:
                self._slow.answered += 1
        if since is not None:
            logger.warning(
                "SGLang at %s answers again after %.1f s (%d failed attempt(s) in between)",
                self.base_url,
                now - since,
                failures,
            )
        if ended is not None:
            self._log_stretch(ended)

    def _end_stretch(self, now: float) -> _TimeoutStretch | None:
        """The stretch of timeouts, taken off once no request timed out for its quiet time (under the lock)."""
        stretch = self._slow
        if stretch is None or now - stretch.last <= stretch.quiet_s:
            return None
        self._slow = None
        return stretch

    def _log_stretch(self, stretch: _TimeoutStretch) -> None:
        logger.info(
            "SGLang at %s: %d request(s) timed out at %g s in %.1f s, while it answered %d other generation(s); "
            "none since",
            self.base_url,
            stretch.count,
            stretch.timeout_s,
            stretch.last - stretch.started,
            stretch.answered,
        )


def reachability_of(base_url: str) -> Reachability:
    """The process's one :class:`Reachability` of ``base_url``."""
    with _LOCK:
        state = _BY_URL.get(base_url)
        if state is None:
            state = _BY_URL[base_url] = Reachability(base_url)
        return state
