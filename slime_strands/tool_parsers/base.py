"""The tool-parser interface: model output text -> tool calls and typed parse errors, strictly, no repair.

Reasoning (``<think>...</think>``, or everything up to ``</think>`` when the generation prompt already opened
``<think>``) is split off first: tool calls drafted inside reasoning are never executed, only counted.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

__all__ = ["ParseErrorKind", "ParseResult", "ToolCall", "ToolCallError", "ToolParser"]

ParseErrorKind = Literal[
    "bad_json",
    "missing_name",
    "bad_arguments",
    "unclosed_tag",
    "inside_reasoning",
    "unknown_tool",
    "too_many_calls",
]


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call: ``input`` is the JSON object the model wrote, untouched."""

    name: str
    input: dict[str, Any]
    raw: str


@dataclass(frozen=True)
class ToolCallError:
    """A call the model attempted but wrote wrongly; ``message`` is shown to the model as the tool's error."""

    kind: ParseErrorKind
    message: str
    raw: str
    name: str | None = None


@dataclass(frozen=True)
class ParseResult:
    content: str
    """Visible text outside reasoning, with the tool-call markup removed."""
    reasoning: str | None = None
    """Reasoning text (without the think tags), when the output had any."""
    calls: list[ToolCall | ToolCallError] = field(default_factory=list)
    """Tool calls in the order written, valid or not (not those inside reasoning)."""
    reasoning_calls: int = 0
    """Tool calls drafted inside reasoning: never executed, counted as ``inside_reasoning``."""


class ToolParser(abc.ABC):
    """Base class: subclasses set ``name`` and implement :meth:`parse_calls` on reasoning-free text."""

    name: ClassVar[str]
    think_open: ClassVar[str] = "<think>"
    think_close: ClassVar[str] = "</think>"

    def parse(self, text: str, *, starts_in_reasoning: bool = False) -> ParseResult:
        """Split reasoning off ``text`` (one assistant turn, end-of-turn token removed), then parse calls."""
        reasoning_parts, content = self._split_reasoning(text, starts_in_reasoning)
        content_text, calls = self.parse_calls(content)
        reasoning_calls = sum(self.count_calls(part) for part in reasoning_parts)
        reasoning = "".join(reasoning_parts) if reasoning_parts else None
        return ParseResult(
            content=content_text, reasoning=reasoning, calls=calls, reasoning_calls=reasoning_calls
        )

    @abc.abstractmethod
    def parse_calls(self, text: str) -> tuple[str, list[ToolCall | ToolCallError]]:
        """Return ``(text without call markup, calls in order)`` for text that holds no reasoning."""

    @abc.abstractmethod
    def count_calls(self, text: str) -> int:
        """How many call attempts ``text`` holds (used to count calls drafted inside reasoning)."""

    def _split_reasoning(self, text: str, starts_in_reasoning: bool) -> tuple[list[str], str]:
        reasoning: list[str] = []
        if starts_in_reasoning:
            head, sep, text = text.partition(self.think_close)
            reasoning.append(head)
            if not sep:  # reasoning never closed (e.g. a length finish): everything is reasoning
                return reasoning, ""
        pattern = re.compile(
            re.escape(self.think_open) + r"(.*?)(?:" + re.escape(self.think_close) + r"|\Z)", re.S
        )
        content_parts: list[str] = []
        pos = 0
        for match in pattern.finditer(text):
            content_parts.append(text[pos : match.start()])
            reasoning.append(match.group(1))
            pos = match.end()
        content_parts.append(text[pos:])
        return reasoning, "".join(content_parts)
