"""What a model knows between turns besides its trajectory, and how it is saved and restored.

Token-in/token-out needs an append-only history: the model remembers how many messages its last answer
followed (the next call renders only the ones after), the order and ids of the calls it planned (tool results are
rendered in that order, under the ids the template saw), the malformed calls whose error result is still due,
and a turn an abort cut after its input was appended (the next call with as many messages continues it). A
partial-rollout checkpoint saves exactly this (:class:`~slime_strands.provider.checkpoint.ModelCheckpoint`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, cast

from strands.types.content import Messages

from ..errors import SlimeStrandsError
from ..tool_parsers import MalformedCall
from ..tool_parsers.base import ParseErrorKind
from .checkpoint import ModelCheckpoint, PendingTurn
from .model_stats import ModelStats
from .turn_events import TurnPlan

__all__ = ["TrajectoryError", "TurnState"]


class TrajectoryError(SlimeStrandsError, RuntimeError):
    """The conversation can no longer be continued token-in/token-out (history edited, turn left open, an image
    token the model wrote)."""


@dataclass
class TurnState:
    """See the module docstring. A new episode or a restored checkpoint replaces it whole."""

    messages_seen: int = 0
    """Messages of the conversation the trajectory holds (the last answer's included)."""
    pending: PendingTurn | None = None
    """A turn an abort cut after its input was appended: the next call with as many messages continues it."""
    last_tool_ids: list[str] = field(default_factory=list)
    call_errors: dict[str, MalformedCall] = field(default_factory=dict)
    template_ids: dict[str, str] = field(default_factory=dict)

    def continued_turn(self, messages: Messages) -> PendingTurn | None:
        """The pending turn a call with ``messages`` continues (the messages the cut call rendered), or None."""
        pending = self.pending
        if pending is None:
            return None
        if len(messages) != pending.messages:
            raise TrajectoryError(
                f"an abort cut the turn whose input had {pending.messages} messages; it must be continued with "
                f"them (got {len(messages)}): rebuild the agent on the checkpoint's conversation"
            )
        return pending

    def new_messages(self, messages: Messages) -> Messages:
        """The messages added since the last answer: tool results and user turns only, never an edit."""
        seen = self.messages_seen
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
        return new

    def answered(self, messages: Messages) -> None:
        """A turn answered the call with ``messages``: the agent appends its assistant message next."""
        self.pending = None
        self.messages_seen = len(messages) + 1

    def planned(self, plan: TurnPlan, stats: ModelStats) -> None:
        """Keep what later turns need of a turn's calls (errors for the hook, call order, the model's call ids)
        and count them."""
        self.last_tool_ids = [p.tool_use_id for p in plan.calls]
        self.call_errors.update(plan.errors)
        self.template_ids.update(plan.template_ids)
        stats.parse_errors.update(plan.error_kinds)
        stats.tool_calls_parsed += len(plan.valid)

    def checkpoint(self, stats: ModelStats) -> ModelCheckpoint:
        """The state as plain data, with a copy of the model's counters."""
        return ModelCheckpoint(
            messages_seen=self.messages_seen,
            pending=self.pending,
            last_tool_ids=tuple(self.last_tool_ids),
            call_errors={k: (e.kind, e.message, e.raw, e.name) for k, e in self.call_errors.items()},
            template_ids=dict(self.template_ids),
            counters=copy.deepcopy(stats),
        )

    @classmethod
    def restored(cls, saved: ModelCheckpoint) -> TurnState:
        return cls(
            messages_seen=saved.messages_seen,
            pending=saved.pending,
            last_tool_ids=list(saved.last_tool_ids),
            call_errors={
                k: MalformedCall(kind=cast(ParseErrorKind, kind), message=message, raw=raw, name=name)
                for k, (kind, message, raw, name) in saved.call_errors.items()
            },
            template_ids=dict(saved.template_ids),
        )

    def error_of(self, tool_use_id: Any) -> MalformedCall | None:
        """The malformed call whose error result a tool use is (None: a valid call)."""
        return self.call_errors.get(str(tool_use_id))
