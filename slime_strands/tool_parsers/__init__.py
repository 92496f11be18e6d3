"""Tool-call parsers: model output text -> tool calls, strictly, behind a small registry.

Parsers are named exactly as SGLang's ``--tool-call-parser`` values, so one name configures both:
``hermes`` (Qwen2.5 / Qwen3), ``qwen3_coder`` (Qwen3-Coder, Qwen3.5, Qwen3.6), ``glm45`` (GLM-4.5 / 4.6),
``glm47`` (GLM-4.7 / 5), ``kimi_k2``, ``deepseekv31``, ``deepseekv3`` (DeepSeek-V3 / R1), ``deepseekv32``
(DeepSeek-V3.2's DSML), ``minimax-m2``, ``gpt-oss`` (harmony), ``mistral`` and ``llama3``.
``get_tool_parser(name)`` returns a new parser; ``register_tool_parser`` adds a format (``tool_parser: auto``
then considers it too).
"""

from __future__ import annotations

from ..errors import ConfigurationError
from .base import (
    MalformedCall,
    ParseErrorKind,
    ParseResult,
    TaggedToolParser,
    ToolCall,
    ToolCallError,
    ToolParser,
    ToolSchemas,
)
from .glm import Glm45ToolParser, Glm47ToolParser
from .harmony import GptOssToolParser
from .hermes import HermesToolParser
from .invoke import DeepSeekV32ToolParser, InvokeToolParser, MinimaxM2ToolParser
from .llama3 import Llama3ToolParser
from .mistral import MistralToolParser
from .qwen3_coder import Qwen3CoderToolParser
from .sectioned import DeepSeekV3ToolParser, DeepSeekV31ToolParser, KimiK2ToolParser, SectionedToolParser

__all__ = [
    "AUTO",
    "DeepSeekV3ToolParser",
    "DeepSeekV31ToolParser",
    "DeepSeekV32ToolParser",
    "Glm45ToolParser",
    "Glm47ToolParser",
    "GptOssToolParser",
    "HermesToolParser",
    "InvokeToolParser",
    "KimiK2ToolParser",
    "Llama3ToolParser",
    "MalformedCall",
    "MinimaxM2ToolParser",
    "MistralToolParser",
    "ParseErrorKind",
    "ParseResult",
    "Qwen3CoderToolParser",
    "SectionedToolParser",
    "TaggedToolParser",
    "ToolCall",
    "ToolCallError",
    "ToolParser",
    "ToolSchemas",
    "get_tool_parser",
    "register_tool_parser",
    "registered_tool_parsers",
]

AUTO = "auto"
"""The ``tool_parser`` value that picks the parser from the tokenizer (``slime_strands.template.probe``)."""

_REGISTRY: dict[str, type[ToolParser]] = {}


def register_tool_parser(cls: type[ToolParser]) -> type[ToolParser]:
    """Register a parser class under its ``name`` (usable as a class decorator)."""
    if cls.name == AUTO:
        raise ConfigurationError(f"{AUTO!r} is reserved for choosing the parser from the tokenizer")
    _REGISTRY[cls.name] = cls
    return cls


def registered_tool_parsers() -> list[str]:
    """Registered names, in registration order (the order ``auto`` tries them in)."""
    return list(_REGISTRY)


def get_tool_parser(name: str) -> ToolParser:
    """A new parser instance by registered name."""
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ConfigurationError(
            f"unknown tool parser {name!r}; choose {AUTO!r} or one of {registered_tool_parsers()}"
        ) from None


# glm45 before glm47: a GLM-4.5 rendering (newline after the name) is also valid glm47 text.
for _parser in (
    HermesToolParser,
    Qwen3CoderToolParser,
    Glm45ToolParser,
    Glm47ToolParser,
    KimiK2ToolParser,
    DeepSeekV31ToolParser,
    DeepSeekV3ToolParser,
    DeepSeekV32ToolParser,
    MinimaxM2ToolParser,
    GptOssToolParser,
    MistralToolParser,
    Llama3ToolParser,
):
    register_tool_parser(_parser)
