"""Hermes / Qwen2.5 / Qwen3 tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Format facts: Qwen3's chat template renders ``tool_calls`` as ``<tool_call>\\n{"name": ..., "arguments": ...}
\\n</tool_call>``; SGLang's ``hermes`` / ``qwen25`` detectors read the same.
"""

from __future__ import annotations

from ._arguments import json_call, load_json_object
from .base import MalformedCall, TaggedToolParser, ToolCall, ToolSchemas

__all__ = ["HermesToolParser"]


class HermesToolParser(TaggedToolParser):
    """Strict parser for the JSON-in-tags format of Qwen3 / Hermes chat templates.

    Every ``<tool_call>`` must be closed and hold one JSON object with a non-empty string ``name`` and an
    object ``arguments``. Anything else becomes a :class:`MalformedCall` that says what was wrong.
    """

    name = "hermes"
    family = "Qwen2.5 / Qwen3 / Hermes"
    markers = ("<tool_call>", "</tool_call>")
    turn_starts = ("<|im_start|>assistant",)

    def parse_body(self, body: str, tools: ToolSchemas) -> ToolCall | MalformedCall:
        raw = body.strip()
        payload = load_json_object(raw, "the tool call")
        if isinstance(payload, MalformedCall):
            return payload
        return json_call(payload, raw, ("arguments",))
