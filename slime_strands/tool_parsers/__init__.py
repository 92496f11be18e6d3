"""Tool-call parsers: model output text -> tool calls, strictly, behind a small registry.

``get_tool_parser("hermes")`` returns a parser; ``register_tool_parser`` adds a format.
"""

from __future__ import annotations

from .base import ParseErrorKind, ParseResult, ToolCall, ToolCallError, ToolParser
from .hermes import HermesToolParser

__all__ = [
    "HermesToolParser",
    "ParseErrorKind",
    "ParseResult",
    "ToolCall",
    "ToolCallError",
    "ToolParser",
    "get_tool_parser",
    "register_tool_parser",
]

_REGISTRY: dict[str, type[ToolParser]] = {}


def register_tool_parser(cls: type[ToolParser]) -> type[ToolParser]:
    """Register a parser class under its ``name`` (usable as a class decorator)."""
    _REGISTRY[cls.name] = cls
    return cls


def get_tool_parser(name: str) -> ToolParser:
    """A new parser instance by registered name."""
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; registered: {sorted(_REGISTRY)}") from None


register_tool_parser(HermesToolParser)
