"""A family is one entry of tests/family_kit.py plus its parser module: these tests fail when a registered parser
has no entry, no turn start for the reward, or no row in docs/tool-calls.md, and check each entry's pieces."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from family_kit import FAMILIES, SUPPORTED, Call, family_tokenizer

from slime_strands.errors import ConfigurationError
from slime_strands.reward import final_answer_text
from slime_strands.template.probe import select_tool_parser
from slime_strands.template.render import ChatRenderer
from slime_strands.tool_parsers import get_tool_parser, registered_tool_parsers

DOCS = Path(__file__).resolve().parents[2] / "docs" / "tool-calls.md"


def test_every_registered_parser_has_a_family_entry():
    assert sorted(registered_tool_parsers()) == sorted(FAMILIES), (
        "a new parser needs its entry in tests/family_kit.py FAMILIES (writer, malformed calls, template)"
    )
    for name, family in FAMILIES.items():
        parser = get_tool_parser(name)
        assert family.name == name and family.family == parser.family
        assert parser.markers, f"{name}: the special tokens auto falls back on"
        assert parser.turn_starts, (
            f"{name}: where its templates start an assistant turn (the reward reads it)"
        )
        assert {"unknown_tool"} < set(family.bad_calls), f"{name}: malformed calls of its format"


def test_docs_list_every_family_with_its_status():
    cells = [
        re.split(r"(?<!\\)\|", line)[1:-1] for line in DOCS.read_text().splitlines() if line.startswith("| `")
    ]
    rows = {
        row[0].strip().strip("`"): row[-1] for row in cells if len(row) == 4 and row[0] != " `tool_parser` "
    }
    assert sorted(rows) == sorted(registered_tool_parsers()), "docs/tool-calls.md: one row per parser"
    for name, family in FAMILIES.items():
        status = rows[name].strip()
        assert status.startswith("refused" if family.refused else "token-exact"), (name, status)


@pytest.mark.parametrize("name", SUPPORTED)
def test_the_reward_finds_the_final_answer_of_every_family(name):
    """Without the episode's record the reward finds the last turn by the family's turn starts."""
    family, tok = FAMILIES[name], family_tokenizer(name)
    call = family.call_turn(Call("add", {"a": 2, "b": 3}), content="Adding 7 and 8 first.")
    answer = family.answer("The answer is \\boxed{5}.")
    messages = [
        {"role": "user", "content": "What is 2+3? Not 99."},
        family.canonical_message(call),
        {"role": "tool", "content": "Result 42", "tool_call_id": "functions.add:0"},
        family.canonical_message(answer),
    ]
    tools = [{"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {}}}]
    rendered = ChatRenderer(tok).render(messages, tools=tools, add_generation_prompt=False)
    text = final_answer_text(rendered)
    assert "\\boxed{5}" in text and not any(other in text for other in ("99", "42", "7 and 8", "Got it"))


READ_BY_OTHERS = {"glm45": {"glm47"}}
"""GLM-4.7's parser takes the newline GLM-4.5 writes after the name: it reads GLM-4.5's calls right too."""


@pytest.mark.parametrize("name", SUPPORTED)
def test_every_other_parser_is_refused_for_the_family_template(name):
    """A parser set by name must read the call the template renders: every other registered one cannot."""
    renderer = ChatRenderer(family_tokenizer(name))
    accepted = set()
    for other in registered_tool_parsers():
        try:
            accepted.add(select_tool_parser(renderer, other).name)
        except ConfigurationError as exc:
            assert f"tool_parser '{other}' cannot read the tool call the chat template renders" in str(exc)
    assert accepted == {name, *READ_BY_OTHERS.get(name, ())}
