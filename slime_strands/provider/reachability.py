"""Whether an SGLang server (or router) answers, per base URL: one log line when it stops answering and one when
it answers again, and a count of failed attempts in a row for callers that act on it.

In training, slime's fault tolerance restarts engines behind the router while every request keeps retrying
(``max_retries``, 60 by default, with backoff): a line per failed attempt would be thousands of lines, and
none at all is minutes of silence. So the first attempt that fails (a connection error, or a 5xx answer)
after an answer logs a warning, the next answer logs how long the server was away, and nothing in between.
``slime-strands eval`` reads :attr:`Reachability.failures_in_a_row` to check the server's health and stop
within seconds when it is gone (``slime_strands.cli.eval.server_watch``).

The state is per base URL and per process, shared by every client that talks to it (a training and an eval
configuration with the same router log once).
"""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["Reachability", "reachability_of"]

logger = logging.getLogger("slime_strands.provider.client")

_LOCK = threading.Lock()
_BY_URL: dict[str, Reachability] = {}


class Reachability:
    """The answering state of one base URL; safe to update from any thread and event loop."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._lock = threading.Lock()
        self._failures = 0
        self._since: float | None = None

    @property
    def failures_in_a_row(self) -> int:
        """Attempts that failed since the last answer."""
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

    def answered(self) -> None:
        """An attempt got an answer (any status below 500); logged when the server was failing."""
        if self._since is None:  # the common case, without the lock
            return
        with self._lock:
            since, failures = self._since, self._failures
            self._since, self._failures = None, 0
        if since is not None:
            logger.warning(
                "SGLang at %s answers again after %.1f s (%d failed attempt(s) in between)",
                self.base_url,
                time.monotonic() - since,
                failures,
            )


def reachability_of(base_url: str) -> Reachability:
    """The process's one :class:`Reachability` of ``base_url``."""
    with _LOCK:
        state = _BY_URL.get(base_url)
        if state is None:
            state = _BY_URL[base_url] = Reachability(base_url)
        return state
