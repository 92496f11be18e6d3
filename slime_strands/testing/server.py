"""A local server speaking SGLang's native HTTP protocol, for tests and offline development.

Real HTTP on 127.0.0.1 (a free port, unless ``host`` / ``port`` say otherwise), answers scripted with a REAL tokenizer, and every request body and header,
and everything answered, recorded for assertions. Faults can be injected (error statuses, dropped connections,
slow answers).

It answers the way SGLang 0.5.23 does, from facts read in SGLang's source and in the real server's recorded
answers (``docs/sglang-0.5.23-answers``), never from this package's client, whose mistakes it must catch:

- the checks and their texts (:mod:`slime_strands.testing.sglang_checks`): the API contract's 400 for an unknown
  or mistyped sampling key (SGLang's own key list, not production's); the context checks, then the scheduler's
  (inputs of ``min(context - 1, kv_capacity - 1) - 5`` tokens or more are refused) and its silent clamp of
  ``max_new_tokens``; "Duplicate request ID detected" for a rid still being answered;
- the scripted tokens run through SGLang's stop rules: the request's stop strings and ``stop_token_ids`` AND the
  model's end ids (its ``generation_config``: e.g. Qwen3's ``<|endoftext|>`` as well as ``<|im_end|>``) end the
  output, stop token included, whatever the client asked; ``ignore_eos`` turns the token stops off;
- a waiting queue in front of a token pool, aborts matched by rid PREFIX, a client that hangs up aborted the same
  way (:mod:`slime_strands.testing.scheduler`); "Aborted" with the partial output and its logprobs for a running
  request, "Abort in waiting queue" with a sparse ``meta_info`` for a waiting one;
- the ``meta_info`` keys of the real answers (``weight_versions`` spans, ``cached_tokens`` and its details, ...);
  the window only in ``/v1/models`` (``/server_info`` says ``context_length: null`` unless started with
  ``--context-length``); MoE routing rows from ``routed_experts_start_len`` on, as base64 int32 (only when
  started with routed experts; the start is not echoed unless asked, as in 0.5.23); slime's top-p patch
  (``custom_params.return_top_p_token_ids`` -> ragged ``top_p_token_ids`` / ``top_p_token_offsets``);
  speculative-decoding stats.

Where the real server would do something a script cannot say (write on past a scripted stop token that does not
stop the request, crash on an input id outside the vocabulary), the stand-in does not answer kindly: it records a
failure and :meth:`SGLangTestServer.stop` raises :class:`SGLangTestServerError`, failing the test.

    with SGLangTestServer(tokenizer) as server:
        server.script(Turn("<tool_call>...</tool_call>"), Turn("Answer: 42"))
        model = SGLangModel(tokenizer=tokenizer, base_url=server.base_url)
"""

from __future__ import annotations

import base64
import collections
import contextlib
import json
import re
import socket
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from slime_strands.provider.images import Vision
from slime_strands.testing.scheduler import Phase, Scheduler, Ticket
from slime_strands.testing.sglang_checks import (
    context_error,
    contract_error,
    request_error,
    sampling_value_error,
)
from slime_strands.testing.sglang_images import ExpandedImages, expand_images

__all__ = ["Fault", "RecordedRequest", "SGLangTestServer", "SGLangTestServerError", "Turn"]

_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default when the request does not say
_NUM_EXPERTS = 128  # routed expert ids are in [0, _NUM_EXPERTS)
_SGLANG_DISCONNECT_CHECK_S = 4.0  # SGLANG_REQUEST_STATE_WAIT_TIMEOUT's default


class SGLangTestServerError(AssertionError):
    """The run met something the real server would not answer as scripted (see the message): the test fails."""


@dataclass
class Turn:
    """One scripted answer: what the model writes when the request runs.

    ``text`` is encoded with the server's tokenizer (or give ``token_ids``); the tokens run through SGLang's stop
    rules, so a stop string, a request stop token or one of the model's end ids among them ends the output there.

    ``finish="stop"``: the model writes the end-of-turn token (or ``stop_token_id``) after them; it must stop the
    request (be one of its ``stop_token_ids`` or the model's end ids, without ``ignore_eos``), else the real model
    would write on and the turn is a script error. ``"length"``: the model writes on; the request's
    ``max_new_tokens`` must cut the tokens (fewer tokens is a script error). ``"abort"``: the server aborts the
    request on its own after the tokens (e.g. a worker restarting). ``max_new_tokens`` is always enforced (a longer
    answer is cut and finishes with ``length``).

    ``delay_s`` holds the answer back, paused after ``pause_at`` tokens (default: half of them): an abort in the
    pause answers the tokens written so far, finishing ``abort`` / "Aborted".
    """

    text: str | None = None
    token_ids: Sequence[int] | None = None
    finish: str = "stop"
    delay_s: float = 0.0
    logprobs: Sequence[float] | None = None
    weight_version: str | None = None
    stop_token_id: int | None = None
    """Token that ends a ``stop`` finish (default: the end-of-turn token), e.g. ``<|endoftext|>``."""
    abort_message: str = "Aborted"
    """``finish_reason.message`` of an ``abort`` answer."""
    pause_at: int | None = None


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


@dataclass(frozen=True)
class _Generation:
    """What one running request writes: its output ids and ``finish_reason``."""

    ids: list[int]
    finish: dict[str, Any]


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
        eos_tokens: Sequence[str] | None = None,
        vocab_size: int | None = None,
        disconnect_check_s: float = _SGLANG_DISCONNECT_CHECK_S,
        routed_experts: tuple[int, int] | None = None,
        echo_routed_experts_start_len: bool = False,
        top_p_patch: bool = True,
        speculative_draft_tokens: int | None = None,
        unavailable_s: float = 0.0,
        report_window: bool = True,
        vision: Vision | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        """``kv_capacity``: SGLang's ``--max-total-tokens``, the token pool: it bounds a request (``max_req_len``)
        and running requests hold ``input + max_new_tokens`` of it while others wait in the queue (default: no
        pool, the context bounds a request); ``context_length_flag``: as if started with ``--context-length``
        (``/server_info`` reports it); ``end_of_turn``: the token(s) a ``stop`` Turn ends with; ``eos_tokens``: the
        model's ``generation_config`` end tokens, which always stop (default: ``end_of_turn`` and the tokenizer's
        eos; Qwen3: ``("<|im_end|>", "<|endoftext|>")``); ``vocab_size``: the model's embedding rows (default: the
        tokenizer's length), an input id outside it crashes the server; ``disconnect_check_s``: how often a
        waiting request's client is checked for a hang-up; ``routed_experts``: ``(layers, topk)`` as if started
        with ``--enable-return-routed-experts`` (None: the key is silently absent); ``top_p_patch``: slime's
        SGLang patch returning top-p token ids; ``speculative_draft_tokens``: as if started with EAGLE
        speculative decoding (spec stats in ``meta_info``); ``unavailable_s``: every route answers 503 for this
        long from the first request it gets (a router or an engine still loading when clients start: the clock
        starts with them, not with the test's set-up); ``report_window``: False leaves ``max_model_len`` out of
        ``/v1/models`` (a server that reports no window); ``vision``: a vision-language model's image tokens and
        processor: ``image_data`` is expanded as SGLang does (:mod:`slime_strands.testing.sglang_images`); ``host`` / ``port``: where to listen (port 0: a free
        one, see :attr:`port`)."""
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.kv_capacity = kv_capacity
        self.context_length_flag = context_length_flag
        self.model_path = model_path
        self.weight_version = weight_version
        self._set_end_ids(end_of_turn, eos_tokens)
        self.vocab_size = len(tokenizer) if vocab_size is None else vocab_size
        self.routed_experts = routed_experts
        self.echo_routed_experts_start_len = echo_routed_experts_start_len
        self.top_p_patch = top_p_patch
        self.speculative_draft_tokens = speculative_draft_tokens
        self.unavailable_s = unavailable_s
        self.report_window = report_window
        self.vision = vision
        self._address = (host, port)
        self._available_at: float | None = None
        self._init_records()
        self._init_serving(kv_capacity, disconnect_check_s)

    def _init_serving(self, kv_capacity: int | None, disconnect_check_s: float) -> None:
        """The state of serving: the scheduler, the scripted turns, the HTTP server and its connections."""
        self._scheduler = Scheduler(kv_capacity, disconnect_check_s)
        self._lock = threading.Lock()
        self._turns: dict[str | None, collections.deque[Turn | Fault]] = collections.defaultdict(
            collections.deque
        )
        self._last_sequence: dict[str | None, list[int]] = {}
        self.responder: Callable[[dict[str, Any], dict[str, str]], Turn | Fault] | None = None
        self.routes_missing: set[str] = set()
        """GET paths answered 404 (a router or an older server without them)."""
        self._crashed = False
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] | None = None
        """Open client connections while running: stop() closes them, as a server shutting down does, and
        joins their handler threads, so that none is left waiting for a next request on a keep-alive
        connection."""

    def _set_end_ids(self, end_of_turn: str | Sequence[str], eos_tokens: Sequence[str] | None) -> None:
        """The end-of-turn ids a ``stop`` Turn ends with (several for templates whose next role tag ends a turn:
        GLM's ``<|observation|>``, ``<|user|>``) and the model's end ids, which always stop."""
        tokens = [end_of_turn] if isinstance(end_of_turn, str) else list(end_of_turn)
        self.end_of_turn_ids = [self._token_id(t) for t in tokens]
        self.end_of_turn_id = self.end_of_turn_ids[0]
        if eos_tokens is not None:
            self.eos_token_ids = frozenset(self._token_id(t) for t in eos_tokens)
        else:
            eos = getattr(self.tokenizer, "eos_token_id", None)
            self.eos_token_ids = frozenset([*self.end_of_turn_ids, *([eos] if isinstance(eos, int) else [])])

    def _token_id(self, token: str) -> int:
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        unknown = getattr(self.tokenizer, "unk_token", None) != token and token_id == getattr(
            self.tokenizer, "unk_token_id", None
        )
        if not isinstance(token_id, int) or unknown:
            raise ValueError(f"{token!r} is not a token of this tokenizer")
        return token_id

    def _init_records(self) -> None:
        """What the server saw and answered, for the tests' assertions."""
        self.requests: list[RecordedRequest] = []
        self.aborted_rids: list[str] = []
        """rid named by each ``/abort_request`` (``abort_all``: every rid known at that moment)."""
        self.answers: dict[str, tuple[list[int], list[float]]] = {}
        """``rid`` -> (output_ids, logprobs) of every answer that carried tokens."""
        self.meta_infos: dict[str, dict[str, Any]] = {}
        """``rid`` -> the ``meta_info`` of every 200 answer, as sent."""
        self.failures: list[str] = []
        """What the real server would not have answered as scripted; :meth:`stop` raises when there is any."""

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> SGLangTestServer:
        if self._httpd is not None:
            raise RuntimeError("SGLangTestServer is already running: start() it or enter it, not both")
        handler = type("Handler", (_Handler,), {"server_state": self})
        self._httpd = _HTTPServer(self._address, handler)
        self._httpd.daemon_threads = False  # server_close() joins the handler threads
        self._connections = set()
        self._crashed = False
        self._scheduler.reopen()
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.02},  # stop() waits one poll: keep it short
            name="sglang-test-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (every request still open is aborted, every connection closed, every thread joined);
        raises :class:`SGLangTestServerError` if the run met a failure (see :attr:`failures`)."""
        if self._httpd is not None:
            self._scheduler.close()
            self._scheduler.wait_idle()  # every open request answered (aborted) before the connections close
            self._httpd.shutdown()
            self._hang_up_all()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.failures:
            failures, self.failures = self.failures, []
            raise SGLangTestServerError("; ".join(failures))

    def _hang_up_all(self) -> None:
        with self._lock:
            connections, self._connections = self._connections or set(), None
        for connection in connections:
            _hang_up(connection)

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
        host = self._address[0]
        return f"http://{'127.0.0.1' if host in ('', '0.0.0.0') else host}:{self.port}"

    # -- scripting and records --------------------------------------------------------------------

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
        """``rid`` of every ``/generate`` request known now (waiting or running): the ones an abort reaches (a
        request is recorded a moment before it is in flight)."""
        return self._scheduler.rids(Phase.WAITING, Phase.RUNNING)

    @property
    def waiting(self) -> list[str]:
        """``rid`` of every request waiting in the queue for room in the token pool, in queue order."""
        return self._scheduler.rids(Phase.WAITING)

    @property
    def running(self) -> list[str]:
        return self._scheduler.rids(Phase.RUNNING)

    @property
    def aborted_requests(self) -> list[str]:
        """``rid`` of every request an abort ended: by rid prefix, ``abort_all``, a client hang-up or stop()."""
        return list(self._scheduler.aborted)

    @property
    def disconnected_rids(self) -> list[str]:
        """``rid`` of every request whose client hung up before its answer (each was aborted, by prefix)."""
        return list(self._scheduler.disconnected)

    @property
    def generate_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == "/generate"]

    @property
    def max_req_len(self) -> int:
        """The scheduler's bound on input + output (tp_worker: ``min(context - 1, kv - 1)``)."""
        kv = self.context_length if self.kv_capacity is None else self.kv_capacity
        return min(self.context_length - 1, kv - 1)

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

    def _fail(self, message: str) -> tuple[int, Any]:
        """A script the real server would not follow: recorded (stop() raises) and answered with a 400 naming it."""
        with self._lock:
            self.failures.append(message)
        return 400, {"error": {"message": f"SGLangTestServer script error: {message}"}}

    # -- /generate --------------------------------------------------------------------------------

    def _generate(
        self, body: dict[str, Any], headers: dict[str, str], hung_up: Callable[[], bool]
    ) -> tuple[int, Any] | None:
        """The answer to one ``/generate`` (None: hang up without one)."""
        input_ids = body.get("input_ids")
        if input_ids is None and "text" not in body:
            return 400, _error("Either text, input_ids or input_embeds should be provided.")
        batch = any(isinstance(body.get(k), list) for k in ("rid", "sampling_params", "logprob_start_len"))
        if batch or not isinstance(input_ids, list) or not all(type(t) is int for t in input_ids):
            return 400, _error("SGLangTestServer supports single token-in requests only")
        if not input_ids:
            return 400, _error("input_ids cannot be empty.")
        if (contract := contract_error(body)) is not None:
            return 400, {"error": contract}
        expanded = expand_images(body, self.vision)
        if isinstance(expanded, str):
            return self._fail(expanded)
        if not isinstance(expanded, ExpandedImages):
            return expanded[0], _error(expanded[1])
        if expanded.image_tokens:  # from here on the request is what the model sees: the expanded prompt
            body = {**body, "input_ids": expanded.input_ids, "_image_tokens": expanded.image_tokens}
        rid = str(body.get("rid") or uuid.uuid4().hex)
        ticket = self._scheduler.register(rid, hung_up)
        if ticket is None:
            return 400, _error(f"Duplicate request ID detected: {rid}")
        try:
            return self._serve(ticket, body, headers)
        finally:
            self._scheduler.release(ticket)

    def _serve(self, ticket: Ticket, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any] | None:
        """A registered request: checked, queued, run, answered."""
        input_ids: list[int] = body["input_ids"]
        params = body.get("sampling_params") or {}
        error = (
            context_error(len(input_ids), params.get("max_new_tokens"), self.context_length)
            or sampling_value_error(params, self.vocab_size)
            or request_error(body, len(input_ids), self.max_req_input_len)
        )
        if error is not None:
            return 400, _error(error)
        requested = params.get("max_new_tokens")
        max_new = min(
            _DEFAULT_MAX_NEW_TOKENS if requested is None else requested,
            self.max_req_len - len(input_ids) - 1,  # the scheduler's silent clamp
        )
        self._scheduler.enqueue(ticket, len(input_ids) + max_new)
        if not self._scheduler.wait_to_run(ticket):
            return None if ticket.disconnected else (200, self._aborted_waiting(ticket, body))
        if min(input_ids) < 0 or max(input_ids) >= self.vocab_size:
            self._crash(input_ids)
            return None
        item = self._next(body, headers)
        if item.delay_s:
            self._scheduler.hold(ticket, item.delay_s)
        if ticket.disconnected:
            return None
        if isinstance(item, Fault):
            return None if item.drop_connection else (item.status or 500, item.body)
        return self._answer(item, ticket, body, headers, max_new)

    def _crash(self, input_ids: list[int]) -> None:
        """SGLang's scheduler hits an IndexError on an id outside the vocabulary and the whole server exits."""
        bad = next(t for t in input_ids if t < 0 or t >= self.vocab_size)
        with self._lock:
            self.failures.append(
                f"input id {bad} is outside the vocabulary ({self.vocab_size}): the real SGLang server crashes "
                "(IndexError in its scheduler) and exits; a client must never send one"
            )
            self._crashed = True
        self._scheduler.close()
        self._hang_up_all()

    def _answer(
        self, turn: Turn, ticket: Ticket, body: dict[str, Any], headers: dict[str, str], max_new: int
    ) -> tuple[int, Any]:
        params = body.get("sampling_params") or {}
        generated = self._generation(turn, params, max_new, aborted=ticket.phase is Phase.ABORTED_RUNNING)
        if isinstance(generated, str):
            return self._fail(generated)
        ids = generated.ids
        logprobs = list(turn.logprobs or [])[: len(ids)]
        logprobs += [_fake_logprob(t, i) for i, t in enumerate(ids)][len(logprobs) :]
        cached = self._cached(headers.get("x-smg-routing-key"), body, ids)
        meta = self._meta_info(turn, ticket, body, generated, logprobs, cached)
        with self._lock:
            if ids:
                self.answers[ticket.rid] = (list(ids), list(logprobs))
            self.meta_infos[ticket.rid] = meta
        return 200, {"text": self._text(generated, params), "output_ids": ids, "meta_info": meta}

    # -- what the model writes --------------------------------------------------------------------

    def _generation(
        self, turn: Turn, params: dict[str, Any], max_new: int, aborted: bool
    ) -> _Generation | str:
        """The turn's tokens through SGLang's stop rules (or a script error: what the real model would do next is
        unknown)."""
        tokens = (
            list(turn.token_ids)
            if turn.token_ids is not None
            else self.tokenizer.encode(turn.text or "", add_special_tokens=False)
        )
        stop_id = self.end_of_turn_id if turn.stop_token_id is None else turn.stop_token_id
        written = [*tokens, stop_id] if turn.finish == "stop" else tokens
        end, finish = self._first_stop(written, params, max_new)
        pause = len(tokens) // 2 if turn.pause_at is None else min(turn.pause_at, len(tokens))
        if aborted and pause < end:
            return _Generation(written[:pause], _abort_finish("Aborted"))
        if finish is not None:
            return _Generation(written[:end], finish)
        if turn.finish == "abort":
            return _Generation(written, _abort_finish(turn.abort_message))
        if turn.finish == "stop":
            return (
                f"the turn ends with token {stop_id} ({self.tokenizer.convert_ids_to_tokens(stop_id)!r}), which "
                f"does not stop this request (its stop_token_ids: {params.get('stop_token_ids')}, the model's end "
                f"ids: {sorted(self.eos_token_ids)}, ignore_eos: {bool(params.get('ignore_eos'))}): the real model "
                "would write on. Fix the request, or the server's eos_tokens / end_of_turn"
            )
        return (
            f"the turn finishes with {turn.finish!r} after {len(tokens)} tokens but the request allows {max_new}: "
            "the real model would write on. Script as many tokens as max_new_tokens, or finish='stop'"
        )

    def _first_stop(
        self, written: list[int], params: dict[str, Any], max_new: int
    ) -> tuple[int, dict[str, Any] | None]:
        """Where SGLang ends ``written`` (``update_finish_state``, per token: stop strings, then stop tokens and
        the model's end ids, then ``max_new_tokens``), and why; ``(len(written), None)`` if it does not."""
        stop_ids = (
            set()
            if params.get("ignore_eos")
            else {*(params.get("stop_token_ids") or ()), *self.eos_token_ids}
        )
        strings, patterns = _as_list(params.get("stop")), _as_list(params.get("stop_regex"))
        window = max((len(s) for s in [*strings, *patterns]), default=0) + 1
        if max_new == 0:
            return 0, {"type": "length", "length": 0}
        for i, token in enumerate(written):
            if strings or patterns:
                tail = self.tokenizer.decode(written[max(0, i + 1 - window) : i + 1])
                matched = next((s for s in strings if s in tail), None)
                matched = matched or next((p for p in patterns if re.search(p, tail)), None)
                if matched is not None:
                    return i + 1, {"type": "stop", "matched": matched}
            if token in stop_ids:
                return i + 1, {"type": "stop", "matched": token}
            if i + 1 >= max_new:
                return max_new, {"type": "length", "length": max_new}
        return len(written), None

    def _text(self, generated: _Generation, params: dict[str, Any]) -> str:
        """The detokenizer's text: the matched stop token or stop string trimmed unless ``no_stop_trim``."""
        keep = bool(params.get("no_stop_trim"))
        matched = generated.finish.get("matched")
        ids = generated.ids[:-1] if isinstance(matched, int) and generated.ids and not keep else generated.ids
        skip = params.get("skip_special_tokens")
        text = str(self.tokenizer.decode(ids, skip_special_tokens=True if skip is None else bool(skip)))
        if isinstance(matched, str) and (at := text.find(matched)) != -1:
            text = text[: at + len(matched)] if keep else text[:at]
        return text

    # -- meta_info --------------------------------------------------------------------------------

    def _cached(self, key: str | None, body: dict[str, Any], ids: list[int]) -> int:
        """The radix cache's hit, approximated by the last sequence of the routing key; SGLang matches at most
        ``len(input) - 1`` tokens, and no further than ``logprob_start_len`` when logprobs are asked."""
        input_ids: list[int] = body["input_ids"]
        with self._lock:
            previous = self._last_sequence.get(key, [])
            self._last_sequence[key] = input_ids + ids
        limit = len(input_ids) - 1
        start = body.get("logprob_start_len")
        if body.get("return_logprob") and start is not None and start >= 0:
            limit = min(limit, start)
        return max(0, min(_common_prefix(previous, input_ids), limit))

    def _meta_info(
        self,
        turn: Turn,
        ticket: Ticket,
        body: dict[str, Any],
        generated: _Generation,
        logprobs: list[float],
        cached: int,
    ) -> dict[str, Any]:
        """The keys of SGLang 0.5.23's answers, in its order."""
        ids, version = generated.ids, turn.weight_version or self.weight_version
        meta: dict[str, Any] = {
            "id": ticket.rid,
            "finish_reason": generated.finish,
            "prompt_tokens": len(body["input_ids"]),
            **({"image_tokens": body["_image_tokens"]} if "_image_tokens" in body else {}),
            "weight_version": version,
            "num_retractions": 0,
        }
        if body.get("return_logprob"):
            meta["input_token_logprobs"] = _input_logprobs(body["input_ids"], body.get("logprob_start_len"))
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(logprobs, ids, strict=True)]
            meta["output_token_logprobs_length"] = len(ids)
        meta.update(
            reasoning_tokens=0,
            completion_tokens=len(ids),
            cached_tokens=cached,
            weight_versions=[{"version": version, "start": 0, "end": len(ids)}],
            cached_tokens_details={"device": cached, "host": 0} if cached else None,
        )
        self._add_extras(meta, body, ids)
        meta.update(
            dp_rank=None,
            e2e_latency=time.monotonic() - ticket.arrived,
            response_sent_to_client_ts=time.time(),
        )
        return meta

    def _add_extras(self, meta: dict[str, Any], body: dict[str, Any], ids: list[int]) -> None:
        """Routed experts, slime's top-p patch and speculative-decoding stats, when the server has them."""
        input_ids: list[int] = body["input_ids"]
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

    def _aborted_waiting(self, ticket: Ticket, body: dict[str, Any]) -> dict[str, Any]:
        """The tokenizer manager's answer for a request aborted in the waiting queue: nothing written, and only
        the keys it builds itself (no ``prompt_tokens``, no ``cached_tokens``)."""
        meta: dict[str, Any] = {
            "id": ticket.rid,
            "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
            "weight_version": self.weight_version,
            "e2e_latency": time.monotonic() - ticket.arrived,
            "weight_versions": [{"version": self.weight_version, "start": 0, "end": 0}],
        }
        if body.get("return_logprob"):
            meta.update(input_token_logprobs=[], output_token_logprobs=[], output_token_logprobs_length=0)
        meta["completion_tokens"] = 0
        with self._lock:
            self.meta_infos[ticket.rid] = meta
        return {"text": "", "output_ids": [], "meta_info": meta}

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

    # -- other routes -----------------------------------------------------------------------------

    def _abort(self, body: dict[str, Any]) -> None:
        rid = None if body.get("abort_all") else str(body.get("rid") or "")
        if rid == "":
            return  # SGLang ignores an abort without a rid and without abort_all
        with self._lock:
            self.aborted_rids.extend(self.in_flight if rid is None else [rid])
        self._scheduler.abort(rid)

    def _get(self, path: str) -> tuple[int, Any]:
        if path in self.routes_missing:
            return 404, {"detail": "Not Found"}
        if path == "/health":
            return 200, None
        if path in ("/model_info", "/get_model_info"):
            return 200, {
                "model_path": self.model_path,
                "served_model_name": self.model_path,
                "tokenizer_path": self.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.weight_version,
            }
        if path in ("/server_info", "/get_server_info"):
            info = {
                "model_path": self.model_path,
                "context_length": self.context_length if self.context_length_flag else None,
                "max_req_input_len": self.max_req_input_len,
                "weight_version": self.weight_version,
            }
            if self.kv_capacity is not None:
                info["max_total_num_tokens"] = self.kv_capacity
            return 200, info
        if path == "/v1/models":
            card = {
                "id": self.model_path,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "sglang",
                "root": self.model_path,
                "parent": None,
            }
            if self.report_window:
                card["max_model_len"] = self.context_length
            return 200, {"object": "list", "data": [card]}
        if path == "/workers":
            # the router's worker list (sglang-router / SMG): slime's abort() aborts each worker it lists
            worker = {"url": self.base_url, "worker_type": "regular", "is_healthy": True}
            return 200, {"workers": [worker], "total": 1}
        return 404, {"detail": "Not Found"}


def _abort_finish(message: str) -> dict[str, Any]:
    return {"type": "abort", "message": message, "status_code": None, "err_type": None}


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [s for s in value if s]


def _input_logprobs(input_ids: list[int], start: int | None) -> list[list[Any]]:
    """Input-token logprobs from ``logprob_start_len`` on (none when it is not given); the first has none."""
    if start is None or start < 0:
        return []
    return [
        [None if p == start else _fake_logprob(input_ids[p], p), input_ids[p], None]
        for p in range(start, len(input_ids))
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


def _peer_closed(connection: socket.socket) -> bool:
    """True once the client closed the connection: a read would return end-of-file (nothing is consumed)."""
    try:
        return connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False  # open, nothing sent
    except OSError:
        return True  # reset


class _HTTPServer(ThreadingHTTPServer):
    """A client gone mid-connection (reset, or closed while it was answered: an interrupted eval) is not the
    server's error: the real server says nothing, and the demo server runs in the user's terminal, where the
    standard library's handler would print a traceback for each."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # reset, aborted, broken pipe
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_state: SGLangTestServer

    def setup(self) -> None:
        super().setup()
        state = self.server_state
        with state._lock:
            if state._connections is None or state._crashed:  # accepted as the server stopped or crashed
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
        with contextlib.suppress(OSError):  # the client may be gone
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else {}

    def _send(self, answer: tuple[int, Any] | None) -> None:
        """Send ``(status, payload)``; None, or a crashed server: hang up without an answer."""
        if answer is None or self.server_state._crashed:
            self.close_connection = True
            _hang_up(self.connection)
            return
        status, payload = answer
        data = b"" if payload is None else json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client hung up meanwhile
            self.close_connection = True

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
        self._send((503, {"error": {"message": "Service Unavailable: the server is starting"}}))
        return True

    def do_GET(self) -> None:
        self._record(None)
        if self._unavailable():
            return
        self._send(self.server_state._get(self.path))

    def do_POST(self) -> None:
        try:
            body = self._read_body()
        except ValueError:
            self._send((400, {"error": {"message": "invalid JSON body"}}))
            return
        self._record(body)
        state = self.server_state
        if self._unavailable():
            return
        if self.path == "/generate":
            headers = {k.lower(): v for k, v in self.headers.items()}
            connection = self.connection
            self._send(state._generate(body, headers, lambda: _peer_closed(connection)))
        elif self.path == "/abort_request":
            state._abort(body)
            self._send((200, None))
        else:
            self._send((404, {"detail": "Not Found"}))
