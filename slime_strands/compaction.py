"""Context management for long-horizon episodes: compact the history, start a new trajectory segment.

Token-in/token-out needs an append-only history, so a rewrite of ``agent.messages`` cannot continue the
trajectory: :class:`ContextCompactor` closes the current segment and the model renders the rewritten
conversation as the next segment's prompt (masked: it is the prompt of a new sample). Every segment is exact
token-in/token-out on its own; :class:`~slime_strands.segments.EpisodeSegments` collects them.

It is a Strands ``ConversationManager`` equivalent to Strands' own ``SummarizingConversationManager`` /
``SlidingWindowConversationManager`` (it reuses Strands' stream processing and summary message), with the timing
token-in/token-out needs. Strands' summarizer runs from the synchronous ``reduce_context``, through
``run_async`` (a second event loop in a thread, blocking the episode's loop, where the client's connection
pool does not live), and its proactive trigger estimates tokens from characters. This one runs:

* **Before a model call** (an async ``BeforeModelCallEvent`` hook, so the summary call runs on the episode's
  own event loop), when the segment holds ``trigger_share`` of the context window or its response that share
  of the response budget: exact token counts, not Strands' character estimate.
* **When a turn did not fit** (Strands calls ``reduce_context`` with the overflow, which is also raised for
  a spent response budget): the compaction is deferred to the retried model call's hook. While compactions
  are left, the model does not shrink tool outputs to squeeze them into a nearly full segment
  (``fit_tool_outputs``): a new segment holds them whole. When no compaction can help, the retry shrinks
  them as it would without context management, and only then does the episode end.

Strategies: ``summarize`` appends a request for a summary to the segment being closed, so the summary is a
TRAINED turn of the policy, written where the policy wrote it (with the whole history in context, a turn on a
prefix-cached trajectory); the new conversation is the task, the summary and the newest messages the summary
does not replace (after an overflow, the summary is asked before the tool results that did not fit, and they
follow it whole with the call that asked for them). ``sliding_window`` keeps the task and the newest messages,
no model call. The task (the sample's prompt messages) is never compacted away.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from strands.agent.conversation_manager import ConversationManager
from strands.agent.conversation_manager.compression.context_compression import as_user_summary
from strands.event_loop.streaming import process_stream
from strands.hooks import BeforeModelCallEvent, HookRegistry
from strands.types.content import Message, Messages
from strands.types.exceptions import ContextWindowOverflowException

from .errors import ConfigurationError, SlimeStrandsError
from .model import SGLangModel
from .record import COMPACTION_STRATEGIES
from .segments import EpisodeSegments
from .settings import CompactionSettings

__all__ = ["SUMMARY_HEADER", "CompactionError", "ContextCompactor"]

logger = logging.getLogger(__name__)

SUMMARY_HEADER = "Summary of your work so far (the earlier messages were removed to free context):"
"""First line of the user message that holds the summary in the compacted conversation."""


class CompactionError(SlimeStrandsError, ContextWindowOverflowException):
    """A compaction could not be done (the summary request did not fit, or the summary has no text): the
    episode ends as a full context would have ended it."""


class ContextCompactor(ConversationManager):
    """Compacts an episode's history (``summarize`` or ``sliding_window``), one new segment per compaction."""

    def __init__(
        self,
        strategy: str,
        settings: CompactionSettings,
        segments: EpisodeSegments,
        *,
        pinned: int,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        """``pinned``: the leading messages (the sample's prompt) every compacted conversation keeps;
        ``should_stop``: slime's abort flag (no compaction once the rollout is aborted)."""
        super().__init__()  # no Strands proactive compression: the hook below counts exact tokens
        if strategy not in COMPACTION_STRATEGIES:
            raise ConfigurationError(
                f"unknown compaction strategy {strategy!r}; choose one of {COMPACTION_STRATEGIES}"
            )
        self.strategy = strategy
        self.settings = settings
        self.segments = segments
        self.pinned = pinned
        self.should_stop = should_stop
        self._overflowed = False
        self._fit_next = False  # no compaction can help the turn that overflowed: shrink its tool outputs
        self._broken = False  # a compaction failed: no more attempts
        self.compacting: bool | None = None
        """While a compaction runs (its summary turn), its ``overflowed`` flag; an abort can leave it set."""
        self._resume: bool | None = None  # a compaction an abort cut, to finish before the next model call

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        super().register_hooks(registry, **kwargs)
        registry.add_callback(BeforeModelCallEvent, self._before_model_call)

    def apply_management(self, agent: Any, **kwargs: Any) -> None:
        """Nothing after a cycle: compaction happens before model calls, where a new segment can start."""

    def reduce_context(self, agent: Any, e: Exception | None = None, **kwargs: Any) -> None:
        """A turn did not fit: compact before the retried call (the history stays as it is until then), or
        re-raise when no compaction can help (limit reached, nothing to drop, a segment with no turn)."""
        if e is None:
            return  # Strands' proactive path: ours is the hook
        if self._can_compact(agent):
            self._overflowed = True
        elif _continues(agent) and not agent.model.config["fit_tool_outputs"]:
            self._fit_next = True
        else:
            raise e

    # -- when ---------------------------------------------------------------------------------------

    async def _before_model_call(self, event: BeforeModelCallEvent) -> None:
        overflowed, self._overflowed = self._overflowed, False
        fit, self._fit_next = self._fit_next or self._exhausted, False
        agent = event.agent
        model = agent.model
        if not isinstance(model, SGLangModel):
            return
        model.update_config(fit_tool_outputs=fit)
        if event.cancel or (self.should_stop is not None and self.should_stop()):
            return
        resume, self._resume = self._resume, None
        if resume is not None:  # its summary turn is pending in the model: continue it, then rewrite
            await self._compact(agent, overflowed=resume)
            return
        if not self._can_compact(agent):
            return
        if not overflowed and await model.fill_ratio() < self.settings.trigger_share:
            return
        await self._compact(agent, overflowed=overflowed)

    @property
    def broken(self) -> bool:
        """Whether a compaction failed (no more are attempted)."""
        return self._broken

    def restore(self, *, broken: bool, pending: bool | None) -> None:
        """Continue from a partial-rollout checkpoint: a compaction it cut (``pending``: its ``overflowed``
        flag) is finished before the next model call."""
        self._broken = broken
        self._resume = pending

    @property
    def _exhausted(self) -> bool:
        return self._broken or self.segments.compactions >= self.settings.max_compactions

    def _can_compact(self, agent: Any) -> bool:
        if self._exhausted or not _continues(agent):
            return False  # the first call, or a new segment whose prompt alone does not fit
        return self._new_history(agent.messages, summary=None) is not None

    # -- how ----------------------------------------------------------------------------------------

    async def _compact(self, agent: Any, *, overflowed: bool) -> None:
        self.compacting = overflowed
        model: SGLangModel = agent.model
        messages = agent.messages
        # After an overflow the new messages (tool results) do not fit the closing segment: the summary is
        # asked before them and they follow it, whole, with the call that asked for them.
        answered = max(i for i, m in enumerate(messages) if m["role"] == "assistant") + 1
        summary, keep_from = None, answered - 1 if overflowed else None
        if self.strategy == "summarize":
            summary = await self._summarize(agent, model, messages[:answered] if overflowed else messages)
        history = self._new_history(messages, summary=summary, keep_from=keep_from)
        assert history is not None  # _can_compact checked it, and a summary only adds a message
        closed = model.start_segment()
        self.segments.close_main(closed, next_opened_by=self.strategy)
        dropped = len(agent.messages) - len(history) + (summary is not None)
        agent.messages[:] = history
        self.compacting = None
        logger.debug(
            "slime-strands: %s compaction %d: %d tokens closed, %d messages dropped",
            self.strategy,
            self.segments.compactions,
            len(closed),
            dropped,
        )

    def _new_history(
        self, messages: Messages, *, summary: Message | None, keep_from: int | None = None
    ) -> list[Message] | None:
        """The compacted conversation (None when it would drop nothing): the task, then the summary and the
        messages it does not replace (at least those from ``keep_from`` on), or the newest ``window_size``
        messages."""
        pinned = min(self.pinned, len(messages))
        if self.strategy == "sliding_window":
            start = _window_start(messages, pinned, self.settings.window_size)
            return None if start is None else [*messages[:pinned], *messages[start:]]
        if len(messages) <= pinned:
            return None
        split = _summary_split(messages, pinned, self.settings.summary_ratio)
        kept = list(messages[split if keep_from is None else min(split, keep_from) :])
        return [*messages[:pinned], *([summary] if summary is not None else []), *kept]

    async def _summarize(self, agent: Any, model: SGLangModel, messages: Messages) -> Message:
        """Ask the policy for a summary of ``messages`` as the closing segment's last (trained) turn."""
        request: Message = {"role": "user", "content": [{"text": self.settings.summary_prompt}]}
        try:
            message = await _final_message(
                model.stream(
                    [*messages, request],
                    tool_specs=agent.tool_registry.get_all_tool_specs(),
                    system_prompt=agent.system_prompt,
                )
            )
        except ContextWindowOverflowException as exc:
            self._broken = True
            raise CompactionError(f"the summary request does not fit: {exc}") from exc
        try:
            summary = as_user_summary(message)
        except RuntimeError as exc:  # a summary without text (only reasoning or tool calls)
            self._broken = True
            raise CompactionError(f"no summary: {exc}") from exc
        summary["content"].insert(0, {"text": SUMMARY_HEADER + "\n\n"})
        return summary


async def _final_message(events: Any) -> Message:
    message: Message | None = None
    async for event in process_stream(events):
        if "stop" in event:
            _, message, _, _ = event["stop"]
    if message is None:
        raise RuntimeError("the model stream ended without a message")
    return message


def _continues(agent: Any) -> bool:
    """Whether the agent's SGLangModel holds a segment that ends on a generated turn (one to continue)."""
    model = getattr(agent, "model", None)
    if not isinstance(model, SGLangModel):
        return False
    last = model.token_manager.last_segment
    return last is not None and last.kind == "generated"


def _has(message: Message, block: str) -> bool:
    return any(block in content for content in message.get("content", []))


def _window_start(messages: Sequence[Message], pinned: int, size: int) -> int | None:
    """Index of the first kept message: ``size`` from the end, moved back so a tool result keeps its call;
    None when nothing before it would be dropped."""
    start = max(pinned, len(messages) - size)
    while start > pinned and _has(messages[start], "toolResult"):
        start -= 1
    return start if start > pinned else None


def _summary_split(messages: Sequence[Message], pinned: int, ratio: float) -> int:
    """Index of the first message kept after the summary: the oldest ``ratio`` of the messages after the task
    are replaced, moved forward so no kept message is a tool result without its call."""
    split = pinned + max(1, int((len(messages) - pinned) * ratio))
    while split < len(messages) and _has(messages[split], "toolResult"):
        split += 1
    return min(split, len(messages))
