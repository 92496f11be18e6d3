"""A parsed turn -> what the agent sees: the tool-call policy and the Strands stream events, as pure functions.

Like the Strands providers' ``format_*`` helpers, these hold no state: the provider (``SGLangModel``) calls
:func:`plan_tool_calls` then :func:`format_stream_events` and keeps the returned errors and ids. Adding a
tool-call format touches only its parser.

Policy: calls of a turn cut by ``length`` never run; at most ``max_calls_per_turn`` run and the rest get ONE
``too_many_calls`` error; a call of a tool the agent does not have becomes an ``unknown_tool`` error; every
call gets a fresh ``toolUseId``; a malformed call is emitted as a call of ``invalid_tool_call`` whose result
(set by the provider's hook) tells the model what was wrong.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from strands.types.event_loop import StopReason, Usage
from strands.types.streaming import StreamEvent

from ..tool_parsers.base import MalformedCall, ParseErrorKind, ParseResult, ToolCall

__all__ = [
    "INVALID_TOOL_NAME",
    "PlannedCall",
    "TurnPlan",
    "format_stream_events",
    "format_usage",
    "new_tool_use_id",
    "plan_tool_calls",
]

INVALID_TOOL_NAME = "invalid_tool_call"
"""Tool name of the toolUse block emitted for a malformed call; its error result carries the reason."""


def new_tool_use_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class PlannedCall:
    tool_use_id: str
    call: ToolCall | MalformedCall


@dataclass(frozen=True)
class TurnPlan:
    """The calls of one turn as the agent will see them, and how the turn stops."""

    calls: list[PlannedCall]
    stop_reason: StopReason
    reasoning_calls: int = 0

    @property
    def errors(self) -> dict[str, MalformedCall]:
        """``toolUseId`` -> the error its result must report."""
        return {p.tool_use_id: p.call for p in self.calls if isinstance(p.call, MalformedCall)}

    @property
    def valid(self) -> list[PlannedCall]:
        return [p for p in self.calls if isinstance(p.call, ToolCall)]

    @property
    def template_ids(self) -> dict[str, str]:
        """``toolUseId`` -> the call id the model wrote, where it wrote one (the template shows it again)."""
        return {p.tool_use_id: p.call.id for p in self.calls if isinstance(p.call, ToolCall) and p.call.id}

    @property
    def error_kinds(self) -> list[ParseErrorKind]:
        """Every malformed call of the turn by kind, those drafted inside reasoning included."""
        return [e.kind for e in self.errors.values()] + ["inside_reasoning"] * self.reasoning_calls


def plan_tool_calls(
    parsed: ParseResult,
    *,
    finish_reason: str,
    tool_names: Collection[str],
    max_calls_per_turn: int | None,
    new_id: Callable[[], str] = new_tool_use_id,
) -> TurnPlan:
    """Apply the tool-call policy (module docstring) to one parsed turn."""
    calls: list[ToolCall | MalformedCall] = list(parsed.calls) if finish_reason == "stop" else []
    if max_calls_per_turn is not None and len(calls) > max_calls_per_turn:
        extra = len(calls) - max_calls_per_turn
        calls = calls[:max_calls_per_turn]
        calls.append(
            MalformedCall(
                "too_many_calls",
                f"{extra} more tool call(s) in this turn were not run: at most {max_calls_per_turn} calls per turn",
                "",
            )
        )
    known = ", ".join(sorted(tool_names)) or "none"
    planned = [
        PlannedCall(
            new_id(),
            MalformedCall(
                "unknown_tool", f"unknown tool {call.name!r}; available tools: {known}", call.raw, call.name
            )
            if isinstance(call, ToolCall) and call.name not in tool_names
            else call,
        )
        for call in calls
    ]
    stop_reason: StopReason
    if finish_reason == "length":
        stop_reason = "max_tokens"
    elif planned:
        stop_reason = "tool_use"
    else:
        stop_reason = "end_turn"
    return TurnPlan(planned, stop_reason, parsed.reasoning_calls)


def format_usage(input_tokens: int, output_tokens: int, cached_tokens: int | None) -> Usage:
    usage: Usage = {
        "inputTokens": input_tokens,
        "outputTokens": output_tokens,
        "totalTokens": input_tokens + output_tokens,
    }
    if cached_tokens is not None:
        usage["cacheReadInputTokens"] = cached_tokens
    return usage


def format_stream_events(
    parsed: ParseResult, plan: TurnPlan, usage: Usage, latency_ms: int
) -> list[StreamEvent]:
    """The Strands stream of one turn: reasoning, text, one toolUse block per planned call, stop, metadata."""
    events: list[StreamEvent] = [{"messageStart": {"role": "assistant"}}]
    if parsed.reasoning:
        events += _block({"reasoningContent": {"text": parsed.reasoning}})
    if parsed.content:
        events += _block({"text": parsed.content})
    for planned in plan.calls:
        call = planned.call
        name, payload = (
            (call.name, _json_dumps(call.input)) if isinstance(call, ToolCall) else (INVALID_TOOL_NAME, "{}")
        )
        events += [
            {"contentBlockStart": {"start": {"toolUse": {"name": name, "toolUseId": planned.tool_use_id}}}},
            {"contentBlockDelta": {"delta": {"toolUse": {"input": payload}}}},
            {"contentBlockStop": {}},
        ]
    events.append({"messageStop": {"stopReason": plan.stop_reason}})
    events.append({"metadata": {"usage": usage, "metrics": {"latencyMs": latency_ms}}})
    return events


def _block(delta: Any) -> list[StreamEvent]:
    return [
        {"contentBlockStart": {"start": {}}},
        {"contentBlockDelta": {"delta": delta}},
        {"contentBlockStop": {}},
    ]


def _json_dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
