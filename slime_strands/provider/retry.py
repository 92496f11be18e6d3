"""RetryPolicy: which failures of a request to SGLang are tried again, how often, and how long to wait between.

One object says it for every loop that sends something again: a request that failed in transit or was answered
with a transient status (:meth:`SGLangClient._request`, the context-window discovery), a turn the server
aborted on its own (``SGLangClient.generate``'s resends), and a turn refused for a context window the client
did not know (``SGLangModel`` clamps it and sends it once more). The plugin builds it from its settings in one
place (``PluginSettings.retry_policy``); a library user passes one to :class:`SGLangClient`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp

__all__ = ["RETRYABLE_STATUS", "TRANSPORT_ERRORS", "RetryPolicy"]

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
"""Answers that say "not now" (timeout, too many requests, a server error or one loading / restarting)."""
TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
"""Failures in transit: connect errors, resets, disconnects, timeouts, bad framing."""
_BACKOFF_CEILING = 8
"""The longest backoff between two attempts, in ``delay_s``s."""


@dataclass(frozen=True)
class RetryPolicy:
    """How a request is tried again (see the module docstring)."""

    max_retries: int = 60
    """Attempts after the first for a transient failure (:data:`TRANSPORT_ERRORS`, :data:`RETRYABLE_STATUS`);
    any other 4xx is never tried again."""
    delay_s: float = 1.0
    """Base of the exponential backoff between attempts: each wait is drawn between ``delay_s / 2`` and
    ``min(delay_s * 2**n, 8 * delay_s)`` (jitter, so that clients that failed together do not retry together)."""
    abort_resends: int = 0
    """Times a request the server aborted although nobody asked is sent again (a worker restarting behind the
    router), then ``SGLangAbortError``; an abort the caller asked for is never sent again."""
    context_resends: int = 1
    """Times a turn the server refused for a context window it named (and the client did not know) is clamped
    to that window and sent again."""

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.delay_s < 0 or self.abort_resends < 0 or self.context_resends < 0:
            raise ValueError("max_retries, retry_delay, abort_resends and context_resends must be >= 0")

    def retries_status(self, status: int) -> bool:
        """Whether an answer with this HTTP status is tried again."""
        return status in RETRYABLE_STATUS

    @property
    def longest_backoff_s(self) -> float:
        """The longest wait between two attempts."""
        return _BACKOFF_CEILING * self.delay_s

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (the first retry is attempt 0)."""
        ceiling = min(self.delay_s * (2**attempt), self.longest_backoff_s)
        return random.uniform(min(self.delay_s / 2, ceiling), ceiling)

    async def attempts(self, retries: int | None = None) -> AsyncIterator[int]:
        """The numbers of the attempts of one request (``retries`` after the first: ``max_retries`` unless
        given), waiting the backoff before each but the first; the caller stops at the one that succeeds."""
        for number in range((self.max_retries if retries is None else retries) + 1):
            if number:
                await asyncio.sleep(self.backoff(number - 1))
            yield number
