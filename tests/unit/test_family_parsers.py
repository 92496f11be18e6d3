"""The strict parsers of every family (named as SGLang's --tool-call-parser values), on the exact text each
family's model writes (format facts: SGLang's function_call detectors and the vendors' chat templates)."""

from __future__ import annotations

import pytest
from family_kit import FAMILIES, Call, Turn

from slime_strands.tool_parsers import (
    DeepSeekV31ToolParser,
    Glm45ToolParser,
    Glm47ToolParser,
    KimiK2ToolParser,
    Llama3ToolParser,
    MalformedCall,
    Qwen3CoderToolParser,
    ToolCall,
    get_tool_parser,
)

SCHEMAS = {
    "add": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    "mix": {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "x": {"type": "number"},
            "flag": {"type": "boolean"},
            "s": {"type": "string"},
            "items": {"type": "array"},
            "cfg": {"type": "object"},
            "maybe": {"type": ["integer", "null"]},
            "choice": {"enum": ["a", "b"]},
        },
    },
}
MIX = {
    "n": 7,
    "x": 2.5,
    "flag": True,
    "s": "42",
    "items": [1, "two"],
    "cfg": {"k": "é"},
    "maybe": None,
    "choice": "a",
}


def _calls(parser, text, **kwargs):
    return parser.parse(text, tools=SCHEMAS, **kwargs).calls


def _only_error(calls) -> MalformedCall:
    assert len(calls) == 1 and isinstance(calls[0], MalformedCall), calls
    return calls[0]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_reads_its_own_calls_back(name):
    family = FAMILIES[name]
    parser = get_tool_parser(family.name)
    turn = Turn(content="Let me see.", calls=[Call("add", {"a": 2, "b": 3}), Call("mix", MIX)])
    result = parser.parse(
        family.text(turn, 4), tools=SCHEMAS, starts_in_reasoning=family.prompt_opens_reasoning
    )
    assert [(c.name, c.input) for c in result.calls] == [("add", {"a": 2, "b": 3}), ("mix", MIX)]
    assert result.content == "Let me see."
    if name == "kimi_k2":
        assert [c.id for c in result.calls] == ["functions.add:4", "functions.mix:5"]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_ignores_calls_inside_reasoning(name):
    family = FAMILIES[name]
    turn = Turn(content="Done.", reasoning="maybe", reasoning_calls=[Call("add", {"a": 1, "b": 2})] * 2)
    result = get_tool_parser(name).parse(
        family.text(turn), tools=SCHEMAS, starts_in_reasoning=family.prompt_opens_reasoning
    )
    assert result.calls == [] and result.reasoning_calls == 2 and result.content == "Done."


@pytest.mark.parametrize(
    ("name", "case"), [(n, c) for n, f in sorted(FAMILIES.items()) for c in sorted(f.bad_calls)]
)
def test_every_malformed_call_is_an_error_of_its_kind(name, case):
    bad = FAMILIES[name].bad_calls[case]
    result = get_tool_parser(name).parse(bad.raw, tools=SCHEMAS)
    if bad.kind == "unknown_tool":  # well-formed: the policy, not the parser, rejects the name
        assert [c.name for c in result.calls] == ["subtract"]
        return
    error = _only_error(result.calls)
    assert error.kind == bad.kind and error.message


# -- qwen3_coder ---------------------------------------------------------------------------------


def test_qwen3_coder_converts_values_by_schema():
    text = (
        "<tool_call>\n<function=mix>\n<parameter=n>\n7\n</parameter>\n<parameter=x>\n2.5\n</parameter>\n"
        "<parameter=flag>\nTrue\n</parameter>\n<parameter=s>\n42\n</parameter>\n"
        '<parameter=items>\n[1, "two"]\n</parameter>\n<parameter=cfg>\n{"k": "é"}\n</parameter>\n'
        "<parameter=maybe>\nnull\n</parameter>\n<parameter=choice>\na\n</parameter>\n</function>\n</tool_call>"
    )
    (call,) = _calls(Qwen3CoderToolParser(), text)
    assert call == ToolCall("mix", MIX, call.raw)
    assert isinstance(call.input["n"], int) and isinstance(call.input["s"], str)


def test_qwen3_coder_reads_values_as_its_template_writes_them_with_jinja_string():
    """The vendor's template writes every non-string value with Jinja's ``string`` filter: Python's str()."""
    value = {"k": 'it\'s "é"', "n": [1, 2.5, None, True], "deep": {"x": [[{}]]}}
    text = (
        "<tool_call>\n<function=mix>\n"
        f"<parameter=cfg>\n{value}\n</parameter>\n<parameter=items>\n{[1, 'x', False]}\n</parameter>\n"
        f"<parameter=flag>\n{True}\n</parameter>\n<parameter=maybe>\n{None}\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    (call,) = _calls(Qwen3CoderToolParser(), text)
    assert call.input == {"cfg": value, "items": [1, "x", False], "flag": True, "maybe": None}


def test_qwen3_coder_python_literals_never_run_code():
    ran = []
    hostile = "__import__('builtins').print('ran') or [ran.append(1)]"
    for parameter in ("cfg", "items"):
        text = f"<tool_call>\n<function=mix>\n<parameter={parameter}>\n{hostile}\n</parameter>\n</function>\n</tool_call>"
        assert _only_error(_calls(Qwen3CoderToolParser(), text)).kind == "bad_arguments"
    deep = "[" * 100_000 + "]" * 100_000
    text = f"<tool_call>\n<function=mix>\n<parameter=items>\n{deep}\n</parameter>\n</function>\n</tool_call>"
    assert _only_error(_calls(Qwen3CoderToolParser(), text)).kind == "bad_arguments"
    huge = "[" + "9" * 10_000 + "]"
    text = f"<tool_call>\n<function=mix>\n<parameter=items>\n{huge}\n</parameter>\n</function>\n</tool_call>"
    assert _only_error(_calls(Qwen3CoderToolParser(), text)).kind == "bad_arguments"
    assert ran == []


NULLABLE = {
    "opt": {
        "type": "object",
        "properties": {
            "either": {"type": ["string", "null"]},
            "text": {"type": "string"},
            "defaulted": {"type": "string", "default": None},
            "any_of": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "free": {},
        },
    }
}


@pytest.mark.parametrize(
    ("parameter", "written", "expected"),
    [
        ("either", "None", None),
        ("either", "null", None),
        ("either", "Nonesuch", "Nonesuch"),
        ("text", "None", "None"),  # a plain string parameter: the schema says it is the text
        ("text", "null", "null"),
        ("defaulted", "None", None),  # Strands writes `x: str | None = None` with a null default
        ("any_of", "None", None),
        ("any_of", "3", 3),
        ("free", "None", None),
        ("free", "{'a': [1]}", {"a": [1]}),
        ("free", "True", True),
        ("free", "hello", "hello"),
        ("free", "'quoted'", "'quoted'"),
    ],
)
def test_qwen3_coder_null_is_decided_by_the_schema(parameter, written, expected):
    text = f"<tool_call>\n<function=opt>\n<parameter={parameter}>\n{written}\n</parameter>\n</function>\n</tool_call>"
    (call,) = Qwen3CoderToolParser().parse(text, tools=NULLABLE).calls
    assert isinstance(call, ToolCall) and call.input == {parameter: expected}


def test_glm_reads_json_only_as_its_template_writes_tojson():
    python = "<tool_call>mix<arg_key>cfg</arg_key><arg_value>{'k': 1}</arg_value></tool_call>"
    error = _only_error(_calls(Glm47ToolParser(), python))
    assert "expected an object (JSON), got" in error.message
    json_text = '<tool_call>mix<arg_key>cfg</arg_key><arg_value>{"k": 1}</arg_value></tool_call>'
    assert _calls(Glm47ToolParser(), json_text)[0].input == {"cfg": {"k": 1}}


def test_qwen3_coder_keeps_multiline_string_values():
    text = "<tool_call>\n<function=run>\n<parameter=code>\nprint(1)\n\nprint(2)\n</parameter>\n</function>\n</tool_call>"
    (call,) = _calls(Qwen3CoderToolParser(), text)
    assert call.input == {"code": "print(1)\n\nprint(2)"}


@pytest.mark.parametrize(
    ("parameter", "value", "reason"),
    [
        ("n", "seven", "expected an integer"),
        ("n", "7.5", "expected an integer"),
        ("x", "fast", "expected a number"),
        ("flag", "yes", "expected true or false"),
        ("items", "{}", "expected an array (JSON or a Python literal)"),
        ("cfg", "[1]", "expected an object (JSON or a Python literal)"),
        ("cfg", "{1: 2}", "expected an object"),
        ("items", "(1, 2)", "expected an array"),
        ("items", "{1, 2}", "expected an array"),
        ("cfg", "{'k': b'x'}", "expected an object"),
        ("cfg", "{'k': 1j}", "expected an object"),
        ("n", "None", "expected an integer"),
        ("flag", "null", "expected true or false"),
    ],
)
def test_qwen3_coder_value_that_does_not_fit_the_schema(parameter, value, reason):
    text = f"<tool_call>\n<function=mix>\n<parameter={parameter}>\n{value}\n</parameter>\n</function>\n</tool_call>"
    error = _only_error(_calls(Qwen3CoderToolParser(), text))
    assert error.kind == "bad_arguments" and error.name == "mix"
    assert f"argument '{parameter}' of the call to 'mix': {reason}" in error.message


@pytest.mark.parametrize(
    ("body", "kind", "message"),
    [
        ("<function=add>\n<parameter=a>\n1\n</parameter>\n", "unclosed_tag", "not closed with </function>"),
        (
            "<function=add>\n<parameter=a>\n1\n<parameter=b>\n2\n</parameter>\n</function>",
            "unclosed_tag",
            "<parameter=a>",
        ),
        ("<function=add>\nhello\n</function>", "bad_arguments", "unexpected text"),
        (
            "<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n</function>",
            "bad_arguments",
            "duplicate",
        ),
        ("<function=>\n</function>", "missing_name", "invalid function name"),
        ('{"name": "add", "arguments": {}}', "missing_name", "expected <function=NAME>"),
    ],
)
def test_qwen3_coder_malformed(body, kind, message):
    error = _only_error(_calls(Qwen3CoderToolParser(), f"<tool_call>\n{body}\n</tool_call>"))
    assert error.kind == kind and message in error.message


# -- glm45 / glm47 -------------------------------------------------------------------------------


def test_glm45_reads_the_template_rendering_and_types_values():
    text = (
        "<tool_call>mix\n<arg_key>n</arg_key>\n<arg_value>7</arg_value>\n<arg_key>s</arg_key>\n<arg_value>42</arg_value>\n"
        '<arg_key>items</arg_key>\n<arg_value>[1, "two"]</arg_value>\n<arg_key>flag</arg_key>\n<arg_value>true</arg_value>\n'
        "</tool_call>"
    )
    (call,) = _calls(Glm45ToolParser(), text)
    assert call.input == {"n": 7, "s": "42", "items": [1, "two"], "flag": True}


def test_glm45_needs_the_newline_after_the_name_glm47_does_not():
    compact = "<tool_call>add<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>"
    assert _only_error(_calls(Glm45ToolParser(), compact)).kind == "missing_name"
    assert _calls(Glm47ToolParser(), compact) == [ToolCall("add", {"a": 1}, compact[11:-12])]
    newline = "<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>"
    assert [c.input for c in _calls(Glm47ToolParser(), newline)] == [{"a": 1}]


def test_glm_without_arguments_and_undeclared_values():
    assert _calls(Glm45ToolParser(), "<tool_call>ping\n</tool_call>")[0].input == {}
    (call,) = _calls(
        Glm47ToolParser(),
        "<tool_call>other<arg_key>k</arg_key><arg_value>[1]</arg_value><arg_key>t</arg_key><arg_value>hi</arg_value></tool_call>",
    )
    assert call.input == {"k": [1], "t": "hi"}, "without a schema: JSON when it is JSON, else the text"


@pytest.mark.parametrize(
    ("body", "kind", "message"),
    [
        ("add<arg_key>a</arg_key><arg_value>x</arg_value>", "bad_arguments", "expected an integer"),
        ("add<arg_key>a</arg_key>", "bad_arguments", "expected <arg_value>"),
        ("add<arg_key>a</arg_key><arg_value>1", "unclosed_tag", "<arg_value> was not closed"),
        (
            "add<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>a</arg_key><arg_value>2</arg_value>",
            "bad_arguments",
            "duplicate",
        ),
        ("add junk<arg_key>a</arg_key><arg_value>1</arg_value>", "missing_name", "expected a function name"),
        ("<arg_key>a</arg_key><arg_value>1</arg_value>", "missing_name", "expected a function name"),
    ],
)
def test_glm47_malformed(body, kind, message):
    error = _only_error(_calls(Glm47ToolParser(), f"<tool_call>{body}</tool_call>"))
    assert error.kind == kind and message in error.message


# -- kimi_k2 / deepseekv31 -----------------------------------------------------------------------

KIMI = "<|tool_calls_section_begin|>{}<|tool_calls_section_end|>"
KIMI_CALL = "<|tool_call_begin|>{}<|tool_call_argument_begin|>{}<|tool_call_end|>"


def test_kimi_keeps_the_call_id_and_accepts_a_bare_name_id():
    text = "Sure." + KIMI.format(
        KIMI_CALL.format("functions.add:0", '{"a": 1}') + KIMI_CALL.format(" add:1 ", "{}")
    )
    result = KimiK2ToolParser().parse(text)
    assert [(c.name, c.input, c.id) for c in result.calls] == [
        ("add", {"a": 1}, "functions.add:0"),
        ("add", {}, "add:1"),
    ]
    assert result.content == "Sure."


@pytest.mark.parametrize(
    ("section", "kind", "message"),
    [
        (KIMI_CALL.format("add", "{}"), "missing_name", "functions.NAME:INDEX"),
        (KIMI_CALL.format("functions.add:0", "[1]"), "bad_arguments", "must be a JSON object"),
        (KIMI_CALL.format("functions.add:0", "{"), "bad_json", "not valid JSON"),
        (
            '<|tool_call_begin|>functions.add:0{"a": 1}<|tool_call_end|>',
            "bad_arguments",
            "<|tool_call_argument_begin|>",
        ),
        ("<|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>{}", "unclosed_tag", "not closed"),
        ("junk", "bad_arguments", "unexpected text"),
    ],
)
def test_kimi_malformed(section, kind, message):
    error = _only_error(KimiK2ToolParser().parse(KIMI.format(section)).calls)
    assert error.kind == kind and message in error.message


def test_kimi_unclosed_section_runs_nothing_and_stray_calls_are_errors():
    unclosed = "<|tool_calls_section_begin|>" + KIMI_CALL.format("functions.add:0", "{}")
    error = _only_error(KimiK2ToolParser().parse(unclosed).calls)
    assert error.kind == "unclosed_tag" and "<|tool_calls_section_begin|> was not closed" in error.message
    stray = KimiK2ToolParser().parse("Hmm " + KIMI_CALL.format("functions.add:0", "{}"))
    assert _only_error(stray.calls).kind == "unclosed_tag" and "<|tool_call_begin|>" not in stray.content


def test_deepseek_reads_parallel_calls_and_errors():
    call = "<｜tool▁call▁begin｜>{}<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
    text = (
        "Ok.<｜tool▁calls▁begin｜>"
        + call.format("add", '{"a": 1}')
        + call.format("mul", '{"b": 2}')
        + "<｜tool▁calls▁end｜>"
    )
    result = DeepSeekV31ToolParser().parse(text)
    assert [(c.name, c.input) for c in result.calls] == [("add", {"a": 1}), ("mul", {"b": 2})]
    assert result.content == "Ok."
    bad = DeepSeekV31ToolParser().parse(
        "<｜tool▁calls▁begin｜>" + call.format("two words", "{}") + "<｜tool▁calls▁end｜>"
    )
    assert _only_error(bad.calls).kind == "missing_name"


# -- llama3 --------------------------------------------------------------------------------------


def test_llama3_bare_json_tagged_and_parallel():
    parser = Llama3ToolParser()
    assert [(c.name, c.input) for c in _calls(parser, '{"name": "add", "parameters": {"a": 1}}')] == [
        ("add", {"a": 1})
    ]
    tagged = 'I will call.<|python_tag|>{"name": "add", "arguments": {"a": 1}}; {"name": "mul", "parameters": {"b": 2}}'
    result = parser.parse(tagged)
    assert [(c.name, c.input) for c in result.calls] == [("add", {"a": 1}), ("mul", {"b": 2})]
    assert result.content == "I will call."
    assert parser.parse("The set {x} is empty.").calls == []


@pytest.mark.parametrize(
    ("action", "kind", "message"),
    [
        ('{"name": "add", "parameters": {"a": 1}} trailing', "bad_json", "expected ';'"),
        ('{"name": "add", "parameters": {}, "arguments": {}}', "bad_arguments", "both"),
        ('{"name": "add"}', "bad_arguments", "neither"),
        ('{"name": "add", "parameters": [1]}', "bad_arguments", "must be a JSON object"),
        ("[1, 2]", "bad_json", "must be a JSON object"),
        ("{" * 5000 + "}" * 5000, "bad_json", ""),
    ],
)
def test_llama3_malformed(action, kind, message):
    calls = Llama3ToolParser().parse("<|python_tag|>" + action).calls
    errors = [c for c in calls if isinstance(c, MalformedCall)]
    error = _only_error(errors)
    assert calls[-1] is error, "a malformed call ends the calls: what follows it is not read"
    assert error.kind == kind and message in error.message


# (the text that opens a section of calls, the text that opens one call) per format
HOSTILE_OPENERS = {
    "qwen3_coder": ("", "<tool_call>"),
    "glm45": ("", "<tool_call>"),
    "glm47": ("", "<tool_call>"),
    "kimi_k2": ("<|tool_calls_section_begin|>", "<|tool_call_begin|>"),
    "deepseekv31": ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"),
    "deepseekv3": ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"),
    "deepseekv32": ("<｜DSML｜function_calls>", '<｜DSML｜invoke name="'),
    "minimax-m2": ("<minimax:tool_call>", '<invoke name="'),
    "mistral": ("", "[TOOL_CALLS]"),
    "gpt-oss": ("", "<|start|>assistant<|channel|>commentary to=functions.add"),
}


@pytest.mark.timeout(10)  # a hang guard for hostile markup
@pytest.mark.parametrize("name", sorted(HOSTILE_OPENERS))
def test_thousands_of_tags_stay_linear(name):
    section, opener = HOSTILE_OPENERS[name]
    calls = get_tool_parser(name).parse(section + opener * 20_000).calls
    assert calls and all(isinstance(c, MalformedCall) for c in calls)


# -- deepseekv3 / deepseekv32 / minimax-m2 / gpt-oss / mistral ---------------------------------------------


def test_deepseekv3_reads_the_fenced_json_and_wants_the_function_type():
    call = "<｜tool▁call▁begin｜>{}<｜tool▁sep｜>{}\n```json\n{}\n```<｜tool▁call▁end｜>"
    text = "Sure.<｜tool▁calls▁begin｜>" + call.format("function", "add", '{"a": 1}') + "\n"
    text += call.format("function", "mul", '{"b": 2}') + "<｜tool▁calls▁end｜>"
    result = get_tool_parser("deepseekv3").parse(text)
    assert [(c.name, c.input) for c in result.calls] == [("add", {"a": 1}), ("mul", {"b": 2})]
    assert result.content == "Sure."
    wrong_type = "<｜tool▁calls▁begin｜>" + call.format("tool", "add", "{}") + "<｜tool▁calls▁end｜>"
    assert (
        "the call type 'function'"
        in _only_error(get_tool_parser("deepseekv3").parse(wrong_type).calls).message
    )
    v31 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    assert _only_error(get_tool_parser("deepseekv3").parse(v31).calls).kind == "missing_name"
    assert _only_error(get_tool_parser("deepseekv31").parse(text).calls[:1]).kind == "bad_json", (
        "each DeepSeek parser refuses the other's format: auto cannot mistake them"
    )


DSML_CALL = '<｜DSML｜invoke name="mix">\n{}\n</｜DSML｜invoke>'
DSML_PARAMETER = '<｜DSML｜parameter name="{}" string="{}">{}</｜DSML｜parameter>'


def test_deepseekv32_types_values_by_the_string_attribute():
    parameters = "\n".join(
        [
            DSML_PARAMETER.format("s", "true", "42"),
            DSML_PARAMETER.format("n", "false", "7"),
            DSML_PARAMETER.format("cfg", "false", '{"k": "é"}'),
            DSML_PARAMETER.format("code", "true", "print(1)\n\nprint(2)"),
        ]
    )
    text = "\n\n<｜DSML｜function_calls>\n" + DSML_CALL.format(parameters) + "\n</｜DSML｜function_calls>"
    (call,) = _calls(get_tool_parser("deepseekv32"), text)
    assert call.input == {"s": "42", "n": 7, "cfg": {"k": "é"}, "code": "print(1)\n\nprint(2)"}
    body = "\n\n<｜DSML｜function_calls>\n" + DSML_CALL.format('{"n": 7}') + "\n</｜DSML｜function_calls>"
    assert _calls(get_tool_parser("deepseekv32"), body)[0].input == {"n": 7}, "SGLang's JSON-body form"


@pytest.mark.parametrize(
    ("parameter", "kind", "message"),
    [
        (DSML_PARAMETER.format("n", "maybe", "7"), "bad_arguments", 'string="maybe" is not true or false'),
        (DSML_PARAMETER.format("n", "false", "seven"), "bad_arguments", "is not JSON"),
        (DSML_PARAMETER.format("n", "false", "1") * 2, "bad_arguments", "duplicate"),
        ("junk", "bad_arguments", "unexpected text"),
    ],
)
def test_deepseekv32_malformed(parameter, kind, message):
    text = "<｜DSML｜function_calls>" + DSML_CALL.format(parameter) + "</｜DSML｜function_calls>"
    error = _only_error(_calls(get_tool_parser("deepseekv32"), text))
    assert error.kind == kind and message in error.message


def test_minimax_types_values_by_the_schema_and_reads_several_invokes():
    invoke = '<invoke name="{}">\n{}</invoke>\n'
    parameter = '<parameter name="{}">{}</parameter>\n'
    text = (
        "Let me see.\n<minimax:tool_call>\n"
        + invoke.format(
            "mix",
            parameter.format("n", "7")
            + parameter.format("s", "42")
            + parameter.format("items", '[1, "two"]'),
        )
        + invoke.format("add", parameter.format("a", "1") + parameter.format("b", "2"))
        + "</minimax:tool_call>"
    )
    result = get_tool_parser("minimax-m2").parse(text, tools=SCHEMAS)
    assert [(c.name, c.input) for c in result.calls] == [
        ("mix", {"n": 7, "s": "42", "items": [1, "two"]}),
        ("add", {"a": 1, "b": 2}),
    ]
    assert result.content == "Let me see."
    error, added = _calls(get_tool_parser("minimax-m2"), text.replace('"n">7', '"n">seven'))
    assert (
        isinstance(error, MalformedCall)
        and error.kind == "bad_arguments"
        and "expected an integer" in error.message
    )
    assert isinstance(added, ToolCall), "the next invoke is read on its own"


HARMONY_CALL = "<|channel|>commentary to=functions.add <|constrain|>json<|message|>{}"


def test_gpt_oss_reads_channels_and_both_recipient_places():
    parser = get_tool_parser("gpt-oss")
    text = "<|channel|>analysis<|message|>I add.<|end|><|start|>assistant" + HARMONY_CALL.format(
        '{"a": 1, "b": 2}'
    )
    result = parser.parse(text, tools=SCHEMAS)
    assert result.reasoning == "I add." and [(c.name, c.input) for c in result.calls] == [
        ("add", {"a": 1, "b": 2})
    ]
    template = (
        ' to=functions.add<|channel|>commentary json<|message|>{"a": 1}'  # as the chat template writes it
    )
    assert [(c.name, c.input) for c in parser.parse(template).calls] == [("add", {"a": 1})]
    answer = parser.parse(
        "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>5"
    )
    assert (answer.content, answer.reasoning, answer.calls) == ("5", "think", [])
    python = parser.parse("<|channel|>commentary to=python<|message|>{}")
    assert [c.name for c in python.calls] == ["python"], "a built-in tool: the policy says it is unknown"


def test_gpt_oss_text_after_a_message_end_is_an_error():
    text = HARMONY_CALL.format('{"a": 1}') + "<|call|>stray"
    assert _only_error(get_tool_parser("gpt-oss").parse(text).calls).kind == "bad_json"


def test_mistral_reads_the_array_the_compact_form_and_keeps_call_ids():
    parser = get_tool_parser("mistral")
    array = 'Sure.[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}, "id": "a1b2c3d4e"}, {"name": "mul", "arguments": {}}]'
    result = parser.parse(array)
    assert [(c.name, c.input, c.id) for c in result.calls] == [
        ("add", {"a": 1}, "a1b2c3d4e"),
        ("mul", {}, None),
    ]
    assert result.content == "Sure."
    compact = '[TOOL_CALLS]add[CALL_ID]a1b2c3d4e[ARGS]{"a": 1}[TOOL_CALLS]mul[ARGS]{"b": 2}'
    assert [(c.name, c.input, c.id) for c in parser.parse(compact).calls] == [
        ("add", {"a": 1}, "a1b2c3d4e"),
        ("mul", {"b": 2}, None),
    ]
    thinking = parser.parse('[THINK]maybe [TOOL_CALLS]add[ARGS]{"a": 1}[/THINK]Done.')
    assert (thinking.calls, thinking.reasoning_calls, thinking.content) == ([], 1, "Done.")
    trailing = _only_error(parser.parse('[TOOL_CALLS]add[ARGS]{"a": 1} and more').calls)
    assert trailing.kind == "bad_json" and "unexpected text after the call" in trailing.message
