"""The strict Hermes (Qwen3) tool-call parser and the parser registry."""

from __future__ import annotations

import pytest
from helpers import BAD_CALLS, call_text

from slime_strands.errors import ConfigurationError
from slime_strands.tool_parsers import (
    HermesToolParser,
    MalformedCall,
    ParseResult,
    ToolCall,
    ToolParser,
    get_tool_parser,
    register_tool_parser,
    registered_tool_parsers,
)

ADD = call_text("add", {"a": 2, "b": 3})
MUL = call_text("mul", {"x": [1, 2], "y": {"z": "é"}})


@pytest.fixture
def parser() -> HermesToolParser:
    return HermesToolParser()


def test_plain_text(parser):
    result = parser.parse("Just an answer.")
    assert result == ParseResult(content="Just an answer.", reasoning=None, calls=[], reasoning_calls=0)


def test_single_call(parser):
    result = parser.parse(ADD)
    assert result.content == ""
    assert result.calls == [
        ToolCall(name="add", input={"a": 2, "b": 3}, raw='{"name": "add", "arguments": {"a": 2, "b": 3}}')
    ]


def test_multiple_calls_in_order(parser):
    result = parser.parse(f"{ADD}\n{MUL}\n{ADD}")
    assert [c.name for c in result.calls] == ["add", "mul", "add"]
    assert result.calls[1].input == {"x": [1, 2], "y": {"z": "é"}}
    assert result.content == ""


def test_text_around_calls(parser):
    result = parser.parse(f"Let me compute.\n{ADD}\nand then\n{MUL}\nDone.")
    assert [c.name for c in result.calls] == ["add", "mul"]
    assert "Let me compute." in result.content and "and then" in result.content and "Done." in result.content
    assert "<tool_call>" not in result.content and "</tool_call>" not in result.content


def test_compact_json_without_newlines(parser):
    result = parser.parse('<tool_call>{"name":"add","arguments":{"a":1,"b":2}}</tool_call>')
    assert result.calls == [ToolCall("add", {"a": 1, "b": 2}, '{"name":"add","arguments":{"a":1,"b":2}}')]


def _only_error(result: ParseResult) -> MalformedCall:
    assert len(result.calls) == 1 and isinstance(result.calls[0], MalformedCall), result.calls
    return result.calls[0]


def test_bad_json(parser):
    error = _only_error(parser.parse(BAD_CALLS["bad_json"].raw))
    assert error.kind == "bad_json"
    assert "not valid JSON" in error.message and '{"name": "add", "arguments": {"a": 2}' in error.message


@pytest.mark.parametrize(
    "body",
    ["[" * 100_000 + "]" * 100_000, '{"name": "add", "arguments": ' + '{"a": ' * 50_000 + "1" + "}" * 50_001],
)
def test_deeply_nested_json_is_a_parse_error(parser, body):
    error = _only_error(parser.parse(f"<tool_call>\n{body}\n</tool_call>"))
    assert error.kind == "bad_json" and "nested too deeply" in error.message and len(error.message) < 1000


@pytest.mark.timeout(10)  # a hang guard for hostile markup
def test_thousands_of_tags(parser):
    unclosed = parser.parse("<tool_call>" * 20_000).calls  # SGLangModel caps what runs per turn
    assert len(unclosed) == 20_000 and {c.kind for c in unclosed} == {"unclosed_tag"}
    assert len(parser.parse("<tool_call>{}</tool_call>" * 5_000).calls) == 5_000
    assert parser.parse("<think>" + "<tool_call>{}</tool_call>" * 5_000).reasoning_calls == 5_000


@pytest.mark.parametrize("body", ['["add", {"a": 1}]', '"add"', "42", "null"])
def test_non_object_json(parser, body):
    error = _only_error(parser.parse(f"<tool_call>\n{body}\n</tool_call>"))
    assert error.kind == "bad_json" and "must be a JSON object" in error.message


@pytest.mark.parametrize(
    "body", ['{"arguments": {}}', '{"name": "", "arguments": {}}', '{"name": 3, "arguments": {}}']
)
def test_missing_name(parser, body):
    error = _only_error(parser.parse(f"<tool_call>\n{body}\n</tool_call>"))
    assert error.kind == "missing_name" and '"name"' in error.message


def test_arguments_missing(parser):
    error = _only_error(parser.parse('<tool_call>\n{"name": "add"}\n</tool_call>'))
    assert error.kind == "bad_arguments" and error.name == "add" and 'no "arguments"' in error.message


@pytest.mark.parametrize(
    ("arguments", "type_name"), [('"a=1"', "str"), ("[1, 2]", "list"), ("null", "NoneType")]
)
def test_arguments_not_an_object(parser, arguments, type_name):
    error = _only_error(
        parser.parse(f'<tool_call>\n{{"name": "add", "arguments": {arguments}}}\n</tool_call>')
    )
    assert error.kind == "bad_arguments" and error.name == "add"
    assert "must be a JSON object" in error.message and type_name in error.message


def test_unclosed_tag(parser):
    error = _only_error(parser.parse('Sure.\n<tool_call>\n{"name": "add", "arguments": {}}'))
    assert error.kind == "unclosed_tag" and "was not closed" in error.message


def test_unclosed_tag_followed_by_a_valid_call(parser):
    result = parser.parse('<tool_call>\n{"name": "add"\n' + ADD)
    assert [type(c).__name__ for c in result.calls] == ["MalformedCall", "ToolCall"]
    assert result.calls[0].kind == "unclosed_tag" and result.calls[1].name == "add"


def test_stray_close_tag(parser):
    result = parser.parse(f"Hmm </tool_call> {ADD}")
    assert result.calls[0].kind == "unclosed_tag" and "without a matching" in result.calls[0].message
    assert result.calls[1].name == "add"


def test_long_raw_is_clipped_in_the_message(parser):
    error = _only_error(parser.parse("<tool_call>\n{" + "x" * 5000 + "\n</tool_call>"))
    assert len(error.message) < 700 and error.message.endswith("...")
    assert len(error.raw) > 5000


def test_calls_inside_think_are_not_returned(parser):
    text = f"<think>\nmaybe {ADD} or {MUL}\n</think>\n\nThe answer."
    result = parser.parse(text)
    assert result.calls == [] and result.reasoning_calls == 2
    assert result.reasoning == f"\nmaybe {ADD} or {MUL}\n"
    assert result.content == "The answer."


def test_call_after_think_is_returned(parser):
    result = parser.parse(f"<think>\ndraft {ADD}\n</think>\n\n{MUL}")
    assert [c.name for c in result.calls] == ["mul"] and result.reasoning_calls == 1


def test_unclosed_think_is_all_reasoning(parser):
    result = parser.parse(f"<think>\nstill thinking {ADD}")
    assert result.calls == [] and result.reasoning_calls == 1 and result.content == ""


def test_starts_in_reasoning_with_close(parser):
    result = parser.parse(f"I could call {ADD} hmm\n</think>\n\nAnswer: 5", starts_in_reasoning=True)
    assert result.calls == [] and result.reasoning_calls == 1
    assert result.reasoning == f"I could call {ADD} hmm\n"
    assert result.content == "Answer: 5"


def test_starts_in_reasoning_then_call(parser):
    result = parser.parse(f"plan {ADD}\n</think>\n\n{MUL}", starts_in_reasoning=True)
    assert [c.name for c in result.calls] == ["mul"] and result.reasoning_calls == 1


def test_starts_in_reasoning_without_close(parser):
    result = parser.parse(f"I could call {ADD} and more", starts_in_reasoning=True)
    assert result.calls == [] and result.reasoning_calls == 1 and result.content == ""
    assert result.reasoning == f"I could call {ADD} and more"


def test_not_starting_in_reasoning_a_stray_think_close_is_text(parser):
    result = parser.parse(f"hmm</think> {ADD}")
    assert [c.name for c in result.calls] == ["add"] and result.reasoning is None


def test_registry_get_register_unknown(monkeypatch):
    import slime_strands.tool_parsers as registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # leave the real registry untouched
    assert isinstance(get_tool_parser("hermes"), HermesToolParser)
    assert get_tool_parser("hermes") is not get_tool_parser("hermes"), "a new instance each time"
    with pytest.raises(
        ConfigurationError, match=r"unknown tool parser 'nope'; choose 'auto' or one of .*hermes"
    ):
        get_tool_parser("nope")

    @register_tool_parser
    class PipeParser(ToolParser):
        name = "pipe-test"

        def parse_calls(self, text, tools):
            calls = [ToolCall(name=p.strip(), input={}, raw=p) for p in text.split("|")[1:]]
            return text.split("|")[0], calls

        def count_calls(self, text):
            return text.count("|")

    parser = get_tool_parser("pipe-test")
    assert isinstance(parser, PipeParser)
    result = parser.parse("<think>x|y</think>hi|a|b")
    assert [c.name for c in result.calls] == ["a", "b"] and result.reasoning_calls == 1
    assert "pipe-test" in registered_tool_parsers()

    class Auto(PipeParser):
        name = "auto"

    with pytest.raises(ConfigurationError, match="reserved"):
        register_tool_parser(Auto)
