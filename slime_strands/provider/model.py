"""SGLangModel: a Strands Model provider that generates token-in/token-out through SGLang's /generate.

Per call: render only the new messages (tool results, user follow-ups) with the chat template, send the
whole token trajectory as ``input_ids``, append the server's ``output_ids`` verbatim (end-of-turn included)
with their logprobs, parse tool calls strictly from the decoded output and emit Strands events. The
:class:`~slime_strands.provider.token_manager.TokenManager` is the training record; ``agent.messages`` is only the
agent's view and is never re-rendered, except when context management rewrites it: :meth:`SGLangModel.start_segment`
then closes the trajectory so far and the next call renders the rewritten conversation as a new segment's prompt.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import logging
import time
import weakref
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from strands.hooks import BeforeToolCallEvent
from strands.models import BaseModelConfig, Model
from strands.types.content import Messages
from strands.types.exceptions import ContextWindowOverflowException
from strands.types.streaming import StreamEvent
from strands.types.tools import ToolSpec

from ..errors import SlimeStrandsError
from ..strict_reader import is_int
from ..template.messages import to_template_messages, to_template_tools
from ..template.probe import select_tool_parser
from ..template.render import ChatRenderer
from ..tool_parsers import AUTO, MalformedCall, ParseResult, ToolParser, ToolSchemas
from ..tool_parsers.base import ParseErrorKind
from .abort_signal import AbortSignal
from .checkpoint import ModelCheckpoint, PendingTurn
from .client import (
    SGLANG_CONTEXT_MARGIN,
    GenerateResult,
    RequestHandle,
    SGLangClient,
    SGLangContextLengthError,
    SGLangError,
    TokenIdsJSON,
)
from .model_stats import ModelStats, TurnCut
from .sampling import GRAMMAR_KEYS, SGLANG_SAMPLING_KEYS, check_sampling_keys, check_sampling_values
from .token_manager import TokenManager, TurnInfo
from .turn_events import (
    INVALID_TOOL_NAME,
    TurnPlan,
    format_stream_events,
    format_usage,
    plan_tool_calls,
)

__all__ = [
    "INVALID_TOOL_NAME",
    "SGLANG_SAMPLING_KEYS",
    "GenerationAbortedError",
    "ModelStats",
    "ResponseBudgetExhaustedError",
    "SGLangConfig",
    "SGLangModel",
    "TrajectoryError",
    "TurnCut",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")

_MIN_GENERATION_ROOM = 1
_MIN_TRUNCATED_TOOL_TOKENS = 32
_CHARS_PER_TOKEN_BOUND = 16
# Tokenizer and template work leaves the event loop; a small dedicated pool keeps it off the default executor.
_TOKENIZER_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="slime-strands-tokenizer")
# Small inputs stay on the loop: a thread hop (submit, wake-up, GIL hand-over) costs more than rendering and
# encoding a few KB; only LARGE inputs leave it (a 1 MB tool output must not stall the other agents).
_INLINE_CHARS = 32_768
"""Work on at most this many characters (about 8k tokens, ~2 ms of tokenizer time) runs on the loop."""


class SGLangConfig(BaseModelConfig, total=False):
    """Configuration of :class:`SGLangModel` (``update_config`` / ``get_config``); Strands' own
    ``context_window_limit`` mirrors ``context_length`` when that is set."""

    model_id: str | None
    params: dict[str, Any]
    """SGLang sampling params sent every turn (``max_new_tokens`` is the per-turn cap)."""
    context_length: int | None
    """Context window in tokens; None asks the server's model info once when a turn needs it."""
    max_response_tokens: int | None
    """Whole-trajectory budget of response tokens (generated + tool/template tokens after the prompt)."""
    max_tool_output_tokens: int | None
    """A tool result longer than this (tokens) is cut to head + tail with a marker."""
    max_calls_per_turn: int | None
    """Tool calls of one turn that run; the rest get one error result (a turn can write thousands)."""
    routing_key: str | None
    """Sent as ``X-SMG-Routing-Key`` so every turn of the trajectory hits one worker's prefix cache."""
    return_routed_experts: bool
    """Request MoE routing replay data every turn (slime's ``--use-rollout-routing-replay``); each turn asks
    only for the rows of positions after the previous turn's (``routed_experts_start_len``)."""
    abort_retries: int | None
    """Times a turn the server aborted on its own is sent again (see ``SGLangClient.generate``); None: as the
    client's retry policy says (``abort_resends``)."""
    abort_expected: Callable[[], bool] | None
    """True while the caller is aborting: an ``abort`` answer then ends the episode instead of a retry."""
    fit_tool_outputs: bool
    """Shrink tool outputs that do not fit the room left in the trajectory (default), or raise
    ``ContextWindowOverflowException`` so context management can start a segment that holds them whole."""
    reserved_tokens: int
    """Tokens every turn leaves free at the end of the room (context window and response budget alike): its
    new messages and its ``max_new_tokens`` stay within the rest. Context management keeps room for the
    summary request and the summary this way (default 0)."""
    min_turn_tokens: int
    """Fewest tokens a turn may be left to write, after its new messages and ``reserved_tokens``: less raises
    ``ContextWindowOverflowException`` (``ResponseBudgetExhaustedError`` for the response budget) before the
    request, and tool outputs are shrunk to leave it (default 1)."""


class TrajectoryError(SlimeStrandsError, RuntimeError):
    """The conversation can no longer be continued token-in/token-out (history edited, turn left open)."""


class ResponseBudgetExhaustedError(SlimeStrandsError, ContextWindowOverflowException, RuntimeError):
    """The whole-trajectory response budget leaves no room for another turn.

    A ``ContextWindowOverflowException`` for Strands: the agent hands it to its conversation manager, so
    context management can start a new segment (with a budget of its own) instead of ending the episode."""


class GenerationAbortedError(SlimeStrandsError, RuntimeError):
    """The server aborted the request (``finish_reason.type == "abort"``)."""


@dataclass(frozen=True)
class TurnBudget:
    """A turn's ``max_new_tokens`` (of a turn an abort cut: the whole turn's, its continuations included) and
    how a turn cut at that length ends the episode: the bound that set it."""

    max_new_tokens: int
    bound: TurnCut


class SGLangModel(Model):
    """Strands Model provider over SGLang's native API, recording an exact token trajectory.

    One instance per trajectory (it holds the trajectory); share the :class:`SGLangClient` instead.
    """

    def __init__(
        self,
        *,
        tokenizer: Any,
        client: SGLangClient | None = None,
        base_url: str | None = None,
        model_id: str | None = None,
        params: Mapping[str, Any] | None = None,
        sampling_params: Mapping[str, Any] | None = None,
        enable_thinking: bool | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tool_parser: ToolParser | str | None = AUTO,
        **config: Any,
    ) -> None:
        if client is None:
            if base_url is None:
                raise ValueError("SGLangModel needs a client= or a base_url=")
            client = SGLangClient(base_url)
        elif base_url is not None:
            raise ValueError("pass either client= or base_url=, not both")
        if params is not None and sampling_params is not None:
            raise ValueError("pass either params= or its alias sampling_params=, not both")
        self.client = client
        self.tokenizer = tokenizer
        self._renderer = ChatRenderer(
            tokenizer, enable_thinking=enable_thinking, template_kwargs=chat_template_kwargs
        )
        self.tool_parser = select_tool_parser(self._renderer, tool_parser)
        self.config: SGLangConfig = {
            "context_window_limit": None,
            "model_id": model_id,
            "params": {},
            "context_length": None,
            "max_response_tokens": None,
            "max_tool_output_tokens": None,
            "max_calls_per_turn": None,
            "routing_key": None,
            "return_routed_experts": False,
            "abort_retries": None,
            "abort_expected": None,
            "fit_tool_outputs": True,
            "reserved_tokens": 0,
            "min_turn_tokens": _MIN_GENERATION_ROOM,
        }
        self.update_config(params=dict(params if params is not None else sampling_params or {}), **config)
        self.token_manager = TokenManager()
        self._hooked_agents: weakref.WeakSet[Any] = weakref.WeakSet()
        self._tools_of: tuple[Any, list[dict[str, Any]] | None, ToolSchemas] | None = None
        self.reset()

    # -- Strands Model API ----------------------------------------------------------------------

    def update_config(self, **model_config: Any) -> None:
        unknown = set(model_config) - set(SGLangConfig.__annotations__)
        if unknown:
            raise ValueError(f"unknown SGLangModel config key(s): {sorted(unknown)}")
        if "params" in model_config:
            params = dict(model_config["params"] or {})
            check_sampling_keys(params, "SGLangModel sampling params")
            check_sampling_values(params, "SGLangModel sampling params")
            model_config["params"] = params
        if model_config.get("context_length") is not None:
            model_config["context_window_limit"] = model_config["context_length"]
        self.config.update(model_config)  # type: ignore[typeddict-item]

    def get_config(self) -> SGLangConfig:
        return self.config

    def structured_output(
        self, output_model: Any, prompt: Messages, system_prompt: str | None = None, **kwargs: Any
    ):  # type: ignore[override]
        raise NotImplementedError(
            "SGLangModel does not implement structured_output (not needed for RL rollouts)"
        )

    @property
    def enable_thinking(self) -> bool | None:
        return self._renderer.enable_thinking

    def reset(self) -> None:
        """Start a new episode: empty trajectory and counters."""
        self.token_manager.reset()
        self._trajectory_json = TokenIdsJSON()
        """``token_manager.token_ids`` as request JSON, extended with it: every token is serialised once."""
        self._trajectory_json_of: TokenManager | None = None
        self.stats = ModelStats()
        self._requests = RequestHandle()
        """The ids of this trajectory's request in flight (every attempt), for :meth:`abort`."""
        self._messages_seen = 0
        self._last_tool_ids: list[str] = []
        self._call_errors: dict[str, MalformedCall] = {}
        self._template_ids: dict[str, str] = {}
        self._pending: PendingTurn | None = None
        """A turn an abort cut after its input was appended: the next call with as many messages continues it."""

    # -- trajectory segments (context management, sub-agents) ---------------------------------

    def start_segment(self) -> TokenManager:
        """Close the trajectory so far and start an empty one; returns the closed one.

        For a history that was rewritten (compacted): the next call renders the whole conversation as the new
        segment's prompt, and token-in/token-out holds within each segment. Counters keep running.
        """
        closed = self.token_manager
        self.token_manager = TokenManager()
        self._messages_seen = 0
        self._pending = None  # a turn cut in the closed trajectory is not continued in the new one
        return closed

    def spawn(self) -> SGLangModel:
        """A model for a sub-agent: the same client, tokenizer, chat template settings, tool parser and config
        (sampling params, budgets, routing key, abort handling), with a trajectory and counters of its own."""
        # Not inherited: derived from context_length, and set by the sub-agent's own conversation manager.
        own = ("context_window_limit", "fit_tool_outputs", "reserved_tokens", "min_turn_tokens")
        config: dict[str, Any] = {k: v for k, v in self.config.items() if k not in own}
        return SGLangModel(
            tokenizer=self.tokenizer,
            client=self.client,
            chat_template_kwargs=self._renderer.template_kwargs,
            tool_parser=self.tool_parser,
            **config,
        )

    async def fill_ratio(self) -> float:
        """How full the current segment is: the larger of its tokens over the context window and its response
        tokens over the response budget (0.0 for what is not bounded)."""
        tm, ratios = self.token_manager, [0.0]
        context = await self._context_window()
        if context:
            ratios.append(len(tm) / context)
        budget = self.config["max_response_tokens"]
        if budget:
            ratios.append(tm.response_length / budget)
        return max(ratios)

    async def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` (special tokens kept), exactly as the tokenizer decodes them: inline when
        small, in the tokenizer pool when large (a 100k-token response must not stall the other agents)."""
        return await _offload(len(token_ids) * 4, self._renderer.decode, token_ids)  # ~4 characters a token

    @property
    def parse_errors(self) -> Counter[str]:
        """Malformed tool calls of this trajectory, by kind."""
        return self.stats.parse_errors

    async def stream(  # type: ignore[override]
        self,
        messages: Messages,
        tool_specs: list[ToolSpec] | None = None,
        system_prompt: str | None = None,
        *,
        invocation_state: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> AsyncGenerator[StreamEvent, None]:
        if system_prompt is None and kwargs.get("system_prompt_content"):
            system_prompt = "".join(b.get("text", "") for b in kwargs["system_prompt_content"]) or None
        entered = time.perf_counter()
        self._hook_agent((invocation_state or {}).get("agent"))
        tools, schemas = self._template_tools(tool_specs)

        tm = self.token_manager
        continued = self._continued_turn(messages)
        delta_ids, starts_in_reasoning = await self._render_input(messages, system_prompt, tools, continued)
        if self._trajectory_json_of is not tm or len(self._trajectory_json) != len(tm):
            # a new episode or segment (or a token manager changed behind our back): serialise it once
            self._trajectory_json = await _offload(len(tm) * 4, TokenIdsJSON, tm.token_ids)
            self._trajectory_json_of = tm
        delta_json = await _offload(len(delta_ids) * 4, TokenIdsJSON, delta_ids)

        so_far = _turn_so_far(tm) if continued is not None else []
        input_len = len(tm) + len(delta_ids)
        params = dict(self.config["params"])
        stop_ids = list(params.get("stop_token_ids") or [])
        params["stop_token_ids"] = stop_ids + [t for t in self._renderer.turn_end_ids if t not in stop_ids]

        started = time.perf_counter()
        result, cut = await self._send_turn(params, delta_json, len(delta_ids), continued, len(so_far))
        elapsed = time.perf_counter() - started
        if result.finish_reason == "abort" and any(params.get(key) is not None for key in GRAMMAR_KEYS):
            # SGLang applies a grammar to each request's output from its first token: a constrained turn cut
            # mid-generation cannot be continued inside its partial output (the continuation would write the
            # whole constrained text again); it is asked again from its input, with its whole budget
            result = dataclasses.replace(result, output_ids=[], logprobs=[])

        if delta_ids:
            tm.add_observation(delta_ids)
            self._trajectory_json.extend(delta_json)
        self._record_turn(result, elapsed, new_turn=continued is None)
        self.stats.last_cut = cut.bound if result.finish_reason == "length" else None
        self._trajectory_json.extend(result.output_ids)
        if result.finish_reason == "abort":
            self._pending = PendingTurn(len(messages), starts_in_reasoning, cut.max_new_tokens, cut.bound)
            raise GenerationAbortedError(result.finish_message or "the server aborted the request")
        self._pending = None
        self._messages_seen = len(messages) + 1  # + the assistant message the agent appends for this answer

        events = await self._turn_events(result, so_far, starts_in_reasoning, schemas, input_len, elapsed)
        self.stats.overhead_s += time.perf_counter() - entered - elapsed
        for event in events:
            yield event

    async def _render_input(
        self,
        messages: Messages,
        system_prompt: str | None,
        tools: list[dict[str, Any]] | None,
        continued: PendingTurn | None,
    ) -> tuple[list[int], bool]:
        """The turn's input: the prompt (added to the trajectory) on the first call, else the new messages'
        tokens (added once the server accepted them); whether the turn starts inside a reasoning block."""
        tm = self.token_manager
        if continued is not None:  # a turn an abort cut: its input is in the trajectory, partial output too
            return [], continued.starts_in_reasoning
        if len(tm) == 0:
            size = _content_chars(messages) + len(system_prompt or "") + len(json.dumps(tools or []))
            room = await self._room(prompt=True)
            prompt_text, prompt_ids = await _offload(
                size, self._render_initial, messages, system_prompt, tools, room
            )
            tm.add_prompt(prompt_ids)
            return [], self._renderer.opens_reasoning(prompt_text)
        prompt_text, delta_ids = await self._render_new_messages(messages, system_prompt, tools)
        return delta_ids, self._renderer.opens_reasoning(prompt_text)

    async def _turn_events(
        self,
        result: GenerateResult,
        so_far: list[int],
        starts_in_reasoning: bool,
        schemas: ToolSchemas,
        input_len: int,
        elapsed: float,
    ) -> list[StreamEvent]:
        """The finished turn (the part an abort cut, ``so_far``, and the answer) parsed into tool calls under
        the turn policy, as Strands' stream events."""
        output_ids = [*so_far, *result.output_ids]
        parsed = await _offload(
            len(output_ids) * 4,
            self._parse_output,
            output_ids,
            starts_in_reasoning,
            schemas,
            _matched_stop_token(result),
        )
        plan = plan_tool_calls(
            parsed,
            finish_reason=result.finish_reason,
            tool_names=schemas.keys(),
            max_calls_per_turn=self.config["max_calls_per_turn"],
        )
        self._record_plan(plan)
        usage = format_usage(input_len, len(output_ids), result.cached_tokens)
        return format_stream_events(parsed, plan, usage, int(elapsed * 1000))

    async def abort(self) -> None:
        """Abort this trajectory's request in flight, every attempt of it by its exact id (SGLang matches abort
        ids by prefix: a shared one would reach other trajectories' requests); until :meth:`reset`, no request
        is sent and a turn ends as aborted."""
        await self.client.abort(self._requests)

    async def _generate(self, *args: Any, **kwargs: Any) -> GenerateResult:
        """``client.generate`` for this trajectory. When ``abort_expected`` is an
        :class:`~slime_strands.provider.abort_signal.AbortSignal` (an episode's abort flag), the moment it holds
        the request is aborted by its exact ids (:meth:`abort`): the turn in flight ends at once with the tokens
        written so far, whether or not anyone aborts the whole server (slime does, but a router between may
        keep a request it sent late), and no attempt of it is sent after that."""
        signal = self.config["abort_expected"]
        if not isinstance(signal, AbortSignal):
            return await self.client.generate(*args, handle=self._requests, **kwargs)
        answer = asyncio.ensure_future(self.client.generate(*args, handle=self._requests, **kwargs))
        aborting = asyncio.ensure_future(signal.wait())
        try:
            await asyncio.wait({answer, aborting}, return_when=asyncio.FIRST_COMPLETED)
            if not answer.done():
                try:
                    await self.abort()
                except SGLangError as exc:  # slime's abort of every worker still ends it
                    logger.debug("slime-strands: aborting request(s) %s failed: %s", self._requests.rids, exc)
            return await answer
        finally:
            aborting.cancel()
            answer.cancel()

    async def _send_turn(
        self,
        params: dict[str, Any],
        delta_json: TokenIdsJSON,
        delta_len: int,
        continued: PendingTurn | None,
        spent: int,
    ) -> tuple[GenerateResult, TurnBudget]:
        """Send the turn sized to the budgets; returns the answer and the turn's budget (how a ``length`` finish
        of it ends the episode). A ``continued`` turn (an abort cut it after ``spent`` tokens) asks for the rest
        of the budget it was sent with; none left: it ends ``length`` without a request. A context refusal that
        names the window (the window was unknown: the server does not report it, or could not be asked)
        teaches it to the client: the turn is clamped and sent again (``context_resends`` of the client's retry
        policy: once); a prompt that cannot fit raises ``ContextWindowOverflowException``."""
        refusal: SGLangContextLengthError | None = None
        refusals = 0
        while True:
            if continued is None:
                budget = await self._turn_budget(delta_len)
            else:
                budget = await self._rest_of_turn(continued, spent)
            max_new_tokens = budget.max_new_tokens - spent
            if max_new_tokens < _MIN_GENERATION_ROOM:  # a continued turn the cut left no room: it ends here
                return GenerateResult(output_ids=[], logprobs=[], finish_reason="length"), budget
            if refusal is not None and max_new_tokens == params["max_new_tokens"]:
                # the refusal taught nothing new: the same request would be refused again
                raise ContextWindowOverflowException(str(refusal)) from refusal
            params["max_new_tokens"] = max_new_tokens
            try:
                result = await self._generate(
                    self._trajectory_json,
                    params,
                    input_ids_tail=delta_json,
                    routing_key=self.config["routing_key"],
                    return_routed_experts=self.config["return_routed_experts"],
                    routed_experts_start_len=_routing_rows_held(self.token_manager),
                    abort_retries=self.config["abort_retries"],
                    abort_expected=self.config["abort_expected"],
                )
            except SGLangContextLengthError as exc:
                if exc.window is None or refusals >= self.client.retry.context_resends:
                    raise ContextWindowOverflowException(str(exc)) from exc
                refusal, refusals = exc, refusals + 1
                logger.info("SGLang refused a turn of %d tokens (%s): sending it again", max_new_tokens, exc)
                continue
            # cut by `length` short of what was asked: the server clamped the turn to its window, silently
            applied = result.finish_length if result.finish_length is not None else len(result.output_ids)
            if result.finish_reason == "length" and applied < max_new_tokens:
                budget = TurnBudget(spent + applied, TurnCut.CONTEXT_FULL)
            return result, budget

    # -- rendering --------------------------------------------------------------------------------

    def _template_tools(
        self, tool_specs: list[ToolSpec] | None
    ) -> tuple[list[dict[str, Any]] | None, ToolSchemas]:
        """The template's tool list and the parser's schemas; the same objects while the specs are equal (Strands
        passes a fresh copy every call), so the renderer's cache keys them without serialising them again."""
        if self._tools_of is None or self._tools_of[0] != tool_specs:
            tools = to_template_tools(tool_specs)
            schemas: ToolSchemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools or []}
            self._tools_of = (tool_specs, tools, schemas)
        return self._tools_of[1], self._tools_of[2]

    def _render_initial(
        self,
        messages: Messages,
        system_prompt: str | None,
        tools: list[dict[str, Any]] | None,
        room: int | None,
    ) -> tuple[str, list[int]]:
        template_messages = to_template_messages(messages, tool_ids=self._template_ids)
        # A compacted history re-rendered as a new segment's prompt: its tool outputs as they were cut before,
        # and shrunk when they do not fit the new segment either.
        tool_msgs = [m for m in template_messages if m["role"] == "tool"]
        encoded = self._cut_to_limit(tool_msgs, count=False)
        if system_prompt:
            template_messages.insert(0, {"role": "system", "content": system_prompt})
        text = self._renderer.render(template_messages, tools=tools)
        ids = self._renderer.encode(text)
        if self._shrink_to_room(tool_msgs, encoded, len(ids), room):
            text = self._renderer.render(template_messages, tools=tools)
            ids = self._renderer.encode(text)
        return text, ids

    async def _render_new_messages(
        self, messages: Messages, system_prompt: str | None, tools: list[dict[str, Any]] | None
    ) -> tuple[str, list[int]]:
        """Tokens of the messages added since our last answer, tool outputs cut to fit the budgets."""
        seen = self._messages_seen
        if seen == 0 or len(messages) < seen or messages[seen - 1].get("role") != "assistant":
            raise TrajectoryError(
                "the conversation history changed since the last model call (trimmed or edited?); "
                "token-in/token-out needs an append-only history: use NullConversationManager, or call "
                "start_segment() after rewriting it (slime-strands' context_management does)"
            )
        new = messages[seen:]
        if not new:
            raise TrajectoryError("no new message since the last model call")
        if any(m.get("role") == "assistant" for m in new):
            raise TrajectoryError("an assistant message this model did not generate was added to the history")
        last = self.token_manager.last_span
        if last is None or last.kind != "generated" or last.info is None or last.info.finish_reason != "stop":
            raise TrajectoryError(
                "the previous turn did not finish with a stop (cut by max_tokens?): cannot continue"
            )
        # The continuation starts with the token that ends the assistant turn: the model's own stop token is
        # not repeated; a turn that stopped on another one (e.g. <|endoftext|>) is closed the template's way.
        template_messages = to_template_messages(
            new, tool_order=self._last_tool_ids, tool_ids=self._template_ids
        )
        room = await self._room()
        size = sum(len(str(m.get("content") or "")) for m in template_messages)
        return await _offload(
            size, self._fit_continuation, template_messages, system_prompt, tools, room, last.token_ids[-1]
        )

    def _fit_continuation(
        self,
        template_messages: list[dict[str, Any]],
        system_prompt: str | None,
        tools: list[dict[str, Any]] | None,
        room: int | None,
        after: int,
    ) -> tuple[str, list[int]]:
        tool_msgs = [m for m in template_messages if m["role"] == "tool"]
        encoded = self._cut_to_limit(tool_msgs)
        text, ids = self._renderer.encode_continuation(
            template_messages, system=system_prompt, tools=tools, after=after
        )
        if self._shrink_to_room(tool_msgs, encoded, len(ids), room):
            text, ids = self._renderer.encode_continuation(
                template_messages, system=system_prompt, tools=tools, after=after
            )
        return text, ids

    def _shrink_to_room(
        self, tool_msgs: list[dict[str, Any]], encoded: dict[int, list[int]], used: int, room: int | None
    ) -> bool:
        """With ``fit_tool_outputs``: shrink every tool output evenly so a render of ``used`` tokens that holds
        them leaves ``min_turn_tokens`` of ``room`` to generate; True when they were shrunk (render again)."""
        floor = self.config["min_turn_tokens"]
        if room is None or not tool_msgs or not self.config["fit_tool_outputs"] or used + floor <= room:
            return False
        for m in tool_msgs:
            if id(m) not in encoded:
                encoded[id(m)] = self._renderer.encode(m["content"])
        current = sum(len(encoded[id(m)]) for m in tool_msgs)
        per_tool = (current - (used + floor - room)) // len(tool_msgs)
        if per_tool < _MIN_TRUNCATED_TOOL_TOKENS:
            return False
        self._cut_tool_outputs(tool_msgs, encoded, per_tool)
        return True

    def _cut_to_limit(self, tool_msgs: list[dict[str, Any]], *, count: bool = True) -> dict[int, list[int]]:
        """Cut each tool output to ``max_tool_output_tokens`` (head + tail); returns the token ids it computed.

        An output is encoded on its own only when it may be too long (a token is at least one UTF-8 byte, so
        one of at most ``limit`` bytes fits): the continuation encodes it anyway.
        """
        limit = self.config["max_tool_output_tokens"]
        if (
            limit
        ):  # bound tokenizer work on huge outputs: no token survives beyond ~8 chars/token of head+tail
            for message in tool_msgs:
                message["content"] = _cut_chars(message["content"], limit * _CHARS_PER_TOKEN_BOUND)
        if not limit:
            return {}
        long = [m for m in tool_msgs if len(m["content"].encode()) > limit]
        encoded = {id(m): self._renderer.encode(m["content"]) for m in long}
        self._cut_tool_outputs(long, encoded, limit, count=count)
        return encoded

    def _cut_tool_outputs(
        self,
        tool_msgs: list[dict[str, Any]],
        encoded: dict[int, list[int]],
        limit: int,
        *,
        count: bool = True,
    ) -> None:
        for message in tool_msgs:
            ids = encoded[id(message)]
            if len(ids) <= limit:
                continue
            marker = "\n... [{} tokens of tool output truncated] ...\n"
            keep = max(limit - len(self._renderer.encode(marker.format(len(ids)))), 2)
            head, tail = ids[: keep - keep // 2], ids[len(ids) - keep // 2 :]
            dropped = len(ids) - len(head) - len(tail)
            message["content"] = (
                self._renderer.decode(head) + marker.format(dropped) + self._renderer.decode(tail)
            )
            encoded[id(message)] = self._renderer.encode(message["content"])
            self.stats.tool_outputs_truncated += count

    # -- budgets ---------------------------------------------------------------------------------

    async def _room(self, *, prompt: bool = False) -> int | None:
        """Tokens that may still be appended (observation + generation) short of ``reserved_tokens``, or None
        when unbounded; for a segment's ``prompt`` only the context window counts (the response budget does
        not count prompt tokens)."""
        rooms = []
        context = await self._context_window()
        if context is not None:
            rooms.append(context - len(self.token_manager))
        budget = self.config["max_response_tokens"]
        if budget is not None and not prompt:
            rooms.append(budget - self.token_manager.response_length)
        return min(rooms) - self.config["reserved_tokens"] if rooms else None

    async def context_window(self) -> int | None:
        """Tokens a trajectory segment may hold: the configured window, and the server's less the margin
        SGLang's scheduler keeps; None while neither is known."""
        return await self._context_window()

    async def _context_window(self) -> int | None:
        """Tokens the trajectory may hold: the configured window, and the server's less the margin SGLang's
        scheduler keeps (it refuses inputs a few tokens before its window is full)."""
        configured = self.config["context_length"] or self.config.get("context_window_limit")
        served = await self.client.context_length()
        limits = [configured, None if served is None else served - SGLANG_CONTEXT_MARGIN]
        known = [limit for limit in limits if limit is not None]
        return min(known) if known else None

    async def _turn_budget(self, delta_len: int) -> TurnBudget:
        """``max_new_tokens`` for this turn: the per-turn cap clamped to the context and response budgets, short
        of ``reserved_tokens``, and how a turn cut at that length ends the episode (the bound that set it; the
        cap on a tie)."""
        tm = self.token_manager
        cap = self.config["params"].get("max_new_tokens")
        reserved, floor = self.config["reserved_tokens"], self.config["min_turn_tokens"]
        context = await self._context_window()
        context_room = None if context is None else context - len(tm) - delta_len - reserved
        budget = self.config["max_response_tokens"]
        response_room = None if budget is None else budget - tm.response_length - delta_len - reserved
        kept = f" ({reserved} kept free, {floor} needed to write)"
        if (reserved, floor) == (0, _MIN_GENERATION_ROOM):
            kept = ""
        if context_room is not None and context_room < floor:
            raise ContextWindowOverflowException(
                f"the context window ({context} tokens) is full: the trajectory has {len(tm)} tokens and the new "
                f"messages {delta_len}{kept}"
            )
        if response_room is not None and response_room < floor:
            raise ResponseBudgetExhaustedError(
                f"the response budget ({budget} tokens) is spent: {tm.response_length} used, the new messages "
                f"need {delta_len}{kept}"
            )
        bounds = [
            (int(room), cut)
            for room, cut in (
                (cap, TurnCut.MAX_TOKENS),
                (context_room, TurnCut.CONTEXT_FULL),
                (response_room, TurnCut.RESPONSE_BUDGET),
            )
            if room is not None
        ]
        if not bounds:
            raise ValueError(
                "set params['max_new_tokens'], context_length or max_response_tokens: none is known"
            )
        return TurnBudget(*min(bounds, key=lambda bound: bound[0]))

    async def _rest_of_turn(self, turn: PendingTurn, spent: int) -> TurnBudget:
        """The budget of a turn an abort cut after ``spent`` tokens: the one it was sent with (the rooms have
        not moved: they hold the cut turn's input and output), clamped to a window learned since."""
        context = await self._context_window()
        if context is not None and context - len(self.token_manager) < turn.max_new_tokens - spent:
            return TurnBudget(spent + max(0, context - len(self.token_manager)), TurnCut.CONTEXT_FULL)
        return TurnBudget(turn.max_new_tokens, turn.bound)

    # -- output -----------------------------------------------------------------------------------

    def _record_turn(self, result: GenerateResult, elapsed: float, *, new_turn: bool = True) -> None:
        """Append the answer (one generated segment) and count it; a continued turn is not a new turn."""
        info = TurnInfo(
            finish_reason=result.finish_reason,
            prompt_tokens=result.prompt_tokens,
            cached_tokens=result.cached_tokens,
            weight_version=result.weight_version,
            rid=result.rid,
            meta_info=result.meta_info,
        )
        if result.output_ids:
            self.token_manager.add_generation(result.output_ids, result.logprobs, info)
        stats = self.stats
        stats.turns += new_turn
        stats.generation_time_s += elapsed
        stats.prompt_tokens += result.prompt_tokens or 0
        stats.cached_tokens += result.cached_tokens or 0
        stats.last_finish_reason = result.finish_reason

    def _parse_output(
        self, output_ids: Sequence[int], starts_in_reasoning: bool, schemas: ToolSchemas, ended_on: int | None
    ) -> ParseResult:
        text = self._renderer.decode(self._renderer.without_stop_token(output_ids, ended_on))
        return self.tool_parser.parse(text, starts_in_reasoning=starts_in_reasoning, tools=schemas)

    def _record_plan(self, plan: TurnPlan) -> None:
        """Keep what later turns need (errors for the hook, call order, the model's call ids) and count."""
        self._last_tool_ids = [p.tool_use_id for p in plan.calls]
        self._call_errors.update(plan.errors)
        self._template_ids.update(plan.template_ids)
        self.stats.parse_errors.update(plan.error_kinds)
        self.stats.tool_calls_parsed += len(plan.valid)

    # -- partial rollout: a turn cut by an abort, and the state a checkpoint saves -------------------

    @property
    def pending_turn(self) -> PendingTurn | None:
        """The turn an abort cut after its input was appended (its partial output too): the next call, made
        with the messages it rendered, continues it."""
        return self._pending

    def _continued_turn(self, messages: Messages) -> PendingTurn | None:
        """The pending turn this call continues (called with the messages the cut call rendered), or None."""
        pending = self._pending
        if pending is None:
            return None
        if len(messages) != pending.messages:
            raise TrajectoryError(
                f"an abort cut the turn whose input had {pending.messages} messages; it must be continued with "
                f"them (got {len(messages)}): rebuild the agent on the checkpoint's conversation"
            )
        return pending

    def checkpoint_state(self) -> ModelCheckpoint:
        """What the model knows between turns besides its trajectory (see ``slime_strands.agent.resume``)."""
        return ModelCheckpoint(
            messages_seen=self._messages_seen,
            pending=self._pending,
            last_tool_ids=tuple(self._last_tool_ids),
            call_errors={k: (e.kind, e.message, e.raw, e.name) for k, e in self._call_errors.items()},
            template_ids=dict(self._template_ids),
            counters=copy.deepcopy(self.stats),
        )

    def restore_state(self, trajectory: TokenManager, state: ModelCheckpoint) -> None:
        """Continue from a checkpoint: ``trajectory`` (rebuilt from it) is the current segment."""
        self.reset()
        self.token_manager = trajectory
        self._messages_seen = state.messages_seen
        self._pending = state.pending
        self._last_tool_ids = list(state.last_tool_ids)
        self._call_errors = {
            k: MalformedCall(kind=cast(ParseErrorKind, kind), message=message, raw=raw, name=name)
            for k, (kind, message, raw, name) in state.call_errors.items()
        }
        self._template_ids = dict(state.template_ids)
        self.stats = copy.deepcopy(state.counters)

    # -- malformed calls reach the model as tool errors ----------------------------------------

    def _hook_agent(self, agent: Any) -> None:
        """Give malformed calls an error result that says what was wrong (Strands would run them with ``{}``)."""
        if agent is None or agent in self._hooked_agents or not hasattr(agent, "add_hook"):
            return
        agent.add_hook(self._on_before_tool_call, BeforeToolCallEvent)
        self._hooked_agents.add(agent)

    def _on_before_tool_call(self, event: BeforeToolCallEvent) -> None:
        error = self._call_errors.get(str(event.tool_use.get("toolUseId")))
        if error is not None:
            event.cancel_tool = f"Error: invalid tool call ({error.kind}): {error.message}"


def _turn_so_far(tm: TokenManager) -> list[int]:
    """Output a continued turn already has: the generated spans the trajectory ends with."""
    spans = tm.spans
    start = len(spans)
    while start and spans[start - 1].kind == "generated":
        start -= 1
    return [t for s in spans[start:] for t in s.token_ids]


def _routing_rows_held(tm: TokenManager) -> int:
    """Positions whose routed-expert rows the trajectory's answers already carry: every one before the last
    token of the last answer that brought rows (an answer an abort cut may bring none)."""
    for span in reversed(tm.spans):
        if span.kind == "generated" and span.info is not None and "routed_experts" in span.info.meta_info:
            return span.end - 1
    return 0


def _matched_stop_token(result: GenerateResult) -> int | None:
    """The token id a ``stop`` finish reports it matched (SGLang's ``finish_reason.matched``; a stop STRING
    is not a token): the token that ended the turn, whichever stop set it came from."""
    finish = result.meta_info.get("finish_reason") if result.finish_reason == "stop" else None
    matched = finish.get("matched") if isinstance(finish, dict) else None
    return matched if is_int(matched) else None


def _cut_chars(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return (
        f"{text[:half]}\n... [{len(text) - 2 * half} characters of tool output truncated] ...\n{text[-half:]}"
    )


async def _offload(size: int, fn: Callable[..., T], *args: Any) -> T:
    """Run tokenizer / template / parsing work on ``size`` characters: off the event loop when it is large."""
    if size <= _INLINE_CHARS:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(_TOKENIZER_POOL, fn, *args)


def _content_chars(messages: Messages) -> int:
    """Characters of text in Strands messages (text blocks and tool results), to size tokenizer work."""
    total = 0
    for message in messages:
        for block in message.get("content") or []:
            if "text" in block:
                total += len(block["text"])
            elif "toolResult" in block:
                total += sum(
                    len(str(part.get("text") or part.get("json") or ""))
                    for part in block["toolResult"].get("content") or []
                )
    return total
