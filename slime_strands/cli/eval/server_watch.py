"""``slime-strands eval`` stops within seconds when its server dies, instead of minutes of silent retries.

The client retries every request up to ``max_retries`` times with backoff (60 by default: minutes), which is
right for a server that restarts and wrong for one that is gone: each in-flight episode would end FAILED after
its retries, written as a FAILED row, with nothing said meanwhile. So once requests fail in a row
(:class:`~slime_strands.provider.reachability.Reachability`), the watch asks ``/health`` a few times, a second apart;
when no probe is answered the server is gone: :class:`ServerGone` ends the run (exit status 3), the episodes in
flight are cancelled and never written, and a rerun of the same command runs exactly them. An episode that
ends FAILED while requests fail asks the watch too before its row is written, so a dead server never leaves
FAILED rows behind.
"""

from __future__ import annotations

import asyncio

from ..._aio import within
from ...provider.client import SGLangClient

__all__ = ["ServerGone", "ServerWatch"]


class ServerGone(Exception):
    """The server stopped answering, ``/health`` included."""


class ServerWatch:
    """Probes a client's server when its requests fail in a row; :attr:`gone` once it does not answer."""

    def __init__(
        self,
        client: SGLangClient,
        *,
        failures: int = 2,
        probes: int = 5,
        interval_s: float = 1.0,
        probe_timeout_s: float = 5.0,
        poll_s: float = 0.25,
    ) -> None:
        """``failures`` in a row start a check of ``probes`` ``/health`` requests ``interval_s`` apart (each
        given ``probe_timeout_s``); the failure count is read every ``poll_s``."""
        self.client = client
        self._failures = failures
        self._probes = probes
        self._interval_s = interval_s
        self._probe_timeout_s = probe_timeout_s
        self._poll_s = poll_s
        self._check: asyncio.Task[bool] | None = None
        self.gone = False

    @property
    def failing(self) -> bool:
        """Whether the last attempt of a request failed (a FAILED episode then asks :meth:`alive`)."""
        return self.client.reachability.failing

    async def watch(self) -> None:
        """Run until the server is gone, then raise :class:`ServerGone` (cancel the task to stop watching)."""
        checked_at = 0
        while True:
            await asyncio.sleep(self._poll_s)
            failures = self.client.reachability.failures_in_a_row
            if failures < checked_at:
                checked_at = 0  # it answered meanwhile
            if failures - checked_at >= self._failures:
                checked_at = failures
                if not await self.alive():
                    raise ServerGone(self.client.base_url)

    async def alive(self) -> bool:
        """Whether the server answers ``/health`` within the probes; concurrent callers share one check."""
        if self.gone:
            return False
        if self._check is None or self._check.done():
            self._check = asyncio.ensure_future(self._probe())
        alive = await asyncio.shield(self._check)
        self.gone = self.gone or not alive
        return alive

    async def close(self) -> None:
        """Stop a check still running (the run ended meanwhile)."""
        if self._check is not None and not self._check.done():
            self._check.cancel()
            await asyncio.gather(self._check, return_exceptions=True)

    async def _probe(self) -> bool:
        for number in range(self._probes):
            if number:
                await asyncio.sleep(self._interval_s)
            try:
                if await within(self.client.health(), self._probe_timeout_s):
                    return True
            except asyncio.TimeoutError:
                continue
        return False
