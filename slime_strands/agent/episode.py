"""One agent episode, token-in/token-out, without slime: build it, run it, summarise it as an EpisodeRecord.

:func:`run_episode` needs only a tokenizer, an :class:`SGLangClient`, the plugin settings, the tools and an
:class:`EpisodeSpec`; slime's ``generate`` (``slime_strands.rollout``) and a standalone evaluator use it alike.
Per episode it builds an :class:`SGLangModel`, a Strands ``Agent`` (its conversation manager is
``NullConversationManager``, or a :class:`~slime_strands.agent.compaction.ContextCompactor` under
``context_management``), a :class:`ToolLimiter` and (when given) a stop condition, runs the agent and
classifies how it ended into a :class:`Termination`. The record lists the episode's trajectory segments
(one, unless the history was compacted or sub-agents were collected: see ``slime_strands.agent.segment_collector``).
Per-episode failures become a FAILED record; a :class:`~slime_strands.errors.ConfigurationError` (no sample
can succeed) and cancellation propagate.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strands import Agent
from strands.agent.conversation_manager import NullConversationManager
from strands.hooks import AfterToolCallEvent, AfterToolsEvent, BeforeToolsEvent, HookProvider, HookRegistry
from strands.middleware import ExecuteToolStage
from strands.types.exceptions import ContextWindowOverflowException, MaxTokensReachedException

from ..errors import ConfigurationError, InputError
from ..mcp_tools import McpServerError, McpToolbox
from ..provider.abort_signal import AbortSignal
from ..provider.checkpoint import MalformedCheckpointError
from ..provider.client import SGLangClient, SGLangError
from ..provider.images import Vision, image_block
from ..provider.model import (
    INVALID_TOOL_NAME,
    GenerationAbortedError,
    ResponseBudgetExhaustedError,
    SGLangModel,
)
from ..provider.sampling import merge_sampling_params
from ..provider.token_manager import TokenManager
from ..settings import DEFAULT_TOOL_ROUNDS_PER_INVOCATION, PluginSettings
from .checkpoint import EpisodeCheckpoint
from .compaction import ContextCompactor
from .history import AgentHistory
from .limits import StopWhen, ToolLimiter
from .pacing import InvocationPacer
from .record import EpisodeRecord, SegmentRecord, Termination
from .resume import AbortGuard, capture, restore
from .runtime import import_tools, raise_gc_threshold
from .segment_collector import COLLECTOR_KEY, SegmentCollector
from .tracing import use_recording_only_tracer

__all__ = ["EpisodeSpec", "build_agent", "run_agent", "run_episode"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodeSpec:
    """What one episode needs beyond the shared tokenizer, client, settings and tools."""

    prompt: str | Sequence[Mapping[str, Any]]
    """The task: a user message, or chat messages (optional system first, the user last)."""
    sampling_params: Mapping[str, Any]
    """SGLang sampling params (``max_new_tokens`` caps each turn); the settings' ``sampling_params`` go on top
    (``slime_strands.provider.sampling``). ``None`` values mean SGLang's default; a key SGLang does not accept stops
    the run (``SamplingParamError``, a configuration error), never dropped."""
    max_response_tokens: int | None = None
    """Budget of ALL response tokens (generated and tool/template tokens after the prompt), per trajectory
    segment (one slime sample) when ``context_management`` compacts the history."""
    max_context_tokens: int | None = None
    """Most tokens the trajectory (each segment) may hold (the server's window, less SGLang's margin, bounds
    it too)."""
    evaluation: bool = False
    routing_key: str | None = None
    """Sent as ``X-SMG-Routing-Key``: every turn of the episode hits one worker's prefix cache."""
    return_routed_experts: bool = False
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    model_id: str | None = None


async def run_episode(
    tokenizer: Any,
    client: SGLangClient,
    settings: PluginSettings,
    spec: EpisodeSpec,
    *,
    tools: Sequence[Any] | None = None,
    abort_signal: Callable[[], bool] | None = None,
    hooks: Sequence[HookProvider] = (),
    resume: EpisodeCheckpoint | None = None,
    keep_checkpoint: bool = True,
    should_stop: Callable[[], bool] | None = None,
    vision: Vision | None = None,
    mcp: McpToolbox | None = None,
) -> EpisodeRecord:
    """Run one episode and return its record (trajectory included); never raises except for configuration
    errors and cancellation. ``tools`` default to importing ``settings.tools`` (a Runtime imports them once).
    ``abort_signal()`` (slime's abort flag; an :class:`~slime_strands.provider.abort_signal.AbortSignal` shares one
    poller between episodes; ``should_stop`` is its older name) is checked between turns and before tools, and
    stops running tool calls; when it holds, an ``abort`` answer from the server ends the episode ABORTED instead
    of being retried, and the record's ``checkpoint`` says how to continue it (``keep_checkpoint`` false: none
    is captured, for an episode nobody will continue). ``resume`` continues such an episode (one that cannot be
    restored starts again from the prompt, with a warning). ``hooks`` are added to the agent after
    slime-strands' own (observers: metrics, benchmarks). ``vision``: a vision-language model's image processor
    (images in the prompt and in tool results then reach the model). ``mcp``: the MCP servers' tools join
    ``tools``, an episode-scope server started for this episode and stopped when it ends (``slime_strands.mcp_tools``;
    one that does not start fails this episode)."""
    started = time.perf_counter()
    raise_gc_threshold(settings)
    if tools is None:
        tools = import_tools(settings)
    abort = _as_abort_signal(abort_signal, should_stop)
    stopped = abort is not None and abort()
    if stopped and resume is None:
        return EpisodeRecord(Termination.ABORTED, evaluation=spec.evaluation)
    if not mcp or stopped:  # aborted before it goes on: no turn, no tool, no server to start
        record = await _play(
            tokenizer, client, settings, spec, tools, abort, hooks, vision, resume, stopped, keep_checkpoint
        )
    else:
        try:  # the episode's MCP sessions live exactly as long as this block, however it ends
            async with mcp.episode(images=vision is not None) as mcp_tools:
                record = await _play(
                    tokenizer,
                    client,
                    settings,
                    spec,
                    [*tools, *mcp_tools],
                    abort,
                    hooks,
                    vision,
                    resume,
                    stopped,
                    keep_checkpoint,
                )
        except McpServerError as exc:  # its episode-scope server did not start: this episode only
            record = _failed(spec, exc)
    return dataclasses.replace(record, wall_time_s=time.perf_counter() - started)


async def _play(
    tokenizer: Any,
    client: SGLangClient,
    settings: PluginSettings,
    spec: EpisodeSpec,
    tools: Sequence[Any],
    abort: AbortSignal | None,
    hooks: Sequence[HookProvider],
    vision: Vision | None,
    resume: EpisodeCheckpoint | None,
    stopped: bool,
    keep_checkpoint: bool,
) -> EpisodeRecord:
    """Build the episode (restored from ``resume`` when given), run it and summarise it."""
    try:
        episode = _build(tokenizer, client, settings, spec, tools, abort, hooks, vision)
        if resume is not None and not _resumed(episode, resume, going_on=not stopped):
            if stopped:  # nothing to keep: the next step starts it from its prompt
                return EpisodeRecord(Termination.ABORTED, evaluation=spec.evaluation)
            episode = _build(tokenizer, client, settings, spec, tools, abort, hooks, vision)
    except ConfigurationError:
        raise
    except Exception as exc:  # bad sample data (prompt shape): this episode only
        return _failed(spec, exc)
    # aborted before it went on: an episode to continue is written (and saved) as its checkpoint left it
    termination, error = (Termination.ABORTED, None) if stopped else await _run(episode, settings)
    return await _summarize(episode, spec, termination, error, keep_checkpoint=keep_checkpoint)


def _as_abort_signal(
    abort_signal: Callable[[], bool] | None, should_stop: Callable[[], bool] | None
) -> AbortSignal | None:
    """The episode's abort flag (given under its name, or its older one ``should_stop``) as an AbortSignal."""
    if should_stop is not None:
        if abort_signal is not None:
            raise ValueError("pass abort_signal (or its older name should_stop), not both")
        abort_signal = should_stop
    if abort_signal is None or isinstance(abort_signal, AbortSignal):
        return abort_signal
    return AbortSignal(abort_signal)


def _resumed(episode: _Episode, checkpoint: EpisodeCheckpoint, *, going_on: bool) -> bool:
    """Whether ``episode`` (freshly built) now continues from ``checkpoint``; false (with a warning) when the
    checkpoint does not restore: the episode must be built again from the prompt. ``going_on``: false when
    slime aborted before it went on (it is no continuation: its counts stay)."""
    try:
        restore(
            checkpoint,
            model=episode.model,
            agent=episode.agent,
            limiter=episode.limiter,
            tool_time=episode.tool_stats,
            segments=episode.segments,
            compactor=episode.compactor,
        )
    except ConfigurationError:
        raise
    except (MalformedCheckpointError, ValueError) as exc:
        logger.warning("slime-strands: the episode's checkpoint does not restore (%s): it starts again", exc)
        return False
    episode.prompt = None  # the conversation is there: the agent goes on from its last message
    episode.continuations = checkpoint.continuations + going_on
    episode.turns_saved = checkpoint.turns_saved + (checkpoint.turns if going_on else 0)
    return True


# -- build -------------------------------------------------------------------------------------------


@dataclass
class _Episode:
    model: SGLangModel
    agent: Agent
    prompt: Any
    limiter: ToolLimiter
    guard: AbortGuard | None
    tool_stats: _ToolStats
    segments: SegmentCollector
    compactor: ContextCompactor | None = None
    continuations: int = 0
    turns_saved: int = 0


def _build(
    tokenizer: Any,
    client: SGLangClient,
    settings: PluginSettings,
    spec: EpisodeSpec,
    tools: Sequence[Any],
    abort_signal: AbortSignal | None,
    hooks: Sequence[HookProvider],
    vision: Vision | None = None,
) -> _Episode:
    system_prompt, history, prompt = _split_prompt(spec.prompt, settings.system_prompt)
    template_kwargs: dict[str, Any] = {}
    if settings.enable_thinking is not None:
        template_kwargs["enable_thinking"] = settings.enable_thinking
    template_kwargs.update(spec.chat_template_kwargs)  # the sample's own kwargs win
    model = SGLangModel(
        tokenizer=tokenizer,
        client=client,
        model_id=spec.model_id,
        params=merge_sampling_params(
            spec.sampling_params, settings.sampling_params, training=not spec.evaluation
        ),
        chat_template_kwargs=template_kwargs,
        tool_parser=settings.tool_parser,
        context_length=spec.max_context_tokens,
        max_response_tokens=spec.max_response_tokens,
        max_tool_output_tokens=settings.max_tool_output_tokens,
        max_calls_per_turn=settings.max_calls_per_turn,
        routing_key=spec.routing_key,
        return_routed_experts=spec.return_routed_experts,
        abort_retries=settings.server_abort_retries,
        abort_signal=abort_signal,
        vision=vision,
    )
    limiter = ToolLimiter(max_tool_iters=settings.max_tool_iters, max_tool_calls=settings.max_tool_calls)
    tool_stats = _ToolStats()
    guard = AbortGuard(abort_signal, limiter, tool_stats) if abort_signal is not None else None
    segments = SegmentCollector(collect_subagents=settings.collect_subagents)
    manager: NullConversationManager | ContextCompactor = NullConversationManager()
    compactor = None
    if settings.context_management != "none":
        manager = compactor = ContextCompactor(
            settings.context_management,
            settings.compaction,
            segments,
            pinned=len(history) + 1,  # the sample's prompt messages: the task is never compacted away
            abort_signal=abort_signal,
        )
    agent = build_agent(
        model,
        tools=tools,
        # the guard first: it notes the tool counters before the limiter counts a batch
        hooks=[*(h for h in (guard, limiter, tool_stats) if h is not None), *hooks],
        system_prompt=system_prompt,
        messages=history,
        conversation_manager=manager,
    )
    if guard is not None:
        agent.add_middleware(ExecuteToolStage, guard.kill_on_abort)
    return _Episode(model, agent, prompt, limiter, guard, tool_stats, segments, compactor)


def build_agent(
    model: Any,
    *,
    tools: Sequence[Any],
    hooks: Sequence[HookProvider] = (),
    system_prompt: str | None = None,
    messages: Sequence[Mapping[str, Any]] | None = None,
    conversation_manager: Any = None,
) -> Agent:
    """A Strands ``Agent`` as slime-strands runs one (episodes, sub-agents, ``slime-strands eval``): no
    callback handler, ``NullConversationManager`` unless given one, and Strands' tracer building its message
    payloads only for spans that record them (``slime_strands.agent.tracing``: the same spans and events whenever
    OpenTelemetry records), and the history an :class:`AgentHistory` (Strands deep-copies it twice a model
    call: in C instead of Python)."""
    use_recording_only_tracer()
    return Agent(
        model=model,
        tools=list(tools),
        hooks=list(hooks),
        system_prompt=system_prompt,
        messages=AgentHistory(messages or []),
        callback_handler=None,
        conversation_manager=conversation_manager or NullConversationManager(),
    )


def _split_prompt(prompt: Any, default_system: str) -> tuple[str | None, list[dict[str, Any]], Any]:
    """(system prompt, earlier messages, last user turn) from a string or a list of chat messages."""
    if isinstance(prompt, str):
        return default_system or None, [], prompt
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise ValueError(
            f"the prompt must be a string or a non-empty list of messages, got {type(prompt).__name__}"
        )
    system = default_system or None
    messages = list(prompt)
    if messages[0].get("role") == "system":
        system = _text(messages.pop(0).get("content"))
    if not messages or messages[-1].get("role") != "user":
        raise ValueError("the prompt's last message must come from the user")
    history = []
    for message in messages[:-1]:
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise ValueError(f"unsupported role {role!r} in the prompt")
        history.append({"role": role, "content": _blocks(message.get("content"))})
    return system, history, _blocks(messages[-1].get("content"))


def _blocks(content: Any) -> list[dict[str, Any]]:
    """A chat message's content as Strands content blocks: its text, and each image part (slime's
    ``{"type": "image", "image": <data URI, base64 or absolute path>}``, what ``--multimodal-keys`` makes of a
    dataset's ``<image>`` placeholders, with its ``min_pixels`` / ``max_pixels`` when the data gives them) as an
    image block, in order. A part the agent cannot show (a video, an ``image_url``) is an InputError naming it:
    dropped, the prompt would silently lose what the data gave."""
    kind = next(filter(None, map(_unshown, content)), None) if isinstance(content, list) else None
    if kind is not None:
        raise InputError(
            f"a prompt part of type {kind!r} cannot be shown to the model (videos and image URLs are not "
            "supported): give images as data URIs, base64 or absolute paths, or drop the part"
        )
    if not isinstance(content, list) or not any(_is_image(part) for part in content):
        return [{"text": _text(content)}]
    blocks: list[dict[str, Any]] = []
    for part in content:
        if _is_image(part):
            bounds = {key: part[key] for key in ("min_pixels", "max_pixels") if part.get(key) is not None}
            blocks.append({"image": image_block(part["image"], **bounds)})
        elif isinstance(part, dict) and part.get("text"):
            blocks.append({"text": str(part["text"])})
    return blocks


_UNSHOWN = frozenset({"video", "image_url", "video_url", "audio"})
"""Content part types (and keys) of OpenAI / slime prompts that no Strands block here carries."""


def _unshown(part: Any) -> str | None:
    """The kind of a content part no block here carries (its ``type``, else its key), or None."""
    if not isinstance(part, dict) or "image" in part or "text" in part:
        return None
    kind = part.get("type")
    return kind if kind in _UNSHOWN else next(iter(sorted(_UNSHOWN & set(part))), None)


def _is_image(part: Any) -> bool:
    return isinstance(part, dict) and "image" in part


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI-style content parts
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


# -- run ---------------------------------------------------------------------------------------------


async def _run(episode: _Episode, settings: PluginSettings) -> tuple[Termination, str | None]:
    return await run_agent(
        episode.agent,
        episode.prompt,
        limiter=episode.limiter,
        guard=episode.guard,
        invocation_state={COLLECTOR_KEY: episode.segments},
        tool_rounds_per_invocation=settings.tool_rounds_per_invocation,
    )


async def run_agent(
    agent: Agent,
    prompt: Any,
    *,
    limiter: ToolLimiter,
    guard: StopWhen | None = None,
    invocation_state: dict[str, Any] | None = None,
    tool_rounds_per_invocation: int | None = DEFAULT_TOOL_ROUNDS_PER_INVOCATION,
) -> tuple[Termination, str | None]:
    """Run ``agent`` on ``prompt`` to its end and say how it ended (with the error of a FAILED end); used for
    the episode's agent and for sub-agents. Configuration errors and cancellation propagate.

    Every ``tool_rounds_per_invocation`` tool rounds the agent is invoked again with no prompt and the same
    ``invocation_state`` (``slime_strands.agent.pacing``: Strands' nesting grows with each round of an invocation);
    ``None`` runs the whole loop as one invocation."""
    pacer = None
    if tool_rounds_per_invocation is not None:
        pacer = InvocationPacer(tool_rounds_per_invocation)
        agent.hooks.add_hook(pacer)
    state: dict[str, Any] = {} if invocation_state is None else invocation_state  # one for every invocation
    try:
        result = await agent.invoke_async(prompt, invocation_state=state)
        while pacer is not None and pacer.resumes(result.stop_reason):
            result = await agent.invoke_async(None, invocation_state=state)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        termination, error = _classify(exc)
        if termination is Termination.MAX_TOKENS and isinstance(agent.model, SGLangModel):
            # Strands says only "max_tokens": the model knows which bound cut the turn
            cut = agent.model.stats.last_cut
            termination = termination if cut is None else Termination(cut.value)
        return termination, error
    finally:
        if pacer is not None:
            pacer.finish()
        agent.cleanup()
    if guard is not None and guard.triggered:
        return Termination.ABORTED, None
    if limiter.limit_reached:
        return Termination.TOOL_LIMIT, None
    return Termination.END_TURN, None


def _classify(exc: BaseException) -> tuple[Termination, str | None]:
    """Map what ended the agent loop to a Termination, walking Strands' exception wrapping. A configuration
    error anywhere in the chain is re-raised: it would end every episode the same way."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConfigurationError):
            raise current
        if isinstance(current, GenerationAbortedError):
            return Termination.ABORTED, str(current)
        if isinstance(current, ResponseBudgetExhaustedError):
            return Termination.RESPONSE_BUDGET, None
        if isinstance(current, MaxTokensReachedException):
            return Termination.MAX_TOKENS, None
        if isinstance(current, ContextWindowOverflowException):
            return Termination.CONTEXT_FULL, None
        if isinstance(current, SGLangError):
            return Termination.FAILED, f"{type(current).__name__}: {current}"
        current = current.__cause__ or current.__context__
    return Termination.FAILED, f"{type(exc).__name__}: {exc}"


# -- summarise ---------------------------------------------------------------------------------------


async def _summarize(
    episode: _Episode,
    spec: EpisodeSpec,
    termination: Termination,
    error: str | None,
    *,
    keep_checkpoint: bool,
) -> EpisodeRecord:
    model = episode.model
    segments = await _decoded(episode.segments.finish(model.token_manager, termination), model)
    if not segments and termination not in (Termination.ABORTED, Termination.FAILED):
        # Nothing generated (the prompt alone fills the context): slime cannot train on an empty response.
        termination, error = Termination.FAILED, f"no token generated ({termination.value})"
    stats = [model.stats, *episode.segments.subagent_stats]
    parse_errors: Counter[str] = Counter()
    for s in stats:
        parse_errors.update(s.parse_errors)
    last = segments[-1] if segments else None  # the main agent's last segment: its answer is the response
    messages = tuple(episode.agent.messages)  # before a checkpoint's capture cuts what a cancel appended
    return EpisodeRecord(
        termination,
        evaluation=spec.evaluation,
        error=error,
        turns=sum(s.turns for s in stats),
        tool_iters=episode.limiter.tool_iter_count,
        tool_calls=episode.limiter.tool_call_count,
        tool_errors=episode.tool_stats.errors,
        parse_errors=parse_errors,
        tool_time_s=episode.tool_stats.seconds,
        generation_time_s=model.stats.generation_time_s,
        client_overhead_s=model.stats.overhead_s,
        prompt_tokens=sum(s.prompt_tokens for s in stats),
        cached_tokens=sum(s.cached_tokens for s in stats),
        tool_outputs_truncated=sum(s.tool_outputs_truncated for s in stats),
        response_tokens=sum(s.response_length for s in segments),
        generated_tokens=sum(s.generated_tokens for s in segments),
        segments=segments,
        final_turn_chars=None if last is None else last.final_turn_chars,
        trajectory=model.token_manager if last is None else last.trajectory,
        response="" if last is None else last.response,
        system_prompt=episode.agent.system_prompt,
        messages=messages,
        continuations=episode.continuations,
        turns_saved=episode.turns_saved,
        checkpoint=_checkpoint(episode, termination) if keep_checkpoint else None,
    )


def _checkpoint(episode: _Episode, termination: Termination) -> EpisodeCheckpoint | None:
    """What an episode slime aborted needs to continue (None for any other end)."""
    if termination is not Termination.ABORTED or episode.guard is None:
        return None
    return capture(
        model=episode.model,
        agent=episode.agent,
        guard=episode.guard,
        segments=episode.segments,
        compactor=episode.compactor,
        continuations=episode.continuations,
        turns_saved=episode.turns_saved,
    )


async def _decoded(segments: list[SegmentRecord], model: SGLangModel) -> list[SegmentRecord]:
    """Each segment with its decoded response and the length of its last generated turn."""
    out = []
    for segment in segments:
        assert segment.trajectory is not None
        response, chars = await _decode_response(segment.trajectory, model)
        out.append(dataclasses.replace(segment, response=response, final_turn_chars=chars))
    return out


async def _decode_response(tm: TokenManager, model: SGLangModel) -> tuple[str, int | None]:
    """The response text (special tokens kept) and the length of its last assistant turn, so rewards grade
    only the final answer (never tool output or earlier turns) without knowing the chat template."""
    ids = tm.token_ids
    response = await model.decode(ids[tm.prompt_length :])
    spans = tm.spans
    ends = [i for i, s in enumerate(spans) if s.kind == "generated"]
    if not ends:
        return response, None
    first = ends[-1]  # the last turn: the run of generated spans it ends (a continued turn has several)
    while first > 0 and spans[first - 1].kind == "generated":
        first -= 1
    # Decoded on its own, not cut out of ``response``: where the turn starts inside a multi-byte
    # character, or a decoder treats the first token specially, the two differ and no length is given.
    tail = await model.decode(ids[spans[first].start :])
    return response, (len(tail) if tail and response.endswith(tail) else None)


def _failed(spec: EpisodeSpec, exc: Exception) -> EpisodeRecord:
    logger.warning("slime-strands: episode failed before its first turn: %s: %s", type(exc).__name__, exc)
    return EpisodeRecord(Termination.FAILED, evaluation=spec.evaluation, error=f"{type(exc).__name__}: {exc}")


class _ToolStats(HookProvider):
    """Strands hook: wall time of tool batches and failed tool results (malformed calls counted elsewhere)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.errors = 0
        self._started: float | None = None

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeToolsEvent, self._before)
        registry.add_callback(AfterToolsEvent, self._after)
        registry.add_callback(AfterToolCallEvent, self._after_call)

    def _before(self, event: BeforeToolsEvent) -> None:
        self._started = time.perf_counter()

    def _after(self, event: AfterToolsEvent) -> None:
        if self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None

    def _after_call(self, event: AfterToolCallEvent) -> None:
        if event.cancel_message is not None or event.tool_use.get("name") == INVALID_TOOL_NAME:
            return  # limits, aborts and malformed calls are not tool failures
        if (event.result or {}).get("status") == "error":
            self.errors += 1
