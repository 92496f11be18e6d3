"""Property-based, for EVERY family: random scripts through a real Agent, the family's real tokenizer and chat
template, real HTTP to a test server.

Scripts mix plain text, 1-3 parallel valid calls with random small int arguments, malformed calls of every
kind the family's format has, unknown tools, calls drafted inside reasoning and a final answer. For each
example: the trajectory invariants hold, the parse-error counters match the script by kind, only valid calls
ran, with the right results, each shown to the model.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import family_kit
import pytest
from family_kit import FAMILIES, SUPPORTED, Call, Family, Turn, family_tokenizer, server_turns, stop_tokens
from helpers import make_agent, make_model, result_texts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strands import tool

from slime_strands.testing import SGLangTestServer
from slime_strands.testing.invariants import assert_trajectory_invariants

pytestmark = pytest.mark.timeout(120)

EXECUTED: Counter[str] = Counter()


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    EXECUTED["add"] += 1
    return a + b


@tool
def mul(a: int, b: int) -> int:
    """Multiply two integers."""
    EXECUTED["mul"] += 1
    return a * b


RESULT = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b}
SMALL = st.integers(min_value=-20, max_value=99)
valid_calls = st.builds(
    lambda name, a, b: Call(name, {"a": a, "b": b}), st.sampled_from(["add", "mul"]), SMALL, SMALL
)


def _swallows(family: Family, case: str) -> bool:
    """A malformed call that swallows what follows it: written last, and then no valid call follows."""
    return case in family.swallowing


@st.composite
def tool_turns(draw, family: Family) -> Turn:
    cases = sorted(family.bad_calls)
    bad = draw(st.lists(st.sampled_from(cases), max_size=family.max_bad))
    bad.sort(key=lambda c: c == "unclosed")  # an unclosed tag goes last (a later close would close it)
    # A malformed call that swallows the rest of the turn can only be its last call (and only one).
    swallowing = [c for c in bad if _swallows(family, c)][:1]
    bad = [c for c in bad if not _swallows(family, c)] + swallowing
    valid = [] if swallowing else draw(st.lists(valid_calls, min_size=0 if bad else 1, max_size=3))
    reasoning_calls = draw(st.lists(valid_calls, max_size=2))
    return Turn(
        content=draw(st.sampled_from(["", "Let me see.", "Computing now:"])),
        calls=[*(family.bad_calls[c] for c in bad), *valid],
        reasoning=draw(st.sampled_from([None, "I should use a tool."])) or family.call_reasoning,
        reasoning_calls=reasoning_calls,
        stop=draw(ends(family)),
    )


def ends(family: Family) -> st.SearchStrategy[str | None]:
    """The token a turn ends on: the family's usual one, or any of its stop / end-of-sequence tokens."""
    return st.one_of(st.none(), st.sampled_from(family_kit.end_tokens(family, family_tokenizer(family.name))))


@st.composite
def scripts(draw, family: Family) -> list[Turn]:
    turns = draw(st.lists(tool_turns(family), max_size=3))
    answer = family.answer(draw(st.sampled_from(["The answer is 5.", "Done.", "Result: 42"])))
    answer.reasoning_calls = draw(st.lists(valid_calls, max_size=2))
    answer.stop = draw(ends(family))
    return [*turns, answer]


def _run(family: Family, script: list[Turn]) -> None:
    tok = family_tokenizer(family.name)
    EXECUTED.clear()
    with SGLangTestServer(tok, end_of_turn=stop_tokens(family)) as server:
        server.script(*server_turns(family, tok, script))
        model = make_model(tok, server)
        agent = make_agent(model, [add, mul])
        result = asyncio.run(agent.invoke_async("Compute things."))
        assert result.stop_reason == "end_turn"
        assert str(result).strip() == script[-1].content, "no end token is left in the answer"
        assert server.pending() == 0
        assert_trajectory_invariants(model.token_manager, server)
    assert len(server.generate_requests) == len(script) == model.stats.turns
    expected_errors = Counter(call.kind for turn in script for call in turn.bad_calls)
    expected_errors["inside_reasoning"] += sum(len(turn.reasoning_calls) for turn in script)
    assert +model.parse_errors == +expected_errors
    assert Counter(call.name for turn in script for call in turn.valid_calls) == EXECUTED
    got = result_texts(agent)
    turns_with_calls = [turn for turn in script if turn.calls]
    assert len(got) == len(turns_with_calls)
    for turn, outputs in zip(turns_with_calls, got, strict=True):
        assert len(outputs) == len(turn.calls)
        for call, output in zip(turn.calls, outputs, strict=True):
            if isinstance(call, Call):
                assert output == str(RESULT[call.name](**call.arguments))
            else:
                assert output.startswith(f"Error: invalid tool call ({call.kind}): ")


@pytest.mark.parametrize("name", SUPPORTED)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_scripts_keep_every_invariant(name, data):
    family = FAMILIES[name]
    _run(family, data.draw(scripts(family)))
