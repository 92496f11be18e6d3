"""The tool-parser interface: model output text -> tool calls and typed parse errors, strictly, no repair.

Reasoning (``<think>...</think>``, or everything up to ``</think>`` when the generation prompt already opened
``<think>``) is split off first: tool calls drafted inside reasoning are never executed, only counted.

A parser gets the tools' JSON schemas (``ToolSchemas``: tool name -> parameters schema) because some formats
write argument values as bare text (Qwen3-Coder's ``<parameter=...>``, GLM's ``<arg_value>``): only the
schema says whether ``7`` is the integer 7 or the string "7".
"""

from __future__ import annotations

import abc
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

__all__ = [
    "MalformedCall",
    "ParseErrorKind",
    "ParseResult",
    "ToolCall",
    "ToolCallError",
    "ToolParser",
    "ToolSchemas",
]

ParseErrorKind = Literal[
    "bad_json",
    "missing_name",
    "bad_arguments",
    "unclosed_tag",
    "inside_reasoning",
    "unknown_tool",
    "too_many_calls",
]

ToolSchemas = Mapping[str, Mapping[str, Any]]
"""Tool name -> JSON schema of its parameters (``{"type": "object", "properties": {...}}``)."""

_MAX_RAW_IN_MESSAGE = 300


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call: ``input`` is the argument object the model wrote (typed by the schema where the
    format writes bare values), never repaired."""

    name: str
    input: dict[str, Any]
    raw: str
    id: str | None = None
    """The call id the model wrote itself (Kimi-K2's ``functions.NAME:IDX``); the template shows it again
    with the tool's result."""


@dataclass(frozen=True)
class MalformedCall:
    """A call the model attempted but wrote wrongly: a value in :attr:`ParseResult.calls`, never raised.
    ``message`` is shown to the model as the tool's error."""

    kind: ParseErrorKind
    message: str
    raw: str
    name: str | None = None


ToolCallError = MalformedCall
"""The older name of :class:`MalformedCall` (custom parsers written against it keep working)."""


@dataclass(frozen=True)
class ParseResult:
    content: str
    """Visible text outside reasoning, with the tool-call markup removed."""
    reasoning: str | None = None
    """Reasoning text (without the think tags), when the output had any."""
    calls: list[ToolCall | MalformedCall] = field(default_factory=list)
    """Tool calls in the order written, valid or not (not those inside reasoning)."""
    reasoning_calls: int = 0
    """Tool calls drafted inside reasoning: never executed, counted as ``inside_reasoning``."""


class ToolParser(abc.ABC):
    """Base class: subclasses set ``name`` (SGLang's ``--tool-call-parser`` value) and implement
    :meth:`parse_calls` on reasoning-free text and :meth:`count_calls`."""

    name: ClassVar[str]
    family: ClassVar[str] = ""
    """The model families that write this format (for reports)."""
    markers: ClassVar[tuple[str, ...]] = ()
    """Special tokens a tokenizer of this family has (a fallback for ``tool_parser: auto``)."""
    turn_starts: ClassVar[tuple[str, ...]] = ()
    """Where the family's chat templates start an assistant turn: its role marker, or the end of the tool results
    the model answers right after (the reward reads the final answer from there when the episode did not record
    where it starts)."""
    think_open: ClassVar[str] = "<think>"
    think_close: ClassVar[str] = "</think>"

    def parse(
        self, text: str, *, starts_in_reasoning: bool = False, tools: ToolSchemas | None = None
    ) -> ParseResult:
        """Split reasoning off ``text`` (one assistant turn, end-of-turn token removed), then parse calls."""
        reasoning_parts, content = self._split_reasoning(text, starts_in_reasoning)
        content_text, calls = self.parse_calls(content, tools or {})
        reasoning_calls = sum(self.count_calls(part) for part in reasoning_parts)
        reasoning = "".join(reasoning_parts) if reasoning_parts else None
        return ParseResult(
            content=content_text, reasoning=reasoning, calls=calls, reasoning_calls=reasoning_calls
        )

    @abc.abstractmethod
    def parse_calls(self, text: str, tools: ToolSchemas) -> tuple[str, list[ToolCall | MalformedCall]]:
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
        pattern = _reasoning_pattern(self.think_open, self.think_close)
        content_parts: list[str] = []
        pos = 0
        for match in pattern.finditer(text):
            content_parts.append(text[pos : match.start()])
            reasoning.append(match.group(1))
            pos = match.end()
        content_parts.append(text[pos:])
        return reasoning, "".join(content_parts)


class TaggedToolParser(ToolParser):
    """A format whose every call sits in its own ``open_tag ... close_tag`` block (Hermes, Qwen3-Coder, GLM).

    Subclasses implement :meth:`parse_body`; unclosed and stray tags are errors here, once for all formats.
    """

    open_tag: ClassVar[str] = "<tool_call>"
    close_tag: ClassVar[str] = "</tool_call>"

    def count_calls(self, text: str) -> int:
        return text.count(self.open_tag)

    @abc.abstractmethod
    def parse_body(self, body: str, tools: ToolSchemas) -> ToolCall | MalformedCall:
        """One call from the text between the tags."""

    def parse_calls(self, text: str, tools: ToolSchemas) -> tuple[str, list[ToolCall | MalformedCall]]:
        calls: list[ToolCall | MalformedCall] = []
        kept: list[str] = []
        for before, body in split_blocks(text, self.open_tag, self.close_tag):
            kept.append(before)
            if isinstance(body, str):
                calls.append(self.parse_body(body, tools))
            elif body is not None:
                calls.append(body)
        return "".join(kept).strip(), calls


def split_blocks(text: str, open_tag: str, close_tag: str) -> list[tuple[str, str | MalformedCall | None]]:
    """``text`` cut at its ``open_tag ... close_tag`` blocks: ``(text before the block, the block's body)``
    pairs, ending with ``(the rest, None)``. A stray ``close_tag``, or an ``open_tag`` that the next tag does
    not close, stands as a :class:`MalformedCall` in place of a body (the unclosed text is dropped): every
    format that wraps calls in tags reports them with the same words."""
    pattern = _tag_pattern(open_tag, close_tag)
    out: list[tuple[str, str | MalformedCall | None]] = []
    pos = 0
    while (match := pattern.search(text, pos)) is not None:
        before = text[pos : match.start()]
        if match.group() == close_tag:
            out.append(
                (
                    before,
                    MalformedCall("unclosed_tag", f"found {close_tag} without a matching {open_tag}", ""),
                )
            )
            pos = match.end()
            continue
        nxt = pattern.search(text, match.end())
        if nxt is None or nxt.group() != close_tag:
            end = nxt.start() if nxt else len(text)
            raw = text[match.start() : end]
            error = MalformedCall(
                "unclosed_tag", f"{open_tag} was not closed with {close_tag}: {clip(raw)}", raw
            )
            out.append((before, error))
            pos = end
            continue
        out.append((before, text[match.end() : nxt.start()]))
        pos = nxt.end()
    out.append((text[pos:], None))
    return out


# Built once per tag pair (a parser's tags are class constants): escaping and the re module's cache lookup
# were a tenth of the parse time of a tool-call turn.
@functools.cache
def _reasoning_pattern(think_open: str, think_close: str) -> re.Pattern[str]:
    return re.compile(re.escape(think_open) + r"(.*?)(?:" + re.escape(think_close) + r"|\Z)", re.S)


@functools.cache
def _tag_pattern(open_tag: str, close_tag: str) -> re.Pattern[str]:
    return re.compile(re.escape(open_tag) + "|" + re.escape(close_tag))


def clip(text: str) -> str:
    """``text`` short enough to quote in an error the model reads."""
    return text if len(text) <= _MAX_RAW_IN_MESSAGE else text[:_MAX_RAW_IN_MESSAGE] + "..."
