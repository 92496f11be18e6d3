"""The probe on templates of the vendors' kinds it must accept or refuse: a dict of named templates (Hermes-3),
templates that raise on a tool result no call precedes (MiniMax-M2), that rewrite what was rendered once later
messages follow (DeepSeek-R1's first release, Mistral Small), that refuse the agent's call ids; each refusal with
its true reason. Templates: tests/families/templates (each says where its facts come from), and small variants
of them written here."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from family_kit import HERMES_TOKENS, TEMPLATES, family_tokenizer
from helpers import make_agent, make_model
from strands import tool

from slime_strands import SGLangModel
from slime_strands.cli import main
from slime_strands.cli.checks import check_template
from slime_strands.errors import ConfigurationError
from slime_strands.template.probe import detect_tool_parser
from slime_strands.template.render import ChatRenderer, TemplateError
from slime_strands.testing import SGLangTestServer
from slime_strands.testing import Turn as ServerTurn
from slime_strands.testing.invariants import assert_trajectory_invariants

CHATML = (
    "{{ bos_token }}{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""Hermes-3's "default" template: ChatML."""


def _tokenizer(base_family: str, template: Any, added: tuple[str, ...] = (), eos: str | None = None) -> Any:
    tok = copy.deepcopy(family_tokenizer(base_family))
    if added:
        tok.add_special_tokens({"additional_special_tokens": list(added)})
    if eos:
        tok.eos_token = eos
    tok.chat_template = template
    return tok


def _hermes3() -> Any:
    templates = {"default": CHATML, "tool_use": (TEMPLATES / "hermes3_tool_use.jinja").read_text()}
    return _tokenizer("llama3", templates, HERMES_TOKENS, "<|im_end|>")


def test_a_dict_of_named_templates_is_probed_as_the_agent_renders_it():
    """Hermes-3: transformers' rule picks "tool_use" when tools are given (the agent's case); that template
    raises without tools, so the probe renders with the probe tool."""
    tool_use = _tokenizer(
        "llama3", (TEMPLATES / "hermes3_tool_use.jinja").read_text(), HERMES_TOKENS, "<|im_end|>"
    )
    with pytest.raises(TemplateError, match="failed to render"):
        ChatRenderer(tool_use, probe=False).apply([{"role": "user", "content": "Hi"}], None, True)
    tok = _hermes3()
    report = check_template(tok, None)
    assert report.usable and report.parser == "hermes", report.lines()
    assert report.stop_tokens == ("<|im_end|>",) and report.generation_prompt == "<|im_start|>assistant\n"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_an_episode_on_a_dict_template_holds_every_invariant():
    tok = _hermes3()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    with SGLangTestServer(tok, end_of_turn=["<|im_end|>"]) as server:
        server.script(ServerTurn(call, stop_token_id=end), ServerTurn("It is 5.", stop_token_id=end))
        model = make_model(tok, server)
        result = await make_agent(model, [add]).invoke_async("What is 2+3?")
        assert str(result).strip() == "It is 5." and not model.parse_errors
        assert_trajectory_invariants(model.token_manager, server)
    observation = tok.decode(list(model.token_manager.spans[2].token_ids))
    assert (
        observation
        == "\n<|im_start|>tool\n<tool_response>\n5\n</tool_response><|im_end|><|im_start|>assistant\n"
    )


def test_check_template_on_a_saved_dict_template_prints_a_report(tmp_path, capsys):
    _hermes3().save_pretrained(tmp_path)
    assert main(["check-template", str(tmp_path), "--enable-thinking", "none"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "tool parser: hermes (" in captured.out


def test_a_template_that_raises_on_results_no_call_precedes_is_probed_with_a_call():
    """MiniMax-M2's template raises on a tool result without an assistant call before it: the probe renders
    results after a turn that calls them (today's probe said "does not render tool results")."""
    renderer = ChatRenderer(family_tokenizer("minimax-m2"))
    assert renderer.facts.tool_role == "tool" and renderer.probe() is True
    with pytest.raises(TemplateError, match="no previous assistant message with a tool call"):
        renderer.apply([{"role": "user", "content": "q"}, {"role": "tool", "content": "5"}], None, True)


def test_a_template_that_never_renders_results_says_so():
    never = (
        (TEMPLATES / "minimax_m2.jinja").read_text().replace("{%- if not ns.called -%}", "{%- if true -%}")
    )
    with pytest.raises(TemplateError) as info:
        ChatRenderer(_tokenizer("minimax-m2", never))
    assert "cannot render a tool result after the call it answers" in str(info.value)
    assert "no previous assistant message with a tool call" in str(info.value), "the template's own words"


def test_deepseek_r1_first_release_is_refused_for_its_second_round_of_results():
    """Its template opens only the conversation's first round of results with <｜tool▁outputs▁begin｜>, and shows
    no call of a turn with content: no parser is chosen from its calls, and a named one meets the refusal."""
    tok = _tokenizer("deepseekv3", (TEMPLATES / "deepseek_r1.jinja").read_text())
    renderer = ChatRenderer(tok, probe=False)
    with pytest.raises(Exception, match=r"special tokens fit \['deepseekv31', 'deepseekv3'\]"):
        detect_tool_parser(renderer)
    with pytest.raises(TemplateError) as info:
        SGLangModel(tokenizer=tok, base_url="http://127.0.0.1:9", tool_parser="deepseekv3")
    message = str(info.value)
    assert "incremental rendering does not reproduce" in message
    assert "\\n<｜tool▁output▁begin｜>probe result three" in message, "the full rendering's second round"


def _mistral(template: str) -> Any:
    from family_kit import MISTRAL_TOKENS

    return _tokenizer("llama3", template, MISTRAL_TOKENS, "</s>")


def test_a_template_that_refuses_the_agents_call_ids_is_refused_with_that_reason():
    """Mistral Small 3.x / Nemo: tool-call ids must be 9 alphanumeric characters; the agent's are not."""
    nine = (
        (TEMPLATES / "mistral.jinja")
        .read_text()
        .replace(
            "{%- for tc in m.tool_calls or [] -%}",
            "{%- for tc in m.tool_calls or [] -%}{%- if tc.id | length != 9 -%}"
            "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif -%}",
        )
    )
    with pytest.raises(TemplateError) as info:
        ChatRenderer(_mistral(nine))
    message = str(info.value)
    assert "refuses an assistant turn that calls a tool (call id 'call_0" in message
    assert "Tool call IDs should be alphanumeric strings with length 9!" in message


def test_a_template_that_moves_the_tools_to_the_last_user_turn_is_refused():
    """Mistral Small 3.x / Nemo write [AVAILABLE_TOOLS] before the LAST user message: a follow-up question moves
    them, so the first prompt is not how the conversation renders later."""
    moving = (TEMPLATES / "mistral.jinja").read_text()
    moving = moving.replace(
        "{%- if tools -%}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{%- endif -%}", ""
    )
    moving = moving.replace(
        "{%- if m.role == 'user' -%}[INST]",
        "{%- if m.role == 'user' -%}{%- if tools and m is sameas (conversation | selectattr('role', 'equalto', "
        "'user') | list | last) -%}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{%- endif -%}[INST]",
    )
    with pytest.raises(
        TemplateError, match="renders the start of a conversation differently once later messages"
    ):
        ChatRenderer(_mistral(moving))


@pytest.mark.parametrize("tool_parser", ["auto", "mistral"])
def test_a_template_that_concatenates_the_results_call_id_is_refused_only_for_what_an_episode_meets(
    tool_parser,
):
    """Mistral Small 3.1 writes a result's ``tool_call_id`` by concatenation (a result without one fails to
    render): the probe's results carry one, as an episode's do, so the template is refused for the true reason,
    the tools it moves to the last user message."""
    from family_kit import variant_tokenizer

    with pytest.raises(TemplateError) as info:
        SGLangModel(
            tokenizer=variant_tokenizer("mistral_small31"),
            base_url="http://127.0.0.1:9",
            tool_parser=tool_parser,
        )
    message = str(info.value)
    assert "renders the start of a conversation differently once later messages follow" in message
    assert "[AVAILABLE_TOOLS]" in message and "tool_call_id" not in message


def test_the_probe_call_must_be_read_back_alone():
    """A parser that reads the probe call and then a broken one does not read what the template rendered."""
    from slime_strands.template.probe import why_unread

    good = '<tool_call>\n{"name": "probe_tool", "arguments": {"x": 1, "note": "probe call 0 e2c4"}}\n</tool_call>'
    assert why_unread("hermes", (good, False)) is None
    why = why_unread(
        "hermes", (good + '\n<tool_call>\n{"name": "probe_tool", "arguments": {"x": \n</tool_call>', False)
    )
    assert why is not None and why.startswith("bad_json: "), why


def test_a_template_that_renders_a_broken_call_after_each_call_gets_no_parser():
    """auto picks no parser for a template whose rendered turn holds a good call and a broken one."""
    broken = (
        "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}"
        '{%- for tc in m.tool_calls or [] -%}\n<tool_call>\n{"name": "{{ tc.function.name }}", "arguments": '
        '{{ tc.function.arguments | tojson }}}\n</tool_call>\n<tool_call>\n{"name": {%- endfor -%}'
        "<|im_end|>\n{%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
    )
    with pytest.raises(ConfigurationError, match="which no registered parser reads back"):
        detect_tool_parser(ChatRenderer(_tokenizer("hermes", broken), probe=False))
