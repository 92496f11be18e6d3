"""Formats whose calls are ``invoke`` elements with one ``parameter`` element per argument: MiniMax-M2 and
DeepSeek-V3.2 (DSML)::

    minimax-m2:   <minimax:tool_call>
                  <invoke name="NAME">
                  <parameter name="K">V</parameter>
                  </invoke>
                  </minimax:tool_call>
    deepseekv32:  <｜DSML｜function_calls>
                  <｜DSML｜invoke name="NAME">
                  <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>
                  </｜DSML｜invoke>
                  </｜DSML｜function_calls>

Format facts: MiniMax-M2's chat template writes a string value as is and any other value with ``tojson``, so the
tool's schema types a value (SGLang's ``minimax-m2`` detector does the same and drops the newlines around a
value). DeepSeek-V3.2 ships a Python encoder (``encoding_dsv32.py``), not a Jinja template: it writes
``string="true"`` and the value as is for a string, ``string="false"`` and the value as JSON for anything else
(SGLang's ``deepseekv32`` detector reads the same, and also an invoke whose body is one JSON object). Several
invokes may share one block; anything else between them is an error.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from ._arguments import add_argument, load_json_object
from .base import MalformedCall, ToolCall, ToolParser, ToolSchemas, clip, split_blocks

__all__ = ["DeepSeekV32ToolParser", "InvokeToolParser", "MinimaxM2ToolParser"]


class InvokeToolParser(ToolParser):
    """Calls ``<invoke name="NAME">`` + parameters + ``</invoke>`` inside ``block_open ... block_close``; a
    subclass names the tags and reads a parameter's value."""

    block_open: ClassVar[str]
    block_close: ClassVar[str]
    prefix: ClassVar[str] = ""
    """What the element names start with (``｜DSML｜`` for DeepSeek-V3.2)."""
    parameter_head: ClassVar[re.Pattern[str]]
    """A parameter's opening tag, its first group the parameter's name."""

    def count_calls(self, text: str) -> int:
        return max(text.count(f'<{self.prefix}invoke name="'), text.count(self.block_open))

    def parse_calls(self, text: str, tools: ToolSchemas) -> tuple[str, list[ToolCall | MalformedCall]]:
        calls: list[ToolCall | MalformedCall] = []
        kept: list[str] = []
        for before, body in split_blocks(text, self.block_open, self.block_close):
            kept.append(before)
            if isinstance(body, str):
                calls.extend(self._block(body, tools))
            elif body is not None:
                calls.append(body)
        return "".join(kept).strip(), calls

    def _block(self, body: str, tools: ToolSchemas) -> list[ToolCall | MalformedCall]:
        calls: list[ToolCall | MalformedCall] = []
        invoke_open, invoke_close = f'<{self.prefix}invoke name="', f"</{self.prefix}invoke>"
        for before, invoke in split_blocks(body, invoke_open, invoke_close):
            if before.strip():
                calls.append(
                    MalformedCall(
                        "bad_arguments", f"unexpected text between calls: {clip(before.strip())}", before
                    )
                )
            if isinstance(invoke, str):
                calls.append(self._invoke(invoke, tools))
            elif invoke is not None:
                calls.append(invoke)
        if not calls:
            calls.append(MalformedCall("missing_name", f"{self.block_open} holds no call", body))
        return calls

    def _invoke(self, body: str, tools: ToolSchemas) -> ToolCall | MalformedCall:
        name, sep, rest = body.partition('">')
        if not sep or not name or any(c.isspace() or c in '<>"' for c in name):
            return MalformedCall(
                "missing_name", f'expected <{self.prefix}invoke name="NAME">: {clip(body)}', body
            )
        arguments = self._parameters(rest, name, tools)
        if isinstance(arguments, MalformedCall):
            return MalformedCall(arguments.kind, arguments.message, body, name)
        return ToolCall(name=name, input=arguments, raw=body)

    def _parameters(self, text: str, name: str, tools: ToolSchemas) -> dict[str, Any] | MalformedCall:
        arguments: dict[str, Any] = {}
        close = f"</{self.prefix}parameter>"
        pos = 0
        while True:
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if pos == len(text):
                return arguments
            head = self.parameter_head.match(text, pos)
            if head is None:
                return MalformedCall(
                    "bad_arguments", f"unexpected text in the call to {name!r}: {clip(text[pos:])}", ""
                )
            end = text.find(close, head.end())
            if end < 0:
                return MalformedCall("unclosed_tag", f"{head.group()} was not closed with {close}", "")
            error = self.add_value(arguments, head, text[head.end() : end], name, tools)
            if error is not None:
                return error
            pos = end + len(close)

    def add_value(
        self, arguments: dict[str, Any], head: re.Match[str], value: str, call: str, tools: ToolSchemas
    ) -> MalformedCall | None:
        """Add the parameter ``head`` names with its text ``value``; the error when it does not fit."""
        return add_argument(
            arguments, head.group(1), value.strip("\n"), call=call, tools=tools, noun="parameter"
        )


class MinimaxM2ToolParser(InvokeToolParser):
    """Strict parser for MiniMax-M2 calls, values typed by the tool's schema."""

    name = "minimax-m2"
    family = "MiniMax-M2 / MiniMax-M2.1"
    markers = ("<minimax:tool_call>", "</minimax:tool_call>")
    turn_starts = ("]~b]ai",)
    block_open = "<minimax:tool_call>"
    block_close = "</minimax:tool_call>"
    parameter_head = re.compile(r'<parameter name="([^"<>]*)">')


class DeepSeekV32ToolParser(InvokeToolParser):
    """Strict parser for DeepSeek-V3.2 DSML calls: ``string="true"`` values as written, the others JSON."""

    name = "deepseekv32"
    family = "DeepSeek-V3.2"
    markers = ("｜DSML｜",)
    turn_starts = ("<｜Assistant｜>", "</function_results>")
    prefix = "｜DSML｜"
    block_open = "<｜DSML｜function_calls>"
    block_close = "</｜DSML｜function_calls>"
    parameter_head = re.compile(r'<｜DSML｜parameter name="([^"<>]*)" string="([^"<>]*)">')

    def _parameters(self, text: str, name: str, tools: ToolSchemas) -> dict[str, Any] | MalformedCall:
        if text.strip().startswith("{"):  # an invoke whose body is the arguments object
            return load_json_object(text.strip(), f"the arguments of the call to {name!r}", name)
        return super()._parameters(text, name, tools)

    def add_value(
        self, arguments: dict[str, Any], head: re.Match[str], value: str, call: str, tools: ToolSchemas
    ) -> MalformedCall | None:
        key, string = head.group(1), head.group(2)
        if not key or key in arguments:
            problem = "duplicate" if key else "empty"
            return MalformedCall(
                "bad_arguments", f"{problem} parameter name {key!r} in the call to {call!r}", ""
            )
        if string == "true":
            arguments[key] = value
            return None
        if string != "false":
            return MalformedCall(
                "bad_arguments",
                f'parameter {key!r} of the call to {call!r}: string="{string}" is not true or false',
                "",
            )
        try:
            arguments[key] = json.loads(value)
        except (json.JSONDecodeError, RecursionError) as exc:
            return MalformedCall(
                "bad_arguments",
                f'parameter {key!r} of the call to {call!r} (string="false") is not JSON ({exc}): {clip(value)}',
                "",
            )
        return None
