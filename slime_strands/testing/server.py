"""A local server speaking SGLang's native HTTP protocol, for tests and offline development.

Real HTTP on 127.0.0.1 (a free port), answers scripted with a REAL tokenizer: ``output_ids`` include the
end-of-turn token on ``stop`` finishes, logprobs come as ``[logprob, token_id, null]``, and requests can be
aborted or met with injected faults (error statuses, dropped connections, slow answers). Every request body
and header, and everything answered, is recorded for assertions.

It answers the way SGLang 0.5.23 does, from facts read in SGLang's source (never from the plugin, whose
mistakes it must catch): unknown sampling params get the API contract's 400 text; the tokenizer manager's
context checks, then the scheduler's (inputs of ``min(context - 1, kv_capacity - 1) - 5`` tokens or more are
refused: "Input length (N tokens) exceeds the maximum allowed length (M tokens)") and its silent clamp of
``max_new_tokens``; the window only in ``/v1/models`` (``/server_info`` says ``context_length: null`` unless
started with ``--context-length``); MoE routing rows from ``routed_experts_start_len`` on, as base64 int32
(only when started with routed experts, like ``--enable-return-routed-experts``; the start is not echoed
unless asked, as in 0.5.23); slime's top-p patch (``custom_params.return_top_p_token_ids`` -> ragged
``top_p_token_ids`` / ``top_p_token_offsets`` in ``meta_info``, base64 int32); speculative-decoding stats.

    with SGLangTestServer(tokenizer) as server:
        server.script(Turn("<tool_call>...</tool_call>"), Turn("Answer: 42"))
        model = SGLangModel(tokenizer=tokenizer, base_url=server.base_url)
"""

from __future__ import annotations

import base64
import collections
import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Fault", "RecordedRequest", "SGLangTestServer", "Turn"]

# SGLang 0.5.23's API contract (sglang/api/v1/api_types.py, _FIELDS_SamplingParams), in its order: the
# fields named in its "unknown field" 400.
_SGLANG_SAMPLING_FIELDS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width", "watermark",
    "choice",
)  # fmt: skip
_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default when the request does not say
_NUM_EXPERTS = 128  # routed expert ids are in [0, _NUM_EXPERTS)


@dataclass
class Turn:
    """One scripted answer.

    ``text`` is encoded with the server's tokenizer (or give ``token_ids``). ``finish="stop"`` appends the
    end-of-turn token; ``"length"`` returns the tokens without it; ``"abort"`` returns them as the partial
    output of an aborted request. ``max_new_tokens`` from the request is always enforced (a longer answer
    is cut and finishes with ``length``). ``delay_s`` holds the answer back (an abort ends the wait).
    """

    text: str | None = None
    token_ids: Sequence[int] | None = None
    finish: str = "stop"
    delay_s: float = 0.0
    logprobs: Sequence[float] | None = None
    weight_version: str | None = None
    stop_token_id: int | None = None
    """Token that ends a ``stop`` finish (default: the end-of-turn token), e.g. ``<|endoftext|>``."""
    abort_message: str = "Abort in running"
    """``finish_reason.message`` of an ``abort`` answer."""


@dataclass
class Fault:
    """An injected failure answering one request instead of a turn (the turn waits for the next request)."""

    status: int | None = 503
    """HTTP status to answer with; ignored when ``drop_connection``."""
    body: Any = field(default_factory=lambda: {"error": {"message": "Service Unavailable"}})
    drop_connection: bool = False
    """Close the connection without answering (the client sees a transport error)."""
    delay_s: float = 0.0


@dataclass
class RecordedRequest:
    path: str
    body: Any
    headers: dict[str, str]
    time: float


class SGLangTestServer:
    """An SGLang-protocol server scripted turn by turn; see the module docstring."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        context_length: int = 32768,
        kv_capacity: int | None = None,
        context_length_flag: bool = False,
        model_path: str = "Qwen/Qwen3-8B",
        weight_version: str = "0",
        end_of_turn: str | Sequence[str] = "<|im_end|>",
        routed_experts: tuple[int, int] | None = None,
        echo_routed_experts_start_len: bool = False,
        top_p_patch: bool = True,
        speculative_draft_tokens: int | None = None,
        unavailable_s: float = 0.0,
        report_window: bool = True,
    ) -> None:
        """``kv_capacity``: tokens the KV pool holds (default: the context); ``context_length_flag``: as if
        started with ``--context-length`` (``/server_info`` reports it); ``routed_experts``:
        ``(layers, topk)`` as if started with ``--enable-return-routed-experts`` (None: the key is silently
        absent); ``top_p_patch``: slime's SGLang patch returning top-p token ids; ``speculative_draft_tokens``:
        as if started with EAGLE speculative decoding (spec stats in ``meta_info``); ``unavailable_s``: every
        route answers 503 for this long from the first request it gets (a router or an engine still loading
        when clients start: the clock starts with them, not with the test's set-up); ``report_window``:
        False leaves ``max_model_len`` out of ``/v1/models`` (a server that reports no window)."""
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.kv_capacity = kv_capacity if kv_capacity is not None else context_length
        self.context_length_flag = context_length_flag
        self.model_path = model_path
        self.weight_version = weight_version
        # Several stop tokens for templates whose next role tag ends a turn (GLM: <|observation|>, <|user|>);
        # a "stop" finish ends on the first unless the Turn names another.
        tokens = [end_of_turn] if isinstance(end_of_turn, str) else list(end_of_turn)
        self.end_of_turn_ids = [int(tokenizer.convert_tokens_to_ids(t)) for t in tokens]
        self.end_of_turn_id = self.end_of_turn_ids[0]
        self.routed_experts = routed_experts
        self.echo_routed_experts_start_len = echo_routed_experts_start_len
        self.top_p_patch = top_p_patch
        self.speculative_draft_tokens = speculative_draft_tokens
        self.unavailable_s = unavailable_s
        self.report_window = report_window
        self._available_at: float | None = None
        self.requests: list[RecordedRequest] = []
        self.aborted_rids: list[str] = []
        self.answers: dict[str, tuple[list[int], list[float]]] = {}
        """``rid`` -> (output_ids, logprobs) of every answer that carried tokens."""
        self.meta_infos: dict[str, dict[str, Any]] = {}
        """``rid`` -> the ``meta_info`` of every 200 answer, as sent."""
        self._lock = threading.Lock()
        self._turns: dict[str | None, collections.deque[Turn | Fault]] = collections.defaultdict(
            collections.deque
        )
        self._in_flight: dict[str, threading.Event] = {}
        self._last_sequence: dict[str | None, list[int]] = {}
        self.responder: Callable[[dict[str, Any], dict[str, str]], Turn | Fault] | None = None
        self.routes_missing: set[str] = set()
        """GET paths answered 404 (a router or an older server without them)."""
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] | None = None
        """Open client connections while running: stop() closes them, as a server shutting down does, and
        joins their handler threads, so that none is left waiting for a next request on a keep-alive
        connection."""

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> SGLangTestServer:
        if self._httpd is not None:
            raise RuntimeError("SGLangTestServer is already running: start() it or enter it, not both")
        handler = type("Handler", (_Handler,), {"server_state": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = False  # server_close() joins the handler threads
        self._connections = set()
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.02},  # stop() waits one poll: keep it short
            name="sglang-test-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            for event in list(self._in_flight.values()):
                event.set()
            self._httpd.shutdown()
            with self._lock:
                connections, self._connections = self._connections or set(), None
            for connection in connections:
                _hang_up(connection)
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> SGLangTestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- scripting --------------------------------------------------------------------------------

    def script(self, *items: Turn | Fault | str, key: str | None = None) -> None:
        """Queue answers (strings are ``Turn(text)``); ``key`` scopes them to one ``X-SMG-Routing-Key``."""
        with self._lock:
            for item in items:
                self._turns[key].append(Turn(item) if isinstance(item, str) else item)

    def pending(self, key: str | None = None) -> int:
        with self._lock:
            return len(self._turns[key])

    @property
    def in_flight(self) -> list[str]:
        """``rid`` of every ``/generate`` request being answered now: the ones an abort reaches (a request is
        recorded a moment before it is in flight)."""
        with self._lock:
            return list(self._in_flight)

    @property
    def generate_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == "/generate"]

    @property
    def max_req_len(self) -> int:
        """The scheduler's bound on input + output (tp_worker: ``min(context - 1, kv - 1)``)."""
        return min(self.context_length - 1, self.kv_capacity - 1)

    @property
    def max_req_input_len(self) -> int:
        """Inputs of this many tokens or more are refused by the scheduler."""
        return self.max_req_len - 5

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> Turn | Fault:
        key = headers.get("x-smg-routing-key")
        with self._lock:
            for scope in (key, None):
                if self._turns.get(scope):
                    return self._turns[scope].popleft()
        if self.responder is not None:
            return self.responder(body, headers)
        return Fault(status=500, body={"error": {"message": "SGLangTestServer: no scripted turn left"}})

    # -- protocol ---------------------------------------------------------------------------------

    def _generate(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any] | None:
        input_ids = body.get("input_ids")
        if input_ids is None and "text" not in body:
            return 400, {"error": {"message": "Either text, input_ids or input_embeds should be provided."}}
        if not isinstance(input_ids, list) or not all(isinstance(t, int) for t in input_ids):
            return 400, {"error": {"message": "SGLangTestServer supports token-in requests only"}}
        if not input_ids:
            return 400, {"error": {"message": "input_ids cannot be empty."}}
        params = body.get("sampling_params") or {}
        error = _contract_error(params) or self._length_error(input_ids, params) or self._routing_error(body)
        if error is not None:
            return 400, error
        requested = params.get("max_new_tokens")
        max_new = min(
            _DEFAULT_MAX_NEW_TOKENS if requested is None else requested,
            self.max_req_len - len(input_ids) - 1,  # the scheduler's silent clamp
        )
        item = self._next(body, headers)
        rid = str(body.get("rid") or f"rid-{len(self.requests)}")
        abort_event = threading.Event()
        with self._lock:
            if rid in self._in_flight:
                return 400, {"error": {"message": f"Duplicate request ID {rid}"}}
            self._in_flight[rid] = abort_event
        try:
            if item.delay_s:
                abort_event.wait(item.delay_s)
            if isinstance(item, Fault):
                return None if item.drop_connection else (item.status or 500, item.body)
            return 200, self._answer(item, body, headers, rid, max_new, aborted=abort_event.is_set())
        finally:
            with self._lock:
                self._in_flight.pop(rid, None)

    def _length_error(self, input_ids: list[int], params: dict[str, Any]) -> dict[str, Any] | None:
        """SGLang's context checks, in its order: the tokenizer manager's, then the scheduler's."""
        n, window = len(input_ids), self.context_length
        if n >= window:
            return _error(
                f"The input ({n} tokens) is longer than the model's context length ({window} tokens)."
            )
        max_new = params.get("max_new_tokens")
        if max_new is not None and n + max_new > window:
            return _error(
                f"Requested token count exceeds the model's maximum context length of {window} tokens. "
                f"You requested a total of {n + max_new} tokens: {n} tokens from the input messages and "
                f"{max_new} tokens for the completion. Please reduce the number of tokens in the input messages "
                "or the completion to fit within the limit."
            )
        if n >= self.max_req_input_len:
            return _error(
                f"Input length ({n} tokens) exceeds the maximum allowed length ({self.max_req_input_len} tokens). "
                "Use a shorter input or enable --allow-auto-truncate."
            )
        return None

    def _routing_error(self, body: dict[str, Any]) -> dict[str, Any] | None:
        start, n = body.get("routed_experts_start_len", 0), len(body["input_ids"])
        if not body.get("return_routed_experts"):
            return None
        if start < 0:
            return _error(
                f"recv_req.routed_experts_start_len={start} is lower than 0. "
                "Please use a non-negative routed_experts_start_len."
            )
        if start > n:
            return _error(
                f"recv_req.routed_experts_start_len={start} is higher than the number of input tokens "
                f"len(req.origin_input_ids)={n}. Please use a smaller routed_experts_start_len."
            )
        return None

    def _answer(
        self, turn: Turn, body: dict[str, Any], headers: dict[str, str], rid: str, max_new: int, aborted: bool
    ) -> dict[str, Any]:
        input_ids: list[int] = body["input_ids"]
        ids = (
            list(turn.token_ids)
            if turn.token_ids is not None
            else self.tokenizer.encode(turn.text or "", add_special_tokens=False)
        )
        finish: dict[str, Any]
        if aborted or turn.finish == "abort":
            ids = ids[: max(0, min(len(ids) // 2, max_new))] if aborted else ids[:max_new]
            finish = {"type": "abort", "message": turn.abort_message if ids else "Abort before prefill"}
        elif turn.finish == "length" or len(ids) + (1 if turn.finish == "stop" else 0) > max_new:
            ids = ids[:max_new]
            finish = {"type": "length", "length": max_new}
        else:
            stop_id = self.end_of_turn_id if turn.stop_token_id is None else turn.stop_token_id
            ids = [*ids, stop_id]
            finish = {"type": "stop", "matched": stop_id}
        logprobs = (
            list(turn.logprobs)
            if turn.logprobs is not None
            else [_fake_logprob(t, i) for i, t in enumerate(ids)]
        )
        logprobs = (logprobs + [_fake_logprob(t, i) for i, t in enumerate(ids)])[: len(ids)]
        key = headers.get("x-smg-routing-key")
        with self._lock:
            previous = self._last_sequence.get(key, [])
            cached = _common_prefix(previous, input_ids)
            self._last_sequence[key] = input_ids + ids
            if ids:
                self.answers[rid] = (list(ids), list(logprobs))
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(ids),
            "cached_tokens": cached,
            "weight_version": turn.weight_version or self.weight_version,
            "e2e_latency": 0.001,
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(logprobs, ids, strict=True)],
        }
        if body.get("return_routed_experts") and self.routed_experts is not None:
            start = int(body.get("routed_experts_start_len") or 0)
            meta["routed_experts"] = _int32_b64(self._routing(input_ids + ids, start))
            if self.echo_routed_experts_start_len:
                meta["routed_experts_start_len"] = start
        custom = (body.get("sampling_params") or {}).get("custom_params") or {}
        if self.top_p_patch and ids and isinstance(custom, dict) and custom.get("return_top_p_token_ids"):
            kept, offsets = _top_p_spans(ids, len(input_ids))
            meta["top_p_token_ids"], meta["top_p_token_offsets"] = _int32_b64(kept), _int32_b64(offsets)
        if self.speculative_draft_tokens and ids:
            verify = (len(ids) + 1) // 2
            proposed = verify * (self.speculative_draft_tokens - 1)
            correct = len(ids) - verify
            meta.update(
                spec_accept_rate=correct / proposed,
                spec_accept_length=len(ids) / verify,
                spec_num_correct_drafts=correct,
                spec_num_proposed_drafts=proposed,
                spec_verify_ct=verify,
            )
        with self._lock:
            self.meta_infos[rid] = meta
        text = self.tokenizer.decode(
            ids,
            skip_special_tokens=bool((body.get("sampling_params") or {}).get("skip_special_tokens", True)),
        )
        return {"text": text, "output_ids": ids, "meta_info": meta}

    def _abort(self, body: dict[str, Any]) -> None:
        with self._lock:
            targets = list(self._in_flight) if body.get("abort_all") else [str(body.get("rid"))]
            for rid in targets:
                self.aborted_rids.append(rid)
                event = self._in_flight.get(rid)
                if event is not None:
                    event.set()

    def _routing(self, sequence: list[int], start: int) -> list[int]:
        """Routing of positions ``[start, len(sequence) - 1)``: a deterministic function of each position and its
        token (so the rows of a prefix are the same in every turn), every layer using several experts."""
        assert self.routed_experts is not None
        layers, topk = self.routed_experts
        return [
            (sequence[p] * 31 + p * 7 + layer * 13 + k * 5) % _NUM_EXPERTS
            for p in range(start, len(sequence) - 1)
            for layer in range(layers)
            for k in range(topk)
        ]


def _top_p_spans(output_ids: list[int], position: int) -> tuple[list[int], list[int]]:
    """Ragged kept ids per generated token: the token itself plus 0-2 others, offsets starting at 0."""
    kept: list[int] = []
    offsets = [0]
    for i, token in enumerate(output_ids):
        kept += [token, *((token + 1 + j) % 151643 for j in range((position + i) % 3))]
        offsets.append(len(kept))
    return kept, offsets


def _int32_b64(values: Sequence[int]) -> str:
    """SGLang's encoding of int32 arrays in meta_info (native little-endian int32, base64)."""
    return base64.b64encode(struct.pack(f"<{len(values)}i", *values)).decode()


def _error(message: str) -> dict[str, Any]:
    """The body of a 400 from /generate (``_create_error_response``)."""
    return {"error": {"message": message}}


def _contract_error(params: Any) -> dict[str, Any] | None:
    """SGLang's API-contract check of ``sampling_params`` (serde's texts)."""
    if not isinstance(params, dict):
        return {"error": "invalid type: sequence, expected struct SamplingParams"}
    for key, value in params.items():
        if key not in _SGLANG_SAMPLING_FIELDS:
            listed = ", ".join(f"`{f}`" for f in _SGLANG_SAMPLING_FIELDS)
            return {"error": f"unknown field `{key}`, expected one of {listed}"}
        if (
            key == "max_new_tokens"
            and value is not None
            and (isinstance(value, bool) or not isinstance(value, int))
        ):
            return {"error": f"invalid type: {_unexpected(value)}, expected i64"}
    max_new = params.get("max_new_tokens")
    if max_new is not None and max_new < 0:
        return _error(f"max_new_tokens must be at least 0, got {max_new}.")
    return None


def _unexpected(value: Any) -> str:
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    return type(value).__name__


def _fake_logprob(token_id: int, position: int) -> float:
    """Deterministic, realistic-looking logprobs (negative, varied) so tests can check alignment."""
    return -round(0.001 + ((token_id * 31 + position * 17) % 997) / 250.0, 6)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _hang_up(connection: socket.socket) -> None:
    """End a client connection both ways: its handler thread's next read returns at once."""
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_state: SGLangTestServer

    def setup(self) -> None:
        super().setup()
        state = self.server_state
        with state._lock:
            if state._connections is None:  # accepted as the server stopped
                _hang_up(self.connection)
            else:
                state._connections.add(self.connection)
        # Headers and body go out in separate writes: without TCP_NODELAY, Nagle + delayed ACK add ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def finish(self) -> None:
        state = self.server_state
        with state._lock:
            if state._connections is not None:
                state._connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else {}

    def _send(self, status: int, payload: Any) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self, body: Any) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        state = self.server_state
        with state._lock:
            state.requests.append(RecordedRequest(self.path, body, headers, time.time()))

    def _unavailable(self) -> bool:
        """Answer 503 while the server is still "loading" (``unavailable_s`` from its first request)."""
        state = self.server_state
        with state._lock:
            if state._available_at is None:
                state._available_at = time.monotonic() + state.unavailable_s
            available_at = state._available_at
        if time.monotonic() >= available_at:
            return False
        self._send(503, {"error": {"message": "Service Unavailable: the server is starting"}})
        return True

    def do_GET(self) -> None:
        self._record(None)
        state = self.server_state
        if self._unavailable():
            return
        if self.path in state.routes_missing:
            self._send(404, {"detail": "Not Found"})
        elif self.path == "/health":
            self._send(200, None)
        elif self.path in ("/model_info", "/get_model_info"):
            self._send(
                200,
                {"model_path": state.model_path, "tokenizer_path": state.model_path, "is_generation": True},
            )
        elif self.path in ("/server_info", "/get_server_info"):
            self._send(
                200,
                {
                    "context_length": state.context_length if state.context_length_flag else None,
                    "model_path": state.model_path,
                    "max_req_input_len": state.max_req_input_len,
                },
            )
        elif self.path == "/v1/models":
            card = {
                "id": state.model_path,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "sglang",
                "root": state.model_path,
                "parent": None,
            }
            if state.report_window:
                card["max_model_len"] = state.context_length
            self._send(200, {"object": "list", "data": [card]})
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        try:
            body = self._read_body()
        except ValueError:
            self._send(400, {"error": {"message": "invalid JSON body"}})
            return
        self._record(body)
        state = self.server_state
        if self._unavailable():
            return
        if self.path == "/generate":
            answer = state._generate(body, {k.lower(): v for k, v in self.headers.items()})
            if answer is None:  # injected dropped connection
                self.close_connection = True
                _hang_up(self.connection)
                return
            self._send(*answer)
        elif self.path == "/abort_request":
            state._abort(body)
            self._send(200, None)
        else:
            self._send(404, {"detail": "Not Found"})
