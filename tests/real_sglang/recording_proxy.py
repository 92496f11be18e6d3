"""A recording HTTP proxy in front of the real SGLang server: every request and every answer, as sent.

The tier points the client (or slime, or ``slime-strands eval``) at the proxy, so its tests can check each
request's ``input_ids`` against the trajectory and each generated token and logprob against the server's
answer. It records in the shape of :class:`slime_strands.testing.SGLangTestServer` (``generate_requests``,
``answers``, ``meta_infos``), so ``slime_strands.testing.invariants`` checks real-server trajectories as it
checks the stand-in's.

A client that disconnects (its timeout) makes the proxy close its own connection to SGLang, which then
aborts the request as it does for any disconnected client: the proxy is transparent to that too.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from slime_strands.testing import RecordedRequest

__all__ = ["Exchange", "RecordingProxy"]

_FORWARDED_HEADERS = ("content-type", "x-smg-routing-key")


@dataclass(frozen=True)
class Exchange:
    """One request through the proxy and what came of it."""

    method: str
    path: str
    body: Any
    """The request's JSON body (None when it had none or it was not JSON)."""
    headers: dict[str, str]
    """Lower-case header names."""
    sent_at: float
    status: int | None = None
    """The server's HTTP status; None while in flight or when the client disconnected first."""
    answer: Any = None
    """The server's JSON answer (a string when it was not JSON)."""
    disconnected: bool = False
    """The client hung up before the answer (the proxy then hung up on SGLang too)."""

    @property
    def rid(self) -> str | None:
        return self.body.get("rid") if isinstance(self.body, dict) else None

    @property
    def finish_type(self) -> str | None:
        if not isinstance(self.answer, dict):
            return None
        return ((self.answer.get("meta_info") or {}).get("finish_reason") or {}).get("type")


class RecordingProxy:
    """Forward everything to ``upstream`` and record it; runs its own event loop in a thread."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self._exchanges: list[Exchange] = []
        self._changed = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> RecordingProxy:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._serve, args=(ready,), name="recording-proxy", daemon=True
        )
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the recording proxy did not start")
        return self

    def _serve(self, ready: threading.Event) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._open())
        ready.set()
        self._loop.run_forever()

    async def _open(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), trust_env=False)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{path:.*}", self._forward)
        # A client that hangs up cancels its handler, which closes the connection to SGLang (SGLang's own
        # disconnect handling then aborts the request, as it would for the client itself).
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        if self._loop is None:
            return
        loop, self._loop = self._loop, None
        asyncio.run_coroutine_threadsafe(self._close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        assert self._thread is not None
        self._thread.join(30)
        loop.close()

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def __enter__(self) -> RecordingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def host_port(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    # -- forwarding ----------------------------------------------------------------------------------

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED_HEADERS}
        index = self._record(
            Exchange(
                method=request.method,
                path=request.path,
                body=_json_or_none(raw),
                headers={k.lower(): v for k, v in headers.items()},
                sent_at=time.time(),
            )
        )
        assert self._session is not None
        try:
            async with self._session.request(
                request.method, self.upstream + request.path_qs, data=raw or None, headers=headers
            ) as upstream:
                content = await upstream.read()
                status, content_type = upstream.status, upstream.content_type
        except asyncio.CancelledError:
            self._update(index, disconnected=True)
            raise
        self._update(index, status=status, answer=_json_or_text(content))
        return web.Response(body=content, status=status, content_type=content_type)

    def _record(self, exchange: Exchange) -> int:
        with self._changed:
            self._exchanges.append(exchange)
            self._changed.notify_all()
            return len(self._exchanges) - 1

    def _update(self, index: int, **changes: Any) -> None:
        with self._changed:
            old = self._exchanges[index]
            self._exchanges[index] = Exchange(**{**old.__dict__, **changes})
            self._changed.notify_all()

    # -- what was recorded ---------------------------------------------------------------------------

    @property
    def exchanges(self) -> list[Exchange]:
        with self._changed:
            return list(self._exchanges)

    def generations(self, routing_key: str | None = None, *, since: int = 0) -> list[Exchange]:
        """The /generate exchanges (from exchange number ``since``), of one routing key when given."""
        return [
            e
            for e in self.exchanges[since:]
            if e.path == "/generate"
            and (routing_key is None or e.headers.get("x-smg-routing-key") == routing_key)
        ]

    def mark(self) -> int:
        """The number of exchanges so far: pass it as ``since`` to look only at what comes after."""
        with self._changed:
            return len(self._exchanges)

    def wait_for(self, predicate: Callable[[list[Exchange]], bool], timeout_s: float, what: str) -> None:
        """Block until ``predicate(exchanges)`` holds; AssertionError naming ``what`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not predicate(list(self._exchanges)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
                self._changed.wait(left)

    # -- the stand-in's shape, for slime_strands.testing.invariants -------------------------------------

    @property
    def generate_requests(self) -> list[RecordedRequest]:
        return [RecordedRequest(e.path, e.body, e.headers, e.sent_at) for e in self.generations()]

    @property
    def answers(self) -> dict[str, tuple[list[int], list[float]]]:
        """``rid`` -> (output_ids, logprobs) of every answer that carried tokens."""
        out = {}
        for e in self.generations():
            meta = e.answer.get("meta_info") if isinstance(e.answer, dict) else None
            if e.status == 200 and meta and e.answer.get("output_ids"):
                entries = meta.get("output_token_logprobs") or []
                out[str(meta.get("id") or e.rid)] = (
                    [int(entry[1]) for entry in entries],
                    [0.0 if entry[0] is None else float(entry[0]) for entry in entries],
                )
        return out

    @property
    def meta_infos(self) -> dict[str, dict[str, Any]]:
        """``rid`` -> the ``meta_info`` of every 200 answer."""
        out = {}
        for e in self.generations():
            if e.status == 200 and isinstance(e.answer, dict) and isinstance(e.answer.get("meta_info"), dict):
                meta = e.answer["meta_info"]
                out[str(meta.get("id") or e.rid)] = meta
        return out


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def _json_or_text(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", errors="replace")
