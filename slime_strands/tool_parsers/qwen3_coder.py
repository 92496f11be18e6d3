"""Qwen3-Coder / Qwen3.5 / Qwen3.6 tool calls: XML-style functions and parameters inside ``<tool_call>``::

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

Format facts: the Qwen3-Coder chat template writes each value on its own line (one newline after the
opening tag and before the closing one, both dropped when reading), a string as is and ANY other value with
Jinja's ``string`` filter, i.e. Python's ``str()``: ``{'a': 1, 'b': [1, 2]}``, ``[1, 'x']``, ``True``, ``None``
(later Qwen3-Coder / Qwen3.5 templates write mappings and lists, or every non-string, with ``tojson``). So a
value is read by the tool's JSON schema as JSON or as a Python literal (``ast.literal_eval``: literals only,
never code), as SGLang's ``qwen3_coder`` detector does; a value that does not fit the schema is a
``bad_arguments`` error. ``None`` / ``null`` is None where the schema allows null, else the text of a string
parameter (see ``_arguments``).
"""

from __future__ import annotations

from typing import Any

from ._arguments import add_argument
from .base import MalformedCall, ParseErrorKind, TaggedToolParser, ToolCall, ToolSchemas, clip

__all__ = ["Qwen3CoderToolParser"]

_FUNCTION_OPEN, _FUNCTION_CLOSE = "<function=", "</function>"
_PARAMETER_OPEN, _PARAMETER_CLOSE = "<parameter=", "</parameter>"


class Qwen3CoderToolParser(TaggedToolParser):
    """Strict parser for ``<tool_call><function=...><parameter=...>`` calls, values typed by the schema."""

    name = "qwen3_coder"
    family = "Qwen3-Coder / Qwen3.5 / Qwen3.6"
    markers = ("<tool_call>", "</tool_call>")
    turn_starts = ("<|im_start|>assistant",)

    def parse_body(self, body: str, tools: ToolSchemas) -> ToolCall | MalformedCall:
        raw = body.strip()
        if not raw.startswith(_FUNCTION_OPEN) or ">" not in raw:
            return MalformedCall(
                "missing_name", f"expected <function=NAME> inside <tool_call>: {clip(raw)}", raw
            )
        head_end = raw.index(">")
        name = raw[len(_FUNCTION_OPEN) : head_end]
        if not name or any(c.isspace() or c in "<=" for c in name):
            return MalformedCall("missing_name", f"invalid function name {clip(name)!r}: {clip(raw)}", raw)
        if not raw.endswith(_FUNCTION_CLOSE):
            return MalformedCall(
                "unclosed_tag", f"<function={name}> was not closed with {_FUNCTION_CLOSE}", raw, name
            )
        arguments = _parameters(raw[head_end + 1 : -len(_FUNCTION_CLOSE)], name, tools)
        if isinstance(arguments, MalformedCall):
            return MalformedCall(arguments.kind, arguments.message, raw, name)
        return ToolCall(name=name, input=arguments, raw=raw)


def _parameters(text: str, name: str, tools: ToolSchemas) -> dict[str, Any] | MalformedCall:
    """The call's arguments, or why they are malformed (``raw`` is filled in by the caller)."""
    arguments: dict[str, Any] = {}
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return arguments
        if not text.startswith(_PARAMETER_OPEN, pos) or ">" not in text[pos:]:
            return _error("bad_arguments", f"unexpected text in the call to {name!r}: {clip(text[pos:])}")
        head_end = text.index(">", pos)
        key = text[pos + len(_PARAMETER_OPEN) : head_end]
        end = text.find(_PARAMETER_CLOSE, head_end)
        following = text.find(_PARAMETER_OPEN, head_end)
        if end < 0 or 0 <= following < end:
            return _error("unclosed_tag", f"<parameter={key}> was not closed with {_PARAMETER_CLOSE}")
        value = text[head_end + 1 : end]
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        error = add_argument(
            arguments, key, value, call=name, tools=tools, noun="parameter", python_literals=True
        )
        if error is not None:
            return error
        pos = end + len(_PARAMETER_CLOSE)


def _error(kind: ParseErrorKind, message: str) -> MalformedCall:
    return MalformedCall(kind, message, "")
