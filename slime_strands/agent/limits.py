"""Strands hooks that end an agent loop cleanly: tool limits and external stop conditions.

They stop the loop BEFORE the next model call, so the token trajectory always ends on a model output
(tool results are only tokenized when the model is called again).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from strands.hooks import AfterToolsEvent, BeforeModelCallEvent, BeforeToolsEvent, HookProvider, HookRegistry

from ..errors import ConfigurationError

__all__ = ["StopWhen", "ToolIterationLimiter", "ToolLimiter"]


class ToolLimiter(HookProvider):
    """Stop the agent when a batch of tool calls would exceed a limit.

    ``max_tool_iters`` bounds the assistant turns whose tools are executed (parallel calls of one message
    count as one iteration); ``max_tool_calls`` bounds the executed calls in total. A batch that would exceed
    a limit is not executed and the loop ends there (``limit_reached`` says which limit).
    """

    def __init__(self, max_tool_iters: int | None = None, max_tool_calls: int | None = None) -> None:
        for name, value in (("max_tool_iters", max_tool_iters), ("max_tool_calls", max_tool_calls)):
            if value is not None and value < 0:
                raise ConfigurationError(f"{name} must be >= 0 or None, got {value!r}")
        self.max_tool_iters = max_tool_iters
        self.max_tool_calls = max_tool_calls
        self.reset()

    def reset(self) -> None:
        self.tool_iter_count = 0
        self.tool_call_count = 0
        self.limit_reached: str | None = None

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeToolsEvent, self._before_tools)
        registry.add_callback(AfterToolsEvent, self._after_tools)

    def _before_tools(self, event: BeforeToolsEvent) -> None:
        calls = sum(1 for block in event.message.get("content", []) if "toolUse" in block)
        if self.max_tool_iters is not None and self.tool_iter_count >= self.max_tool_iters:
            self.limit_reached = "max_tool_iters"
        elif self.max_tool_calls is not None and self.tool_call_count + calls > self.max_tool_calls:
            self.limit_reached = "max_tool_calls"
        else:
            self.tool_iter_count += 1
            self.tool_call_count += calls
            return
        event.cancel = f"Tool limit reached ({self.limit_reached}); the episode ends here."

    def _after_tools(self, event: AfterToolsEvent) -> None:
        if self.limit_reached:
            event.end_turn = True


class ToolIterationLimiter(ToolLimiter):
    """``ToolLimiter(max_tool_iters=max_iterations)`` under its older name."""

    def __init__(self, max_iterations: int) -> None:
        super().__init__(max_tool_iters=max_iterations)


class StopWhen(HookProvider):
    """End the loop before the next model call or tool batch once ``predicate()`` is true.

    Used for slime's abort flag: checked between turns and before tools, never mid-request.
    """

    def __init__(self, predicate: Callable[[], bool], reason: str) -> None:
        self.predicate = predicate
        self.reason = reason
        self.triggered = False

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeModelCallEvent, self._before_model)
        registry.add_callback(BeforeToolsEvent, self._before_tools)
        registry.add_callback(AfterToolsEvent, self._after_tools)

    def _check(self) -> bool:
        self.triggered = self.triggered or bool(self.predicate())
        return self.triggered

    def _before_model(self, event: BeforeModelCallEvent) -> None:
        if self._check():
            event.cancel = self.reason

    def _before_tools(self, event: BeforeToolsEvent) -> None:
        if self._check():
            event.cancel = self.reason

    def _after_tools(self, event: AfterToolsEvent) -> None:
        if self.triggered:
            event.end_turn = True
