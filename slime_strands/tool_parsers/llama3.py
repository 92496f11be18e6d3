"""Llama 3.x tool calls: JSON objects after ``<|python_tag|>`` (or a turn that starts with ``{``), ``;`` between::

    <|python_tag|>{"name": "add", "parameters": {"a": 1}}; {"name": "mul", "arguments": {"b": 2}}

Format facts: Llama 3.2's chat template asks for ``{"name": function name, "parameters": dictionary}`` and
renders a call as that JSON right after the assistant header (no tag); SGLang's ``llama3`` detector reads
calls after ``<|python_tag|>`` or from a turn that starts with ``{``, takes ``parameters`` or ``arguments``,
and splits parallel calls on ``;``.
"""

from __future__ import annotations

import json

from ._arguments import json_call, json_error, json_object
from .base import MalformedCall, ToolCall, ToolParser, ToolSchemas, clip

__all__ = ["Llama3ToolParser"]

_TAG = "<|python_tag|>"
_SEPARATOR = ";"
_ARGUMENT_KEYS = ("parameters", "arguments")  # either one, not both


class Llama3ToolParser(ToolParser):
    """Strict parser for Llama 3 JSON calls; anything after the calls that is not a call is an error."""

    name = "llama3"
    family = "Llama 3.1 / 3.2 / 3.3"
    markers = ("<|python_tag|>", "<|eom_id|>")
    turn_starts = ("<|start_header_id|>assistant<|end_header_id|>",)

    def count_calls(self, text: str) -> int:
        return text.count(_TAG) or int(text.lstrip().startswith("{"))

    def parse_calls(self, text: str, tools: ToolSchemas) -> tuple[str, list[ToolCall | MalformedCall]]:
        if _TAG in text:
            content, _, action = text.partition(_TAG)
        elif text.lstrip().startswith("{"):
            content, action = "", text
        else:
            return text.strip(), []
        return content.strip(), _calls(action)


def _calls(action: str) -> list[ToolCall | MalformedCall]:
    decoder = json.JSONDecoder()
    calls: list[ToolCall | MalformedCall] = []
    pos = 0
    while True:
        while pos < len(action) and action[pos].isspace():
            pos += 1
        if pos == len(action):
            return calls
        try:
            payload, end = decoder.raw_decode(action, pos)
        except (json.JSONDecodeError, RecursionError) as exc:
            return [*calls, json_error(exc, "the tool call", action[pos:])]
        raw = action[pos:end]
        call = json_object(payload, "the tool call", raw)
        calls.append(call if isinstance(call, MalformedCall) else json_call(call, raw, _ARGUMENT_KEYS))
        pos = end
        while pos < len(action) and action[pos].isspace():
            pos += 1
        if pos < len(action):
            if action[pos] != _SEPARATOR:
                raw = action[pos:]
                return [
                    *calls,
                    MalformedCall(
                        "bad_json", f"expected {_SEPARATOR!r} between tool calls, found {clip(raw)}", raw
                    ),
                ]
            pos += 1
