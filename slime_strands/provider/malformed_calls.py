"""The Strands hook that gives a malformed tool call an error result saying what was wrong.

A call the model wrote wrongly (bad JSON, an unknown tool, too many calls in one turn) is planned as a tool use
of its own (``turn_events``); without this hook Strands would run it with ``{}``. The hook cancels it with the
error the parser found, so the model reads why on its next turn.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from strands.hooks import BeforeToolCallEvent

from ..tool_parsers import MalformedCall

__all__ = ["MalformedCallHook"]


class MalformedCallHook:
    """Added once to every agent that calls the model; ``error_of(tool_use_id)`` is the model's current state."""

    def __init__(self, error_of: Callable[[Any], MalformedCall | None]) -> None:
        self._error_of = error_of
        self._agents: weakref.WeakSet[Any] = weakref.WeakSet()

    def attach(self, agent: Any) -> None:
        """Hook ``agent`` (the one of the call's ``invocation_state``), once."""
        if agent is None or agent in self._agents or not hasattr(agent, "add_hook"):
            return
        agent.add_hook(self._before_tool_call, BeforeToolCallEvent)
        self._agents.add(agent)

    def _before_tool_call(self, event: BeforeToolCallEvent) -> None:
        error = self._error_of(event.tool_use.get("toolUseId"))
        if error is not None:
            event.cancel_tool = f"Error: invalid tool call ({error.kind}): {error.message}"
