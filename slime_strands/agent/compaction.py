"""Context management for long-horizon episodes: compact the history, start a new trajectory segment.

Token-in/token-out needs an append-only history, so a rewrite of ``agent.messages`` cannot continue the
trajectory: :class:`ContextCompactor` closes the current segment and the model renders the rewritten
conversation as the next segment's prompt (masked: it is the prompt of a new sample). Every segment is exact
token-in/token-out on its own; :class:`~slime_strands.agent.segment_collector.SegmentCollector` collects them.

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
  (``fit_tool_outputs``): a new segment holds them whole (shrunk only where they alone would not leave a
  turn its room). When no compaction can help, the retry runs as it would without context management
  (tool outputs shrunk, no room kept for a summary), and only then does the episode end.

Strategies: ``summarize`` appends a request for a summary to the segment being closed, so the summary is a
TRAINED turn of the policy, written where the policy wrote it (with the whole history in context, a turn on a
prefix-cached trajectory); the new conversation is the task, the summary and the newest messages the summary
does not replace. ``sliding_window`` keeps the task and the newest messages, no model call. The task (the
sample's prompt messages) is never compacted away.

**A summary always has room** (``summarize``). One tool result can take a segment from under the trigger to
the window's edge, so the trigger alone cannot promise it. Instead, while compactions are left, every turn
keeps the summary request and ``summary_max_tokens`` free (the model's ``reserved_tokens``: its new messages
and its ``max_new_tokens`` stay short of them), and a turn whose new messages would leave it fewer tokens to
write than that budget (or its own ``max_new_tokens``, when smaller; the model's ``min_turn_tokens``) does
not fit: the segment is compacted first. So after any turn the summary can be asked before the newest
messages, with its whole budget as ``max_new_tokens``; those messages then follow it whole in the next
segment, with the call that asked for them. It is asked after them instead when they, the request and the
whole budget fit, which the model checks on exact tokens before sending anything (always before them after
an overflow). A summary cut at its budget (or without text) is never used: the compaction keeps the newest
``window_size`` messages (the next segment is ``opened_by`` ``sliding_window``); the cut turn stays the
closing segment's last, trained turn. A summary budget that, with its request, needs over half of the window
or of the response budget stops the run (``ConfigurationError``). A first turn that cannot keep that room at
all (a task that fills the window) runs as without context management.
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

from ..errors import ConfigurationError
from ..provider.model import SGLangModel
from ..settings import COMPACTION_STRATEGIES, CompactionSettings
from .segment_collector import SegmentCollector

__all__ = ["SUMMARY_HEADER", "ContextCompactor"]

logger = logging.getLogger(__name__)

_REQUEST_MARGIN = 32
"""Tokens a chat template may add around the summary request's text (turn markers, the generation prompt, an
empty reasoning block): the room kept for a summary counts them on top of the text's own tokens."""
_DEFAULT_SUMMARY_TOKENS = 1024
_DEFAULT_SUMMARY_SHARE = 16
"""Without ``summary_max_tokens``: 1024 tokens, or this fraction of the window (or budget) when smaller."""

SUMMARY_HEADER = "Summary of your work so far (the earlier messages were removed to free context):"
"""First line of the user message that holds the summary in the compacted conversation."""


class ContextCompactor(ConversationManager):
    """Compacts an episode's history (``summarize`` or ``sliding_window``), one new segment per compaction."""

    def __init__(
        self,
        strategy: str,
        settings: CompactionSettings,
        segments: SegmentCollector,
        *,
        pinned: int,
        abort_signal: Callable[[], bool] | None = None,
    ) -> None:
        """``pinned``: the leading messages (the sample's prompt) every compacted conversation keeps;
        ``abort_signal``: slime's abort flag (no compaction once the rollout is aborted)."""
        super().__init__()  # no Strands proactive compression: the hook below counts exact tokens
        if strategy not in COMPACTION_STRATEGIES:
            raise ConfigurationError(
                f"unknown compaction strategy {strategy!r}; choose one of {COMPACTION_STRATEGIES}"
            )
        self.strategy = strategy
        self.settings = settings
        self.segments = segments
        self.pinned = pinned
        self.abort_signal = abort_signal
        self._overflowed = False
        self._relax_next = False  # no compaction can help the turn that overflowed: run it as without one
        self._request_tokens: int | None = None  # the summary request, in tokens (with the template's margin)
        self.compacting: bool | None = None
        """While a compaction runs (its summary turn), its ``overflowed`` flag; an abort can leave it set."""
        self._resume: bool | None = None  # a compaction an abort cut, to finish before the next model call

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        super().register_hooks(registry, **kwargs)
        registry.add_callback(BeforeModelCallEvent, self._before_model_call)

    def apply_management(self, agent: Any, **kwargs: Any) -> None:
        """Nothing after a cycle: compaction happens before model calls, where a new segment can start."""

    def reduce_context(self, agent: Any, e: Exception | None = None, **kwargs: Any) -> None:
        """A turn did not fit: compact before the retried call (the history stays as it is until then); when no
        compaction can help (limit reached, nothing to drop, a segment with no turn), retry it as without
        context management (tool outputs shrunk, no room kept for a summary); re-raise when that was done."""
        if e is None:
            return  # Strands' proactive path: ours is the hook
        model = agent.model
        if self._can_compact(agent):
            self._overflowed = True
        elif isinstance(model, SGLangModel) and not _unmanaged(model):
            if not _continues(agent):
                model.start_segment()  # drop the prompt it holds: the retried call renders it again
            self._relax_next = True
        else:
            raise e

    # -- when ---------------------------------------------------------------------------------------

    async def _before_model_call(self, event: BeforeModelCallEvent) -> None:
        overflowed, self._overflowed = self._overflowed, False
        relax, self._relax_next = self._relax_next, False
        agent = event.agent
        model = agent.model
        if not isinstance(model, SGLangModel):
            return
        stopped = event.cancel or (self.abort_signal is not None and self.abort_signal())
        if self._resume is not None and not stopped:
            # a compaction an abort cut: its summary turn is pending in the model; continue it, then rewrite
            resume, self._resume = self._resume, None
            await self._compact(agent, model, overflowed=resume)
        elif not stopped and await self._due(agent, model, overflowed=overflowed):
            await self._compact(agent, model, overflowed=overflowed)
        await self._set_turn_rules(agent, model, relax=relax)

    async def _due(self, agent: Any, model: SGLangModel, *, overflowed: bool) -> bool:
        """Whether to compact before this call: a compaction can help, and the last turn did not fit or the
        segment holds ``trigger_share`` of the window or the response budget. Never before a turn an abort
        cut: the call continues it (the uninterrupted episode did not compact there)."""
        if model.pending_turn is not None or not self._can_compact(agent):
            return False
        return overflowed or await model.fill_ratio() >= self.settings.trigger_share

    async def _set_turn_rules(self, agent: Any, model: SGLangModel, *, relax: bool) -> None:
        """What the coming turn may use. While a compaction can help it, tool outputs are not shrunk (a new
        segment holds them whole). Under ``summarize``, while compactions are left, every turn leaves the
        summary and its request free and must have room to write (the smaller of the summary budget and its
        own ``max_new_tokens``), else it compacts first: after any turn a summary fits. A turn no compaction
        can help runs as without context management."""
        unmanaged = relax or self._exhausted
        reserved, floor = 0, 1
        if self.strategy == "summarize" and not unmanaged:
            budget = await self._summary_budget(model)
            reserved = self._request_length(model) + budget
            cap = model.config["params"].get("max_new_tokens")
            floor = budget if cap is None else max(1, min(budget, int(cap)))
        model.update_config(
            fit_tool_outputs=relax or not self._can_compact(agent),
            reserved_tokens=reserved,
            min_turn_tokens=floor,
        )

    def restore(self, *, pending: bool | None) -> None:
        """Continue from a partial-rollout checkpoint: a compaction it cut (``pending``: its ``overflowed``
        flag) is in progress, and finished before the next model call."""
        self.compacting = self._resume = pending

    @property
    def _exhausted(self) -> bool:
        return self.segments.compactions >= self.settings.max_compactions

    def _can_compact(self, agent: Any) -> bool:
        if self._exhausted or not _continues(agent):
            return False  # the first call, or a new segment whose prompt alone does not fit
        return self._new_history(agent.messages, self.strategy, summary=None) is not None

    # -- how ----------------------------------------------------------------------------------------

    async def _compact(self, agent: Any, model: SGLangModel, *, overflowed: bool) -> None:
        self.compacting = overflowed
        messages = agent.messages
        # The newest messages (tool results) since the last answer: the summary is asked after them when the
        # request and the whole summary budget fit there, else (and always after an overflow) before them, and
        # they follow it, whole, with the call that asked for them.
        answered = max(i for i, m in enumerate(messages) if m["role"] == "assistant") + 1
        strategy, summary, keep_from = self.strategy, None, None
        if strategy == "summarize":
            summary, keep_from = await self._summarize(agent, model, answered, overflowed=overflowed)
            if summary is None:  # no usable summary: keep the newest messages instead
                strategy, keep_from = "sliding_window", answered - 1
        history = self._new_history(messages, strategy, summary=summary, keep_from=keep_from)
        if history is None:  # the window holds every message: the task and the newest call with its results
            history = self._new_history(messages, self.strategy, summary=None, keep_from=keep_from)
        assert history is not None  # _can_compact checked it, and a summary only adds a message
        closed = model.start_segment()
        self.segments.close_main(closed, next_opened_by=strategy)
        dropped = len(agent.messages) - len(history) + (summary is not None)
        agent.messages[:] = history
        self.compacting = None
        logger.debug(
            "slime-strands: %s compaction %d: %d tokens closed, %d messages dropped",
            strategy,
            self.segments.compactions,
            len(closed),
            dropped,
        )

    def _new_history(
        self, messages: Messages, strategy: str, *, summary: Message | None, keep_from: int | None = None
    ) -> list[Message] | None:
        """The conversation compacted by ``strategy`` (None when it would drop nothing): the task, then the
        summary and the messages it does not replace (at least those from ``keep_from`` on), or the newest
        ``window_size`` messages."""
        pinned = min(self.pinned, len(messages))
        if strategy == "sliding_window":
            start = _window_start(messages, pinned, self.settings.window_size)
            return None if start is None else [*messages[:pinned], *messages[start:]]
        if len(messages) <= pinned:
            return None
        split = _summary_split(messages, pinned, self.settings.summary_ratio)
        kept = list(messages[split if keep_from is None else min(split, keep_from) :])
        return [*messages[:pinned], *([summary] if summary is not None else []), *kept]

    async def _summarize(
        self, agent: Any, model: SGLangModel, answered: int, *, overflowed: bool
    ) -> tuple[Message | None, int | None]:
        """The summary and the index from which messages follow it whole: asked after the newest messages,
        else before them (where the segment's reserve guarantees it fits); None when no summary is usable."""
        messages = agent.messages
        attempts: list[tuple[Messages, int | None]] = []
        if not overflowed and answered < len(messages):
            attempts.append((list(messages), None))
        attempts.append((list(messages[:answered]), answered - 1))
        pending = model.pending_turn
        if pending is not None:  # an abort cut the summary turn: continue the attempt it made
            attempts = [attempt for attempt in attempts if len(attempt[0]) + 1 == pending.messages]
        for history, keep_from in attempts:
            try:
                return await self._ask_summary(agent, model, history), keep_from
            except ContextWindowOverflowException as exc:  # refused before anything was sent
                logger.debug("slime-strands: the summary does not fit here: %s", exc)
        logger.info("slime-strands: no room for a summary: compacting with a sliding window instead")
        return None, None

    async def _ask_summary(self, agent: Any, model: SGLangModel, messages: Messages) -> Message | None:
        """Ask the policy for a summary of ``messages`` as the closing segment's last (trained) turn, with the
        whole summary budget to write it. Raises ``ContextWindowOverflowException`` (nothing sent) when the
        request and that budget do not fit; None when the answer is no summary (cut at the budget: never
        used, or without text)."""
        budget = await self._summary_budget(model)
        request: Message = {"role": "user", "content": [{"text": self.settings.summary_prompt}]}
        params = model.config["params"]
        model.update_config(
            params={**params, "max_new_tokens": budget},
            fit_tool_outputs=False,
            reserved_tokens=0,
            min_turn_tokens=budget,
        )
        try:
            stop_reason, message = await _final_message(
                model.stream(
                    [*messages, request],
                    tool_specs=agent.tool_registry.get_all_tool_specs(),
                    system_prompt=agent.system_prompt,
                )
            )
        finally:
            model.update_config(params=params)
        if stop_reason == "max_tokens":
            logger.info("slime-strands: the summary was cut at %d tokens: not used", budget)
            return None
        try:
            summary = as_user_summary(message)
        except RuntimeError:  # only reasoning or tool calls
            logger.info("slime-strands: the summary has no text: not used")
            return None
        summary["content"].insert(0, {"text": SUMMARY_HEADER + "\n\n"})
        return summary

    # -- the summary's room -------------------------------------------------------------------------

    async def _summary_budget(self, model: SGLangModel) -> int:
        """``summary_max_tokens``, or its default for this model's window and response budget. A summary and
        request that need over half of either is a ConfigurationError (every segment would be mostly reserve)."""
        window = await model.context_window()
        budget = model.config["max_response_tokens"]
        limits = [(n, what) for n, what in ((window, "context window"), (budget, "response budget")) if n]
        tokens = self.settings.summary_max_tokens
        if tokens is None:
            tokens = min([_DEFAULT_SUMMARY_TOKENS, *(max(1, n // _DEFAULT_SUMMARY_SHARE) for n, _ in limits)])
        request = self._request_length(model)
        for n, what in limits:
            if tokens + request > n // 2:
                fix = (
                    f"set compaction.summary_max_tokens to at most {n // 2 - request}"
                    if n // 2 > request
                    else "shorten compaction.summary_prompt"
                )
                raise ConfigurationError(
                    f"compaction: a {tokens}-token summary (summary_max_tokens) and its ~{request}-token request "
                    f"(summary_prompt) need over half of the {n}-token {what}: {fix}"
                )
        return tokens

    def _request_length(self, model: SGLangModel) -> int:
        """Tokens of the summary request: its text, plus a margin for the chat template's turn markers."""
        if self._request_tokens is None:
            text = self.settings.summary_prompt
            self._request_tokens = (
                len(model.tokenizer.encode(text, add_special_tokens=False)) + _REQUEST_MARGIN
            )
        return self._request_tokens


async def _final_message(events: Any) -> tuple[str, Message]:
    """The stop reason and message of a model stream."""
    answer: tuple[str, Message] | None = None
    async for event in process_stream(events):
        if "stop" in event:
            stop_reason, message, _, _ = event["stop"]
            answer = (stop_reason, message)
    if answer is None:
        raise RuntimeError("the model stream ended without a message")
    return answer


def _unmanaged(model: SGLangModel) -> bool:
    """Whether the model's turn already ran as without context management (shrinking, nothing kept free)."""
    config = model.config
    return config["fit_tool_outputs"] and config["reserved_tokens"] == 0 and config["min_turn_tokens"] <= 1


def _continues(agent: Any) -> bool:
    """Whether the agent's SGLangModel holds a segment that ends on a generated turn (one to continue)."""
    model = getattr(agent, "model", None)
    if not isinstance(model, SGLangModel):
        return False
    last = model.token_manager.last_span
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
