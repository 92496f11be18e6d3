"""GLM-4.5 / 4.6 (``glm45``) and GLM-4.7 / 5 (``glm47``) tool calls: a name and key/value tags::

    glm45:  <tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n</tool_call>
    glm47:  <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>

Format facts: the GLM-4.5/4.6 chat templates write ``'\\n<tool_call>' + name`` then one
``<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n`` per argument; GLM-4.7's writes the same tags with no
newlines. Both write a string value as is and any other value with ``tojson``, so the tool's schema says
which a value is (SGLang's ``glm45`` / ``glm47`` detectors do the same). A value that does not fit its
declared type is a ``bad_arguments`` error.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ._arguments import add_argument
from .base import MalformedCall, TaggedToolParser, ToolCall, ToolSchemas, clip

__all__ = ["Glm45ToolParser", "Glm47ToolParser"]

_KEY_OPEN, _KEY_CLOSE = "<arg_key>", "</arg_key>"
_VALUE_OPEN, _VALUE_CLOSE = "<arg_value>", "</arg_value>"


class Glm45ToolParser(TaggedToolParser):
    """Strict parser for GLM-4.5/4.6 calls: the name is followed by a newline."""

    name = "glm45"
    family = "GLM-4.5 / GLM-4.6"
    markers = ("<tool_call>", "</tool_call>", "<arg_key>", "<arg_value>")
    turn_starts = ("<|assistant|>",)
    name_separator: ClassVar[str] = "\n"

    def parse_body(self, body: str, tools: ToolSchemas) -> ToolCall | MalformedCall:
        first = body.find(_KEY_OPEN)
        head = body if first < 0 else body[:first]
        name = head.strip()
        if not name or any(c.isspace() or c in "<>" for c in name):
            return MalformedCall(
                "missing_name", f"expected a function name after <tool_call>: {clip(body)}", body
            )
        if not self._name_ok(head, name):
            separator = "a newline" if self.name_separator else "no whitespace"
            return MalformedCall(
                "missing_name",
                f"the function name {name!r} must be followed by {separator} ({self.name} format)",
                body,
                name,
            )
        arguments = _pairs(body[len(head) :], name, tools)
        if isinstance(arguments, MalformedCall):
            return MalformedCall(arguments.kind, arguments.message, body, name)
        return ToolCall(name=name, input=arguments, raw=body)

    def _name_ok(self, head: str, name: str) -> bool:
        return head.lstrip() == name + self.name_separator


class Glm47ToolParser(Glm45ToolParser):
    """Strict parser for GLM-4.7/5 calls: the name runs straight into the first ``<arg_key>``."""

    name = "glm47"
    family = "GLM-4.7 / GLM-5"
    name_separator = ""

    def _name_ok(self, head: str, name: str) -> bool:
        return head.strip() == name


def _pairs(text: str, name: str, tools: ToolSchemas) -> dict[str, Any] | MalformedCall:
    arguments: dict[str, Any] = {}
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return arguments
        key = _tag(text, pos, _KEY_OPEN, _KEY_CLOSE, name)
        if isinstance(key, MalformedCall):
            return key
        key_text, pos = key
        while pos < len(text) and text[pos].isspace():
            pos += 1
        value = _tag(text, pos, _VALUE_OPEN, _VALUE_CLOSE, name)
        if isinstance(value, MalformedCall):
            return value
        value_text, pos = value
        error = add_argument(arguments, key_text.strip(), value_text, call=name, tools=tools, noun="argument")
        if error is not None:
            return error


def _tag(text: str, pos: int, open_tag: str, close_tag: str, name: str) -> tuple[str, int] | MalformedCall:
    """The text of the ``open_tag ... close_tag`` element at ``pos`` and the position after it."""
    if not text.startswith(open_tag, pos):
        return MalformedCall(
            "bad_arguments", f"expected {open_tag} in the call to {name!r}, found {clip(text[pos:])!r}", ""
        )
    end = text.find(close_tag, pos)
    if end < 0:
        return MalformedCall(
            "unclosed_tag", f"{open_tag} was not closed with {close_tag} in the call to {name!r}", ""
        )
    return text[pos + len(open_tag) : end], end + len(close_tag)
