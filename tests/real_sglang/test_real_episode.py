"""The episode end to end against the REAL SGLang server: grammar-constrained tool calls and answers from a
random-weight Qwen3, every trajectory checked against what the server saw and answered."""

from __future__ import annotations

import pytest

from real_sglang import real_tools
from real_sglang.real_helpers import (
    ANSWER,
    CALL_ADD,
    GREEDY,
    call,
    check_record,
    get_json,
    literal,
    post_json,
    run,
    settings,
)
from slime_strands.agent.record import TREATMENTS, Termination

pytestmark = [pytest.mark.real_sglang, pytest.mark.timeout(600)]


async def test_grammar_tool_calls_run_the_tool_until_the_limit(proxy, tokenizer):
    record = await run(
        proxy, tokenizer, {**GREEDY, "regex": literal(CALL_ADD)}, plugin=settings(max_tool_iters=2)
    )
    assert record.termination is Termination.TOOL_LIMIT, record.error
    assert TREATMENTS[record.termination].status == "TRUNCATED"
    assert (record.turns, record.tool_iters, record.tool_calls, record.parse_errors) == (3, 2, 2, {})
    answered = check_record(record, proxy)
    assert len(answered) == 3
    tool_results = [m for m in record.messages if any("toolResult" in b for b in m["content"])]
    results = [b["toolResult"]["content"][0]["text"] for m in tool_results for b in m["content"]]
    assert results[:2] == ["5", "5"] and "Tool limit reached" in results[2]  # the third call never ran
    for exchange in answered:  # the grammar held: every turn is the call, ended by the model's end of turn
        assert exchange.answer["text"] == CALL_ADD
        assert exchange.answer["meta_info"]["finish_reason"]["type"] == "stop"


async def test_grammar_answer_completes_the_episode(proxy, tokenizer):
    record = await run(proxy, tokenizer, {**GREEDY, "regex": literal(ANSWER)})
    assert record.termination is Termination.END_TURN, record.error
    assert record.turns == 1 and record.tool_calls == 0
    check_record(record, proxy)
    assert record.response.endswith(ANSWER + "<|im_end|>"), record.response


async def test_weight_version_is_recorded_per_turn(proxy, tokenizer, sglang_server):
    """The weights change between two turns (slime's weight sync): each turn records the version that generated
    it, as the server reported it."""
    before = get_json(proxy.base_url, "/model_info")["weight_version"]
    real_tools.SERVER["url"] = proxy.base_url
    regex = literal(call("publish_weights", version="tier-v2"))
    plugin = settings(tools=["real_sglang.real_tools.publish_weights"], max_tool_iters=1)
    try:
        record = await run(proxy, tokenizer, {**GREEDY, "regex": regex}, plugin=plugin)
    finally:
        post_json(sglang_server.base_url, "/update_weight_version", {"new_version": before})
    assert record.termination is Termination.TOOL_LIMIT, record.error
    check_record(record, proxy)  # each turn's weight_version is its answer's
    versions = [s.info.weight_version for s in record.trajectory.spans if s.kind == "generated"]
    assert versions == [before, "tier-v2"]
