"""SGLangModel: a Strands Model provider that generates token-in/token-out through SGLang's /generate.

The model is the Strands translation: per call it renders only the new messages (tool results, user
follow-ups) with the chat template, sends the whole token trajectory as ``input_ids``, appends the server's
``output_ids`` verbatim (end-of-turn included) with their logprobs, parses tool calls strictly from the decoded
output and emits Strands events. Each concern is a collaborator with a name:

* :class:`~slime_strands.provider.turn_input.InputRenderer`: the turn's input tokens (the prompt, then only the
  new messages), tool outputs cut by a :class:`~slime_strands.provider.tool_output.ToolOutputFitter`;
* :class:`~slime_strands.provider.budgets.TurnBudgets`: the turn's ``max_new_tokens`` from the context window,
  the response budget and the per-turn cap;
* :func:`~slime_strands.provider.sampling.turn_params`: the turn's sampling params (every turn-end token a stop);
* :class:`~slime_strands.provider.turn_requests.TurnRequests`: the trajectory as request JSON, its attempts in
  flight, aborted by their exact ids the moment the episode's ``abort_signal`` holds;
* :class:`~slime_strands.provider.turn_state.TurnState`: what the model knows between turns, which a
  partial-rollout checkpoint saves and restores (:meth:`SGLangModel.checkpoint_state` / ``restore_state``);
* :class:`~slime_strands.provider.malformed_calls.MalformedCallHook`: the Strands hook giving a malformed call
  its error result.

The :class:`~slime_strands.provider.token_manager.TokenManager` is the training record; ``agent.messages`` is
only the agent's view and is never re-rendered, except when context management rewrites it:
:meth:`SGLangModel.start_segment` then closes the trajectory so far and the next call renders the rewritten
conversation as a new segment's prompt.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any

from strands.models import BaseModelConfig, Model
from strands.types.content import Messages
from strands.types.exceptions import ContextWindowOverflowException
from strands.types.streaming import StreamEvent
from strands.types.tools import ToolSpec

from ..errors import SlimeStrandsError
from ..strict_reader import is_int
from ..template.probe import select_tool_parser
from ..template.render import ChatRenderer
from ..tool_parsers import AUTO, ToolParser, ToolSchemas
from .budgets import MIN_GENERATION_ROOM, ResponseBudgetExhaustedError, TurnBudget, TurnBudgets
from .checkpoint import ModelCheckpoint, PendingTurn
from .client import GenerateResult, SGLangClient, SGLangContextLengthError, TokenIdsJSON
from .images import TrajectoryImage, Vision
from .malformed_calls import MalformedCallHook
from .model_stats import ModelStats, TurnCut
from .offload import offload
from .sampling import GRAMMAR_KEYS, SGLANG_SAMPLING_KEYS, checked_params, turn_params
from .token_manager import TokenManager, TurnInfo, collapse_images
from .tool_output import ToolOutputFitter
from .turn_events import INVALID_TOOL_NAME, format_stream_events, format_usage, plan_tool_calls
from .turn_input import InputRenderer
from .turn_requests import TurnRequests
from .turn_state import TrajectoryError, TurnState

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

_OLDER_CONFIG_NAMES = {"abort_expected": "abort_signal"}
"""Config keys users wrote before they were renamed (one name per idea), and their names now."""


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
    abort_signal: Callable[[], bool] | None
    """True while the caller is aborting (an episode's abort flag): an ``abort`` answer then ends the episode
    instead of a resend, and an :class:`~slime_strands.provider.abort_signal.AbortSignal` aborts the turn in
    flight the moment it holds. ``abort_expected`` is its older name."""
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


class GenerationAbortedError(SlimeStrandsError, RuntimeError):
    """The server aborted the request (``finish_reason.type == "abort"``)."""


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
        vision: Vision | None = None,
        **config: Any,
    ) -> None:
        """``vision``: a vision-language model's image tokens and processor
        (:func:`~slime_strands.provider.images.load_vision`): image content blocks then reach the server as
        ``image_data`` with one pad each in ``input_ids``, expanded in the trajectory as the server expands them."""
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
        if vision is not None:  # the template must show images, one placeholder each, incrementally
            self._renderer.check_images(self._renderer.token_text(vision.image_token_id))
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
            "abort_signal": None,
            "fit_tool_outputs": True,
            "reserved_tokens": 0,
            "min_turn_tokens": MIN_GENERATION_ROOM,
        }
        self.update_config(params=dict(params if params is not None else sampling_params or {}), **config)
        self._budgets = TurnBudgets(self.config, client)
        self.vision = vision
        self._stop_ids = (*self._renderer.turn_end_ids, *sorted(vision.vision_ids if vision else ()))
        """Every turn stops on these: the template's turn ends, and a vision model's image tokens (see
        :meth:`~slime_strands.provider.images.Vision.generated_vision_id`)."""
        self._input = InputRenderer(
            self._renderer, ToolOutputFitter(self._renderer, self.config), self._budgets, vision
        )
        self._requests = TurnRequests(client)
        self._hook = MalformedCallHook(lambda tool_use_id: self._state.error_of(tool_use_id))
        self.token_manager = TokenManager()
        self.reset()

    # -- Strands Model API ----------------------------------------------------------------------

    def update_config(self, **model_config: Any) -> None:
        for old, new in _OLDER_CONFIG_NAMES.items():
            if old in model_config:
                if new in model_config:
                    raise ValueError(f"pass {new} (or its older name {old}), not both")
                model_config[new] = model_config.pop(old)
        unknown = set(model_config) - set(SGLangConfig.__annotations__)
        if unknown:
            raise ValueError(f"unknown SGLangModel config key(s): {sorted(unknown)}")
        if "params" in model_config:
            model_config["params"] = checked_params(model_config["params"], "SGLangModel sampling params")
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
        self._requests.reset()
        self.stats = ModelStats()
        self._state = TurnState()

    # -- trajectory segments (context management, sub-agents) ---------------------------------

    def start_segment(self) -> TokenManager:
        """Close the trajectory so far and start an empty one; returns the closed one.

        For a history that was rewritten (compacted): the next call renders the whole conversation as the new
        segment's prompt, and token-in/token-out holds within each segment. Counters keep running.
        """
        closed = self.token_manager
        self.token_manager = TokenManager()
        self._state.messages_seen = 0
        self._state.pending = None  # a turn cut in the closed trajectory is not continued in the new one
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
            vision=self.vision,
            **config,
        )

    async def fill_ratio(self) -> float:
        """How full the current segment is: the larger of its tokens over the context window and its response
        tokens over the response budget (0.0 for what is not bounded)."""
        return await self._budgets.fill_ratio(self.token_manager)

    async def context_window(self) -> int | None:
        """Tokens a trajectory segment may hold: the configured window, and the server's less the margin
        SGLang's scheduler keeps; None while neither is known."""
        return await self._budgets.context_window()

    async def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` (special tokens kept), exactly as the tokenizer decodes them: inline when
        small, in the tokenizer pool when large (a 100k-token response must not stall the other agents)."""
        return await offload(len(token_ids) * 4, self._renderer.decode, token_ids)  # ~4 characters a token

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
        self._hook.attach((invocation_state or {}).get("agent"))
        tools, schemas = self._input.template_tools(tool_specs)
        tm, state = self.token_manager, self._state
        continued = state.continued_turn(messages)
        delta_ids, images, starts_in_reasoning = await self._input.render(
            tm, state, self.stats, messages, system_prompt, tools, continued
        )
        await self._requests.follow(tm)
        wire = collapse_images(delta_ids, images) if images else delta_ids
        delta_json = await offload(len(wire) * 4, TokenIdsJSON, wire)
        so_far = _turn_so_far(tm) if continued is not None else []
        input_len = len(tm) + len(delta_ids)
        params = turn_params(self.config["params"], self._stop_ids)

        started = time.perf_counter()
        result, cut = await self._send_turn(
            params,
            delta_json,
            len(delta_ids),
            continued,
            len(so_far),
            [p.image for p in (*tm.images, *images)],
        )
        elapsed = time.perf_counter() - started
        if delta_ids:
            tm.add_observation(delta_ids, images)
            self._requests.extend(delta_json)
        if result.finish_reason == "abort":
            self._cut_by_abort(result, params, elapsed, continued, len(messages), starts_in_reasoning, cut)
        self._record_answer(result, elapsed, new_turn=continued is None)
        self.stats.last_cut = cut.bound if result.finish_reason == "length" else None
        state.answered(messages)

        events = await self._turn_events(result, so_far, starts_in_reasoning, schemas, input_len, elapsed)
        self.stats.overhead_s += time.perf_counter() - entered - elapsed
        for event in events:
            yield event

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
        parsed = await offload(
            len(output_ids) * 4, self._parse, output_ids, starts_in_reasoning, schemas, result
        )
        plan = plan_tool_calls(
            parsed,
            finish_reason=result.finish_reason,
            tool_names=schemas.keys(),
            max_calls_per_turn=self.config["max_calls_per_turn"],
        )
        self._state.planned(plan, self.stats)
        usage = format_usage(input_len, len(output_ids), result.cached_tokens)
        return format_stream_events(parsed, plan, usage, int(elapsed * 1000))

    def _parse(
        self,
        output_ids: Sequence[int],
        starts_in_reasoning: bool,
        schemas: ToolSchemas,
        result: GenerateResult,
    ) -> Any:
        text = self._renderer.decode(
            self._renderer.without_stop_token(output_ids, _matched_stop_token(result))
        )
        return self.tool_parser.parse(text, starts_in_reasoning=starts_in_reasoning, tools=schemas)

    def _record_answer(self, result: GenerateResult, elapsed: float, *, new_turn: bool) -> None:
        """Append the answer (one generated span) and count it; a continued turn is not a new turn."""
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
            written = self.vision.generated_vision_id(result.output_ids) if self.vision else None
            if written is not None:
                raise TrajectoryError(
                    f"the model wrote {self._renderer.token_text(written)!r} (id {written}), an image token with "
                    "no image behind it: neither SGLang nor slime's VLM trainer can take the trajectory, so the "
                    "episode fails (its sample masked, left out of its group)"
                )
        self._requests.extend(result.output_ids)
        stats = self.stats
        stats.turns += new_turn
        stats.generation_time_s += elapsed
        stats.prompt_tokens += result.prompt_tokens or 0
        stats.cached_tokens += result.cached_tokens or 0
        stats.last_finish_reason = result.finish_reason

    # -- aborts -----------------------------------------------------------------------------------

    async def abort(self) -> None:
        """Abort this trajectory's request in flight, every attempt of it by its exact id (SGLang matches abort
        ids by prefix: a shared one would reach other trajectories' requests); until :meth:`reset`, no request
        is sent and a turn ends as aborted."""
        await self._requests.abort()

    def _cut_by_abort(
        self,
        result: GenerateResult,
        params: Mapping[str, Any],
        elapsed: float,
        continued: PendingTurn | None,
        messages: int,
        starts_in_reasoning: bool,
        cut: TurnBudget,
    ) -> None:
        """Keep what an aborted turn wrote and the turn pending (the next call with ``messages`` messages
        continues it), then raise :class:`GenerationAbortedError`."""
        if any(params.get(key) is not None for key in GRAMMAR_KEYS):
            # SGLang applies a grammar to each request's output from its first token: a constrained turn cut
            # mid-generation cannot be continued inside its partial output (the continuation would write the
            # whole constrained text again); it is asked again from its input, with its whole budget
            result = dataclasses.replace(result, output_ids=[], logprobs=[])
        self._record_answer(result, elapsed, new_turn=continued is None)
        self.stats.last_cut = None
        self._state.pending = PendingTurn(messages, starts_in_reasoning, cut.max_new_tokens, cut.bound)
        raise GenerationAbortedError(result.finish_message or "the server aborted the request")

    async def _send_turn(
        self,
        params: dict[str, Any],
        delta_json: TokenIdsJSON,
        delta_len: int,
        continued: PendingTurn | None,
        spent: int,
        images: Sequence[TrajectoryImage],
    ) -> tuple[GenerateResult, TurnBudget]:
        """Send the turn sized to the budgets; returns the answer and the turn's budget (how a ``length`` finish
        of it ends the episode). A ``continued`` turn (an abort cut it after ``spent`` tokens) asks for the rest
        of the budget it was sent with; none left: it ends ``length`` without a request. A context refusal that
        names the window (the window was unknown: the server does not report it, or could not be asked)
        teaches it to the client: the turn is clamped and sent again (``context_resends`` of the client's retry
        policy: once); a prompt that cannot fit raises ``ContextWindowOverflowException``. ``images``: every image
        of the trajectory and the turn's input, sent as ``image_data``."""
        tm, refusal, refusals = self.token_manager, None, 0
        while True:
            if continued is None:
                budget = await self._budgets.for_turn(tm, delta_len)
            else:
                budget = await self._budgets.rest_of_turn(tm, continued, spent)
            max_new_tokens = budget.max_new_tokens - spent
            if max_new_tokens < MIN_GENERATION_ROOM:  # a continued turn the cut left no room: it ends here
                return GenerateResult(output_ids=[], logprobs=[], finish_reason="length"), budget
            if refusal is not None and max_new_tokens == params["max_new_tokens"]:
                # the refusal taught nothing new: the same request would be refused again
                raise ContextWindowOverflowException(str(refusal)) from refusal
            params["max_new_tokens"] = max_new_tokens
            try:
                result = await self._requests.generate(
                    params,
                    delta_json,
                    abort_signal=self.config["abort_signal"],
                    routing_key=self.config["routing_key"],
                    return_routed_experts=self.config["return_routed_experts"],
                    routed_experts_start_len=_routing_rows_held(tm),
                    abort_retries=self.config["abort_retries"],
                    image_data=[image.data_uri for image in images],
                    image_tokens=sum(image.tokens - 1 for image in images),
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

    # -- partial rollout: a turn cut by an abort, and the state a checkpoint saves -------------------

    @property
    def pending_turn(self) -> PendingTurn | None:
        """The turn an abort cut after its input was appended (its partial output too): the next call, made
        with the messages it rendered, continues it."""
        return self._state.pending

    def checkpoint_state(self) -> ModelCheckpoint:
        """What the model knows between turns besides its trajectory (see ``slime_strands.agent.resume``)."""
        return self._state.checkpoint(self.stats)

    def restore_state(self, trajectory: TokenManager, state: ModelCheckpoint) -> None:
        """Continue from a checkpoint: ``trajectory`` (rebuilt from it) is the current segment."""
        self.reset()
        self.token_manager = trajectory
        self._state = TurnState.restored(state)
        self.stats = copy.deepcopy(state.counters)


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
