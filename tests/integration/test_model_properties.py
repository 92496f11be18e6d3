"""Property-based: random scripts through a real Agent, real tokenizer, real HTTP to ONE test server.

Scripts mix plain text, 1-3 parallel valid calls with random small int arguments, malformed calls of every
kind, unknown tools, calls drafted inside ``<think>`` and a final answer. For each example: the trajectory
invariants hold, the parse-error counters match the script by kind, only valid calls ran, and the decoded
trajectory is the template's canonical rendering of the conversation built from the script.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

import pytest
from helpers import (
    BAD_CALLS,
    Call,
    ModelTurn,
    assert_canonical,
    canonical_conversation,
    final,
    make_agent,
    make_model,
    result_texts,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strands import tool

from slime_strands.testing import SGLangTestServer
from slime_strands.testing.invariants import assert_trajectory_invariants

pytestmark = pytest.mark.timeout(60)

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
TOOLS = [add, mul]
SMALL = st.integers(min_value=-20, max_value=99)
TEXTS = st.sampled_from(["", "Let me see.", "Computing now:", "Two steps."])
REASONING = st.sampled_from(["I should use a tool.", "Plan: add first", "x"])

valid_calls = st.builds(
    lambda name, a, b: Call(name, {"a": a, "b": b}), st.sampled_from(["add", "mul"]), SMALL, SMALL
)


def _order_bad(kinds: list[str]) -> list[str]:
    # an unclosed <tool_call> must not be followed by a stray </tool_call> (that would close it): put it last
    return sorted(kinds, key=lambda k: k == "unclosed")


@st.composite
def tool_turns(draw) -> ModelTurn:
    bad = _order_bad(draw(st.lists(st.sampled_from(sorted(BAD_CALLS)), max_size=2)))
    valid = draw(st.lists(valid_calls, min_size=0 if bad else 1, max_size=3))
    reasoning_calls = draw(st.lists(valid_calls, max_size=2))
    reasoning = draw(st.one_of(st.none(), REASONING)) if not reasoning_calls else draw(REASONING)
    return ModelTurn(
        content=draw(TEXTS),
        calls=[*(BAD_CALLS[k] for k in bad), *valid],
        reasoning=reasoning,
        reasoning_calls=reasoning_calls,
    )


@st.composite
def scripts(draw) -> list[ModelTurn]:
    turns = draw(st.lists(tool_turns(), max_size=4))
    answer = draw(st.sampled_from(["The answer is 5.", "Done.", "Result: 42"]))
    last = final(answer, draw(st.sampled_from(["", "Quick check."])), draw(st.lists(valid_calls, max_size=2)))
    return [*turns, last]


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer) as srv:
        yield srv


_keys = itertools.count()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=scripts())
def test_random_scripts_keep_every_invariant(tokenizer, server, script):
    key = f"episode-{next(_keys)}"  # one server for all examples: each episode has its own routing key
    server.script(*[turn.text() for turn in script], key=key)
    EXECUTED.clear()
    model = make_model(tokenizer, server, routing_key=key)
    agent = make_agent(model, TOOLS)

    result = asyncio.run(agent.invoke_async("Compute things."))

    assert result.stop_reason == "end_turn"
    assert server.pending(key) == 0
    tm = model.token_manager
    assert_trajectory_invariants(tm, server, routing_key=key)
    requests = [r for r in server.generate_requests if r.headers.get("x-smg-routing-key") == key]
    assert len(requests) == len(script) == model.stats.turns

    expected_errors = Counter(call.kind for turn in script for call in turn.bad_calls)
    expected_errors["inside_reasoning"] += sum(len(turn.reasoning_calls) for turn in script)
    assert +model.parse_errors == +expected_errors
    assert Counter(call.name for turn in script for call in turn.valid_calls) == EXECUTED
    assert model.stats.tool_calls_parsed == sum(len(turn.valid_calls) for turn in script)

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

    # Every assistant turn belongs to the one user query, so Qwen3 keeps all think blocks: no rewrite.
    conversation = canonical_conversation("Compute things.", script, got)
    assert_canonical(tokenizer, tm, conversation, TOOLS)


@st.composite
def thinking_off_scripts(draw) -> list[ModelTurn]:
    # With enable_thinking=False the generation prompt closes an empty think block: outputs carry none.
    turns = [
        ModelTurn(content=t.content, calls=t.calls)
        for t in draw(st.lists(tool_turns(), max_size=3))
        if t.calls
    ]
    return [*turns, ModelTurn(content=draw(st.sampled_from(["Done.", "It is 7."])))]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=thinking_off_scripts())
def test_random_scripts_with_thinking_off(tokenizer, server, script):
    key = f"off-{next(_keys)}"
    server.script(*[turn.text() for turn in script], key=key)
    model = make_model(tokenizer, server, routing_key=key, enable_thinking=False)
    agent = make_agent(model, TOOLS)
    asyncio.run(agent.invoke_async("Compute things."))
    tm = model.token_manager
    assert_trajectory_invariants(tm, server, routing_key=key)
    assert +model.parse_errors == +Counter(call.kind for turn in script for call in turn.bad_calls)
    # The canonical rendering keeps the empty think block only on the LAST assistant message: re-rendering
    # drops it from every earlier turn. That rewrite is the whole difference.
    canonical_turns = [*script[:-1], final(script[-1].content)]
    conversation = canonical_conversation("Compute things.", canonical_turns, result_texts(agent))
    rewritten = ["<think>\n\n</think>\n\n"] * (len(script) - 1)
    assert_canonical(tokenizer, tm, conversation, TOOLS, rewritten=rewritten, enable_thinking=False)
