"""SGLangClient: the only module that speaks HTTP to SGLang's native API.

One pooled ``aiohttp.ClientSession`` per event loop (slime runs rollouts on one background loop, tests and
users may run several), token-in requests to ``/generate``, retries with exponential backoff and jitter for
transient failures only, and small typed errors carrying the server's own message.

Facts about SGLang this module encodes (read from SGLang 0.5.23's source): the context window is reported by
``GET /v1/models`` (``max_model_len``; ``/server_info`` says ``context_length: null`` unless the server was
started with ``--context-length``); its scheduler refuses inputs of ``context_length - 6`` tokens or more
(:data:`SGLANG_CONTEXT_MARGIN`); every context-length refusal is a 400 with one of
:data:`CONTEXT_ERROR_PHRASES`, and most carry the window (:attr:`SGLangContextLengthError.window`: evidence,
weighed against the requests the server served, ``context_window.py``); its
scheduler matches ``/abort_request`` ids by PREFIX and it aborts the request of a client that disconnects
(a timeout). So every attempt of a request gets a fresh id of one fixed length (no id is a prefix of
another), and the ids in flight are kept per caller (:class:`RequestHandle`) so an abort reaches each by its
exact id.

aiohttp rather than httpx: httpcore's pool walks every pooled connection (twice) for every request it queues
or releases, which is quadratic in concurrency and was 43% of the process's CPU at 512 agents; aiohttp's
connector hands out idle connections from a per-host deque. ``benchmarks/bench_http.py`` measures both.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ..errors import SlimeStrandsError
from ..strict_reader import is_int
from .context_window import SGLANG_CONTEXT_MARGIN, ContextWindow
from .reachability import reachability_of
from .retry import TRANSPORT_ERRORS, RetryPolicy

__all__ = [
    "CONTEXT_ERROR_PHRASES",
    "SGLANG_CONTEXT_MARGIN",
    "GenerateResult",
    "RequestHandle",
    "SGLangAbortError",
    "SGLangClient",
    "SGLangConnectionError",
    "SGLangContextLengthError",
    "SGLangError",
    "SGLangHTTPError",
    "SGLangProtocolError",
    "SGLangTimeoutError",
    "TokenIdsJSON",
]

logger = logging.getLogger(__name__)

ROUTING_KEY_HEADER = "X-SMG-Routing-Key"
# Idle pooled connections are dropped before SGLang's uvicorn drops them (SGLANG_TIMEOUT_KEEP_ALIVE, 5 s):
# a request written on a connection the server is closing fails and costs a retry with backoff.
_KEEPALIVE_S = 4.0
_JSON_HEADERS = {"Content-Type": "application/json"}
_IDS_CHUNK = 8192
CONTEXT_ERROR_PHRASES = (
    "is longer than the model's context length",  # tokenizer manager: the input alone
    "exceeds the model's maximum context length",  # tokenizer manager: input + max_new_tokens
    "exceeds the maximum allowed length",  # scheduler: input >= min(context, KV pool) - 6
    "exceeds the KV memory budget",  # scheduler: the KV pool cannot hold the request
    "prompt is too long after expanding",  # scheduler: multimodal prompt after expansion
)
"""Lower-case phrases of SGLang's 400 answers that mean "the request does not fit the context"."""
_WINDOW_TEXTS = (
    (re.compile(r"maximum context length of (\d+) tokens"), 0),  # tokenizer manager: input + max_new_tokens
    (re.compile(r"longer than the model's context length \((\d+) tokens\)"), 0),  # the input alone
    # the scheduler's bound on inputs, ``min(context - 1, kv_pool - 1) - 5``: the window it implies
    (re.compile(r"exceeds the maximum allowed length \((\d+) tokens\)"), 6),
)
"""SGLang 0.5.23's context refusals that name a bound, and what to add to it to get the window it implies."""
_LOGPROB_LISTS = (
    "output_token_logprobs",
    "input_token_logprobs",
    "output_top_logprobs",
    "input_top_logprobs",
)


class SGLangError(SlimeStrandsError):
    """Base class of every error raised by :class:`SGLangClient`."""


class SGLangHTTPError(SGLangError):
    """The server answered with an error status; ``message`` is the server's own explanation."""

    def __init__(self, status_code: int, message: str, body: str = "") -> None:
        super().__init__(f"SGLang answered HTTP {status_code}: {message}")
        self.status_code = status_code
        self.message = message
        self.body = body


class SGLangContextLengthError(SGLangHTTPError):
    """A 400 saying the prompt (plus the requested new tokens) does not fit the model's context."""

    @property
    def window(self) -> int | None:
        """The context window SGLang's text implies (its scheduler's bound counts as ``bound + 6``, so
        :data:`SGLANG_CONTEXT_MARGIN` applies to both alike); None when the text names none."""
        for pattern, extra in _WINDOW_TEXTS:
            match = pattern.search(self.message)
            if match:
                return int(match.group(1)) + extra
        return None


class SGLangConnectionError(SGLangError):
    """The server could not be reached (or kept failing transiently) after every retry."""


class SGLangTimeoutError(SGLangConnectionError):
    """Every attempt of a request outlasted the client's timeout (``request_timeout_s``)."""


class SGLangProtocolError(SGLangError):
    """The server's answer does not have the shape of SGLang's /generate response."""


class SGLangAbortError(SGLangError):
    """The server kept aborting a request nobody asked to abort (e.g. a worker restarting behind the router)."""


@dataclass(frozen=True)
class GenerateResult:
    """One /generate answer, reduced to what a token-in/token-out trajectory needs."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    """``stop``, ``length`` or ``abort`` (SGLang's ``finish_reason.type``)."""
    finish_message: str | None = None
    finish_length: int | None = None
    """A ``length`` finish's ``max_new_tokens`` as the server applied it: less than the request's when the
    server clamped it (silently, to its window or KV pool)."""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    weight_version: str | None = None
    routed_experts: str | None = None
    """Base64 int32 array (MoE routing replay), when requested and served."""
    routed_experts_start_len: int = 0
    """First token position the routing rows cover: the server's echo, else what the request sent."""
    rid: str | None = None
    text: str = ""
    meta_info: dict[str, Any] = field(default_factory=dict, repr=False)
    """The server's ``meta_info`` without the per-token logprob lists (they are ``output_ids`` / ``logprobs``),
    with ``routed_experts_start_len`` filled as above when routing was requested: what slime's
    ``Sample.append_response_tokens`` reads (top-p spans, routing, weight version, cache and spec stats)."""


class RequestHandle:
    """The ids of one caller's ``/generate`` attempts in flight (one sample's, one trajectory's), so that
    :meth:`SGLangClient.abort` reaches every attempt by its exact id, and none starts after it.

    SGLang matches abort ids by prefix, so aborting by a shared base id would also kill unrelated retries;
    every attempt instead has an id of its own, recorded here while it runs."""

    __slots__ = ("_aborted", "_rids")

    def __init__(self) -> None:
        self._rids: set[str] = set()
        self._aborted = False

    @property
    def rids(self) -> frozenset[str]:
        """Ids of the attempts being answered now."""
        return frozenset(self._rids)

    @property
    def aborted(self) -> bool:
        """Whether the caller aborted: an ``abort`` answer is then expected, and no new attempt is sent."""
        return self._aborted

    def reset(self) -> None:
        """Forget an abort: the caller sends new requests (a new episode)."""
        self._aborted = False


class TokenIdsJSON:
    """A growing token sequence kept as the JSON text SGLang receives, so each token is serialised once.

    Every turn of a trajectory sends ALL of it as ``input_ids``: serialising 100k ids again costs ~8 ms a turn
    (json.dumps), appending the new ones costs microseconds. Pass it (``len`` is its token count) to
    :meth:`SGLangClient.generate` as ``input_ids``, with the not yet recorded tail as ``input_ids_tail``.
    """

    __slots__ = ("_count", "_text")

    def __init__(self, token_ids: Sequence[int] = ()) -> None:
        self._text = bytearray()
        self._count = 0
        self.extend(token_ids)

    def __len__(self) -> int:
        return self._count

    def extend(self, token_ids: Sequence[int] | TokenIdsJSON) -> None:
        if token_ids:
            if self._count:
                self._text += b","
            self._text += _ids_text(token_ids)
            self._count += len(token_ids)

    def to_json(self, tail: Sequence[int] | TokenIdsJSON = ()) -> bytes:
        """The JSON array of the sequence followed by ``tail``."""
        return b"".join(self.json_pieces(tail))

    def json_pieces(self, tail: Sequence[int] | TokenIdsJSON = ()) -> tuple[bytes | bytearray, ...]:
        """:meth:`to_json` in pieces, for a caller that joins them into a larger body: the ids (~700 kB at
        100k tokens) are then copied once per request, not once per concatenation."""
        if not tail:
            return b"[", self._text, b"]"
        return b"[", self._text, b"," if self._count else b"", _ids_text(tail), b"]"


def _ids_text(token_ids: Sequence[int] | TokenIdsJSON) -> bytes | bytearray:
    if isinstance(token_ids, TokenIdsJSON):
        return token_ids._text
    # In chunks: one join over 250k ids holds the GIL for ~30 ms, which stalls the event loop even when this
    # runs in a worker thread; between chunks the interpreter can hand the GIL back.
    return b",".join(_ids_chunk(token_ids[i : i + _IDS_CHUNK]) for i in range(0, len(token_ids), _IDS_CHUNK))


_IDS_ENCODER = json.JSONEncoder(separators=(",", ":"))
"""json's C encoder: a list of ids in ~40% of the time of ``",".join(map(str, ids))``."""


def _ids_chunk(token_ids: Sequence[int]) -> bytes:
    ids = token_ids if isinstance(token_ids, (list, tuple)) else list(token_ids)
    try:
        return _IDS_ENCODER.encode(ids)[1:-1].encode()
    except TypeError:  # ints json does not know (numpy's): their str() is the JSON number
        return ",".join(map(str, ids)).encode()


class SGLangClient:
    """Async client for SGLang's native ``/generate`` with token ids in and token ids out.

    Safe to share across coroutines of one process: each event loop gets its own pooled
    ``aiohttp.ClientSession`` (a session must not be used from a loop other than its own).
    Proxy variables from the environment are never read (``trust_env=False``).
    """

    def __init__(
        self,
        base_url: str,
        *,
        max_connections: int = 1000,
        timeout: float | None = None,
        max_retries: int | None = None,
        retry_delay: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        if max_connections <= 0:
            raise ValueError("max_connections must be > 0")
        if retry is None:
            defaults = RetryPolicy()
            retry = RetryPolicy(
                max_retries=defaults.max_retries if max_retries is None else max_retries,
                delay_s=defaults.delay_s if retry_delay is None else retry_delay,
            )
        elif max_retries is not None or retry_delay is not None:
            raise ValueError("pass either retry= or max_retries / retry_delay, not both")
        self.base_url = base_url.rstrip("/")
        self.max_connections = max_connections
        self.timeout = timeout
        self.retry = retry
        """How requests are tried again (:class:`~slime_strands.provider.retry.RetryPolicy`)."""
        self.window = ContextWindow(self.base_url)
        """The server's context window as its answers show it (reported, named by refusals, weighed against the
        requests it served): what :meth:`context_length` returns."""
        self._window_settled = False
        """Whether the window was asked for (or a refusal named it): no need to ask."""
        # A session references its loop, so a weak mapping would never let go: closed loops are swept instead.
        # Request ids: a random per-client prefix and a counter, 32 hex digits in all (uuid4 per request reads
        # os.urandom each time). Ids of one length are never a prefix of one another: SGLang aborts by prefix.
        self._rid_prefix = uuid.uuid4().hex[:16]
        self._rid_counter = itertools.count()
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._discovery: dict[asyncio.AbstractEventLoop, asyncio.Task[int | None]] = {}
        """The window discovery running on each loop: concurrent turns wait for one instead of each asking."""
        self.reachability = reachability_of(self.base_url)
        """Whether the server answers: logged once when it stops and once when it answers again; requests timing
        out (a busy server), once per stretch."""

    def __repr__(self) -> str:
        return f"SGLangClient({self.base_url!r}, max_connections={self.max_connections})"

    @property
    def max_retries(self) -> int:
        """``retry.max_retries``: attempts after the first for a transient failure."""
        return self.retry.max_retries

    @property
    def retry_delay(self) -> float:
        """``retry.delay_s``: the base of the backoff between attempts."""
        return self.retry.delay_s

    # -- HTTP plumbing -------------------------------------------------------------------------

    def _http(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            for other in [other for other in self._sessions if other.is_closed()]:
                # a loop that ended without aclose() (asyncio.run in tests, a finished worker thread)
                _discard(self._sessions.pop(other))
            session = aiohttp.ClientSession(
                base_url=self.base_url,
                connector=aiohttp.TCPConnector(
                    limit=self.max_connections, limit_per_host=0, keepalive_timeout=_KEEPALIVE_S
                ),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
            )
            self._sessions[loop] = session
        return session

    async def aclose(self) -> None:
        """Close the connection pool of the current event loop."""
        loop = asyncio.get_running_loop()
        session = self._sessions.pop(loop, None)
        if session is not None:
            await session.close()

    def __del__(self) -> None:
        for session in getattr(self, "_sessions", {}).values():
            _discard(session)

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
        retries: int | None = None,
        attempt: _Attempt | None = None,
    ) -> _Response:
        """Send one request, tried again as the retry policy says (failures in transit, 5xx / 408 / 429; never
        another 4xx), ``retries`` times instead of its ``max_retries`` when given.

        ``attempt``, when given, sends each attempt instead (a /generate attempt has an id of its own: SGLang
        rejects a duplicate in-flight rid and aborts by prefix). Every attempt timing out raises
        :class:`SGLangTimeoutError`.
        """
        retries = self.retry.max_retries if retries is None else retries
        last_error: Exception | None = None
        request_headers = {**_JSON_HEADERS, **(headers or {})}
        data = None if json_body is None else _dumps(json_body)
        async for number in self.retry.attempts(retries):
            try:
                if attempt is not None:
                    response = await attempt.send(request_headers)
                else:
                    response = await self._send(method, path, data, request_headers)
            except TRANSPORT_ERRORS as exc:
                last_error = exc
                if _gave_up_waiting(exc):  # sent, not answered in time: a busy (or hung) server
                    self.reachability.timed_out(
                        f"{method} {path}", self.timeout, self._retry_times_out_within()
                    )
                else:
                    self.reachability.failed(f"{method} {path}: {exc!r}")
                logger.debug("SGLang %s %s failed (%r), attempt %d", method, path, exc, number + 1)
                continue
            if response.status_code >= 500:
                self.reachability.failed(f"{method} {path}: HTTP {response.status_code}")
            elif path != "/abort_request":  # a server that hangs can still answer aborts of what it holds
                self.reachability.answered(generated=path == "/generate")
            if response.status_code < 400:
                return response
            error = _http_error(response)
            if not self.retry.retries_status(response.status_code):
                raise error
            last_error = error
            logger.debug(
                "SGLang %s %s answered %d, attempt %d", method, path, response.status_code, number + 1
            )
        assert last_error is not None
        where = f"{method} {self.base_url}{path}"
        if _gave_up_waiting(last_error):
            raise SGLangTimeoutError(
                f"{where} timed out: no answer within the {self.timeout} s request timeout in {retries + 1} "
                "attempt(s) (request_timeout_s; null waits as long as the server needs)"
            ) from last_error
        raise SGLangConnectionError(
            f"{where} failed after {retries + 1} attempt(s): {last_error!r}"
        ) from last_error

    def _retry_times_out_within(self) -> float | None:
        """How long after an attempt timed out its retry may time out in turn: the abort of the given-up attempt
        (a timeout at most), the longest backoff, and the retry's own timeout."""
        return None if self.timeout is None else 2 * self.timeout + self.retry.longest_backoff_s

    async def _send(
        self, method: str, path: str, data: bytes | None, headers: Mapping[str, str]
    ) -> _Response:
        """One HTTP exchange, read in full."""
        async with self._http().request(method, path, data=data, headers=headers) as raw:
            return _Response(raw.status, raw.reason or "", await raw.read(), str(raw.url))

    def _new_rid(self) -> str:
        return f"{self._rid_prefix}{next(self._rid_counter):016x}"

    async def _abort_given_up(self, rid: str) -> None:
        """Abort an attempt the client gave up on (timed out) by its exact id, before it is sent again: SGLang
        aborts a disconnected client's request itself, but a router in between may not pass the disconnect
        on, and the server would generate for nobody. Best effort: one try, failures ignored."""
        with contextlib.suppress(SGLangError):
            await self._request("POST", "/abort_request", json_body={"rid": rid}, retries=0)

    # -- API -----------------------------------------------------------------------------------

    async def generate(
        self,
        input_ids: Sequence[int] | TokenIdsJSON,
        sampling_params: Mapping[str, Any],
        *,
        input_ids_tail: Sequence[int] | TokenIdsJSON = (),
        rid: str | None = None,
        routing_key: str | None = None,
        return_routed_experts: bool = False,
        routed_experts_start_len: int = 0,
        abort_retries: int | None = None,
        abort_signal: Callable[[], bool] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        handle: RequestHandle | None = None,
        abort_expected: Callable[[], bool] | None = None,
        image_data: Sequence[str] = (),
        image_tokens: int = 0,
    ) -> GenerateResult:
        """Generate from ``input_ids`` (never text) and return output ids with their logprobs.

        ``logprob_start_len = len(input_ids) - 1`` keeps SGLang's prefix cache usable while returning only
        the output logprobs. ``routing_key`` pins every turn of one trajectory to one worker.
        ``routed_experts_start_len`` asks only for the routing rows of positions the caller does not hold yet.
        The ids sent are ``input_ids`` followed by ``input_ids_tail`` (a :class:`TokenIdsJSON` trajectory and
        this turn's new ids: the trajectory is not serialised again every turn).

        Every attempt (a retry after a transient failure or a timeout, a resend after a server abort) has a
        fresh id (``rid``, when given, is the first attempt's; it must not be a prefix of another request's
        id); an attempt that timed out is aborted by its id before the next is sent. ``handle`` holds the ids
        in flight: :meth:`abort` with it reaches each attempt, and no attempt is sent after it (the answer is
        then an ``abort`` with nothing generated). A context refusal raises :class:`SGLangContextLengthError`
        and the window its text names is weighed against the requests the server served (:attr:`window`).

        An ``abort`` answer the caller did not cause (``abort_signal()`` false and ``handle`` not aborted: e.g.
        a worker restarting behind the router) is sent again, up to ``abort_retries`` times (default: the retry
        policy's ``abort_resends``, 0 unless set), then raises :class:`SGLangAbortError`; an abort the caller
        asked for (slime's own) is returned as is. ``abort_expected`` is the older name of ``abort_signal``.

        ``image_data``: every image of the conversation so far, in prompt order, each shown by one pad in the
        ids; ``image_tokens``: the pads the server adds expanding them (the prompt it counts is that longer).
        """
        if abort_expected is not None:
            if abort_signal is not None:
                raise ValueError("pass abort_signal (or its older name abort_expected), not both")
            abort_signal = abort_expected
        resends = self.retry.abort_resends if abort_retries is None else abort_retries
        count = len(input_ids) + len(input_ids_tail) + image_tokens
        if not count:
            raise ValueError("input_ids must not be empty")
        if routed_experts_start_len < 0 or routed_experts_start_len > count:
            raise ValueError(f"routed_experts_start_len must be in [0, {count}]")
        if not isinstance(input_ids, TokenIdsJSON):
            input_ids = TokenIdsJSON(input_ids)
        if image_data:
            extra_body = {**(extra_body or {}), "image_data": list(image_data)}
        body = _generate_body(
            sampling_params, count, return_routed_experts, routed_experts_start_len, extra_body
        )
        handle = RequestHandle() if handle is None else handle
        attempt = _Attempt(self, body, input_ids.json_pieces(input_ids_tail), count, handle, rid)
        start = routed_experts_start_len if return_routed_experts else None
        return await self._send_generate(attempt, routing_key, start, resends, abort_signal)

    async def _send_generate(
        self,
        attempt: _Attempt,
        routing_key: str | None,
        routed_experts_start: int | None,
        resends: int,
        abort_signal: Callable[[], bool] | None,
    ) -> GenerateResult:
        """POST the request (retried by :meth:`_request`), sent again when the server aborts it on its own, up to
        ``resends`` times (see :meth:`generate`)."""
        headers = {ROUTING_KEY_HEADER: routing_key} if routing_key else None
        for resend in range(resends + 1):
            try:
                response = await self._request("POST", "/generate", headers=headers, attempt=attempt)
            except _AbortedBeforeSending:
                return GenerateResult(
                    [], [], "abort", "aborted by the client before it was sent", rid=attempt.rid
                )
            except SGLangContextLengthError as exc:
                if self.window.refused(exc.window, attempt.input_tokens, exc.message):
                    self._window_settled = True
                raise
            result = _parse_generate(response, attempt.rid or "", routed_experts_start)
            if result.output_ids or result.finish_reason != "abort":
                self.window.served(attempt.input_tokens, len(result.output_ids))
            expected = attempt.aborted or (abort_signal is not None and abort_signal())
            if result.finish_reason != "abort" or not resends or expected:
                return result
            logger.warning(
                "SGLang aborted request %s on its own (%s); attempt %d of %d",
                attempt.rid,
                result.finish_message,
                resend + 1,
                resends + 1,
            )
        raise SGLangAbortError(
            f"the server aborted the request {resends + 1} times without being asked to: "
            f"{result.finish_message or 'no reason given'}"
        )

    async def health(self) -> bool:
        """True when ``/health`` answers 200 (one attempt, no retries)."""
        try:
            async with self._http().get("/health") as response:
                return response.status == 200
        except TRANSPORT_ERRORS:
            return False

    async def abort(self, target: str | RequestHandle | None = None) -> None:
        """Abort one request by its id, every attempt a :class:`RequestHandle` has in flight (each by its exact
        id; none is sent after this), or every in-flight request of the server when ``target`` is None.

        SGLang aborts every request whose id STARTS with the given one: the ids this client makes are never a
        prefix of one another, so an id of theirs reaches exactly that request."""
        if target is None:
            await self._request("POST", "/abort_request", json_body={"abort_all": True}, retries=2)
            return
        if isinstance(target, RequestHandle):
            target._aborted = True
            rids = sorted(target.rids)
        else:
            rids = [target]
        for rid in rids:
            await self._request("POST", "/abort_request", json_body={"rid": rid}, retries=2)

    async def model_info(self, *, retries: int = 2) -> dict[str, Any]:
        """The server's ``/model_info`` (``/get_model_info`` on older servers)."""
        return _json(await self._info("/model_info", "/get_model_info", retries))

    async def server_info(self, *, retries: int = 2) -> dict[str, Any]:
        """The server's ``/server_info`` (``/get_server_info`` on older servers)."""
        return _json(await self._info("/server_info", "/get_server_info", retries))

    async def _info(self, path: str, old_path: str, retries: int) -> _Response:
        try:
            return await self._request("GET", path, retries=retries)
        except SGLangHTTPError as exc:
            if exc.status_code != 404:
                raise
            return await self._request("GET", old_path, retries=retries)

    async def models(self, *, retries: int = 2) -> dict[str, Any]:
        """The server's OpenAI-style ``GET /v1/models`` (where stock SGLang reports ``max_model_len``)."""
        return _json(await self._request("GET", "/v1/models", retries=retries))

    async def context_length(self) -> int | None:
        """The served model's context window: ``/v1/models`` ``max_model_len`` first, then ``/server_info`` /
        ``/model_info`` (which report it only when the server was started with ``--context-length``), or
        what a context refusal named that the requests the server served do not contradict (:attr:`window`);
        None when the server answers but no answer says (a refusal will).

        Asked once per client, by one request on each event loop however many turns wait for it. While the
        server cannot be reached (down, or answering 503 while it loads), the question is asked again with the
        backoff of a request, up to ``max_retries`` times, before any turn is sent; then
        :class:`SGLangConnectionError`. A turn is never sent sized for an unknown window for want of asking.
        """
        if self._window_settled:
            return self.window.tokens
        loop = asyncio.get_running_loop()
        task = self._discovery.get(loop)
        if task is None or task.done():
            for other in [other for other in self._discovery if other.is_closed()]:
                del self._discovery[other]
            task = self._discovery[loop] = loop.create_task(self._discover_window())
            task.add_done_callback(_retrieve)
        try:
            return await asyncio.shield(task)
        finally:
            if task.done() and self._discovery.get(loop) is task:
                del self._discovery[loop]

    async def _discover_window(self) -> int | None:
        """Rounds of the three questions until one says the window, or all three were answered (a 404 counts)
        without saying it; a round that any of them could not reach is asked again after a backoff (a route
        answering 503 may be the one that knows)."""
        last_error: Exception | None = None
        async for number in self.retry.attempts():
            if number and self._window_settled:  # a context refusal named it meanwhile
                return self.window.tokens
            unreachable = False
            for getter in (self.models, self.server_info, self.model_info):
                try:
                    info = await getter(retries=0)
                except (
                    SGLangConnectionError
                ) as exc:  # unreachable, or a 5xx / 408 / 429 (loading, restarting)
                    last_error, unreachable = exc, True
                    continue
                except SGLangError:  # a 404, a non-JSON answer: this route will not say
                    continue
                value = _window_of(info)
                if value is not None:
                    self.window.reported(value)
                    self._window_settled = True
                    return self.window.tokens
            if not unreachable:
                self._window_settled = True  # the server does not say: a context refusal will
                return self.window.tokens
        raise SGLangConnectionError(
            f"cannot learn the context window of {self.base_url}: /v1/models, /server_info and /model_info "
            f"failed {self.retry.max_retries + 1} time(s): {last_error!r}"
        ) from last_error


def _generate_body(
    sampling_params: Mapping[str, Any],
    count: int,
    return_routed_experts: bool,
    routed_experts_start_len: int,
    extra_body: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """A /generate body without its ids and ``rid`` (each attempt adds its own)."""
    body: dict[str, Any] = {
        "sampling_params": dict(sampling_params),
        "return_logprob": True,
        "logprob_start_len": count - 1,
        "stream": False,
    }
    if return_routed_experts:
        body["return_routed_experts"] = True
        if routed_experts_start_len:
            body["routed_experts_start_len"] = routed_experts_start_len
    if extra_body:
        body.update(extra_body)
    return body


class _AbortedBeforeSending(Exception):
    """The caller aborted its :class:`RequestHandle` before this attempt went out."""


class _Attempt:
    """The attempts of one /generate request: each with a fresh id, recorded in the caller's handle while it
    runs; one that times out is aborted by its id before the next is sent."""

    def __init__(
        self,
        client: SGLangClient,
        body: dict[str, Any],
        ids_json: tuple[bytes | bytearray, ...],
        input_tokens: int,
        handle: RequestHandle,
        first_rid: str | None,
    ) -> None:
        self._client = client
        self._body = body
        self._ids_json = ids_json
        self.input_tokens = input_tokens
        self._handle = handle
        self._next_rid = first_rid
        self.rid: str | None = None
        """The id of the latest attempt: the one that answered, once the request returned."""

    @property
    def aborted(self) -> bool:
        """Whether the caller aborted the request (its handle)."""
        return self._handle.aborted

    async def send(self, headers: Mapping[str, str]) -> _Response:
        if self._handle.aborted:
            raise _AbortedBeforeSending
        rid, self._next_rid = self._next_rid or self._client._new_rid(), None
        self.rid = rid
        rest = _dumps({**self._body, "rid": rid})
        # the ids are serialised once per trajectory and copied once per request
        data = b"".join((b'{"input_ids":', *self._ids_json, b",", memoryview(rest)[1:]))
        self._handle._rids.add(rid)
        try:
            return await self._client._send("POST", "/generate", data, headers)
        except asyncio.TimeoutError as exc:
            if _gave_up_waiting(exc):  # not a connect that timed out: the server has it
                await self._client._abort_given_up(rid)
            raise
        finally:
            self._handle._rids.discard(rid)


def _gave_up_waiting(error: BaseException) -> bool:
    """Whether the client's timeout ended an attempt the server had received (not a connect that timed out)."""
    return isinstance(error, asyncio.TimeoutError) and not isinstance(error, aiohttp.ConnectionTimeoutError)


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a task's exception as seen: its awaiters may all have been cancelled."""
    if not task.cancelled():
        task.exception()


def _int_or_none(value: Any) -> int | None:
    return value if is_int(value) else None


def _window_of(info: Any) -> int | None:
    """The context length in a ``/v1/models`` list (its first model) or an info dict."""
    if isinstance(info, dict) and isinstance(info.get("data"), list):
        cards = [card for card in info["data"] if isinstance(card, dict)]
        info = cards[0] if cards else {}
    if not isinstance(info, dict):
        return None
    for key in ("max_model_len", "context_length", "max_context_length", "context_len"):
        value = _int_or_none(info.get(key))
        if value is not None and value > 0:
            return value
    return None


@dataclass(frozen=True)
class _Response:
    """An answer read in full (SGLang answers /generate in one piece): status, reason, body, URL."""

    status_code: int
    reason_phrase: str
    content: bytes
    url: str

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


def _dumps(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _discard(session: aiohttp.ClientSession) -> None:
    """Close a session's connections without awaiting (its loop is closed, or the client is being collected)."""
    connector = session.connector
    session.detach()
    if connector is not None and not connector.closed:
        # aiohttp's synchronous close (what its own __del__ uses): close() is a coroutine, and no loop runs here
        connector._close()


def _json(response: _Response) -> Any:
    try:
        return json.loads(response.content)
    except ValueError as exc:
        raise SGLangProtocolError(f"expected JSON from {response.url}, got {response.text[:200]!r}") from exc


def _error_message(response: _Response) -> str:
    """Extract the server's message from any of SGLang's error body shapes."""
    text = response.text
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:2000] or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error", body.get("detail"))
        if isinstance(error, dict):
            return str(error.get("message", error))
        if error is not None:
            return str(error)
        if "message" in body:
            return str(body["message"])
    return text.strip()[:2000]


def _http_error(response: _Response) -> SGLangHTTPError:
    message = _error_message(response)
    lowered = message.lower()
    if response.status_code == 400 and any(phrase.lower() in lowered for phrase in CONTEXT_ERROR_PHRASES):
        return SGLangContextLengthError(400, message, response.text)
    return SGLangHTTPError(response.status_code, message, response.text)


def _parse_generate(response: _Response, rid: str, routed_experts_start_len: int | None) -> GenerateResult:
    body = _json(response)
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    if not isinstance(body, dict) or not isinstance(body.get("meta_info"), dict):
        raise SGLangProtocolError(f"unexpected /generate answer: {str(body)[:300]}")
    meta: dict[str, Any] = body["meta_info"]
    finish = meta.get("finish_reason") or {}
    if isinstance(finish, str):
        finish = {"type": finish}
    finish_type = str(finish.get("type") or "stop")
    entries = meta.get("output_token_logprobs")
    output_ids = body.get("output_ids")
    if entries is None:
        if finish_type == "abort" and not output_ids:
            entries = []  # aborted in the waiting queue: nothing was generated
        else:
            raise SGLangProtocolError("the answer has no output_token_logprobs (was return_logprob ignored?)")
    ids = [int(entry[1]) for entry in entries]
    logprobs = [float(entry[0]) if entry[0] is not None else 0.0 for entry in entries]
    if output_ids is not None and list(output_ids) != ids:
        raise SGLangProtocolError(
            f"output_ids ({len(output_ids)} tokens) disagree with output_token_logprobs ({len(ids)} tokens)"
        )
    replay_meta = {k: v for k, v in meta.items() if k not in _LOGPROB_LISTS}
    if routed_experts_start_len is not None:  # SGLang 0.5.23 does not echo it: the rows start where we asked
        replay_meta.setdefault("routed_experts_start_len", routed_experts_start_len)
    return GenerateResult(
        output_ids=ids,
        logprobs=logprobs,
        finish_reason=finish_type,
        finish_message=finish.get("message"),
        finish_length=_int_or_none(finish.get("length")) if finish_type == "length" else None,
        prompt_tokens=meta.get("prompt_tokens"),
        cached_tokens=meta.get("cached_tokens"),
        completion_tokens=meta.get("completion_tokens"),
        weight_version=None if meta.get("weight_version") is None else str(meta["weight_version"]),
        routed_experts=meta.get("routed_experts"),
        routed_experts_start_len=int(replay_meta.get("routed_experts_start_len") or 0),
        rid=str(meta.get("id") or rid),
        text=str(body.get("text") or ""),
        meta_info=replay_meta,
    )
