"""Mistral's array form: nothing but whitespace may follow the ``[TOOL_CALLS]`` JSON array (text after it is a
malformed call the model is told about, never a call that runs)."""

from __future__ import annotations

from slime_strands.tool_parsers import MalformedCall, ToolCall, get_tool_parser

ARRAY = '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}}]'


def test_an_array_alone_is_read():
    parsed = get_tool_parser("mistral").parse(ARRAY + "  \n", starts_in_reasoning=False, tools=None)
    assert [(c.name, c.input) for c in parsed.calls if isinstance(c, ToolCall)] == [("add", {"a": 1, "b": 2})]


def test_text_after_the_array_is_malformed():
    parsed = get_tool_parser("mistral").parse(ARRAY + " and 3", starts_in_reasoning=False, tools=None)
    assert len(parsed.calls) == 1 and isinstance(parsed.calls[0], MalformedCall), parsed.calls
    assert parsed.calls[0].kind == "bad_json" and "and 3" in parsed.calls[0].message
