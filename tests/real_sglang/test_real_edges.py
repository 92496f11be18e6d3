"""The context edge and the model's end ids, against the REAL server.

The window is discovered from ``/v1/models`` (1,024 tokens here); SGLang's scheduler refuses inputs a few tokens
before it, and its tokenizer manager refuses input + max_new_tokens beyond it: an episode that grows to the
edge must end TRUNCATED (context_full) without one request the server refuses. SGLang stops on every end id of
the model's generation_config (Qwen3: ``<|endoftext|>`` 151643 as well as ``<|im_end|>`` 151645), whatever
stop ids the client sends: a turn that ends on either is recorded with it and the episode goes on.
"""

from __future__ import annotations

import pytest

from real_sglang.real_helpers import (
    CALL_ADD,
    CONTEXT_LENGTH,
    GREEDY,
    call,
    check_record,
    literal,
    run,
    settings,
)
from real_sglang.tiny_model import END_OF_TEXT, IM_END
from slime_strands.agent.record import TREATMENTS, Termination
from slime_strands.provider.client import SGLANG_CONTEXT_MARGIN, SGLangClient

pytestmark = [pytest.mark.real_sglang, pytest.mark.timeout(600)]


async def test_the_window_is_discovered_from_v1_models(proxy):
    client = SGLangClient(proxy.base_url)
    try:
        assert await client.context_length() == CONTEXT_LENGTH
    finally:
        await client.aclose()
    assert [e.path for e in proxy.exchanges] == ["/v1/models"]


@pytest.mark.parametrize("lines", [9, 20])
async def test_an_episode_grows_to_the_edge_and_ends_context_full(proxy, tokenizer, lines):
    """Tool outputs fill the window in a few rounds; the last turn meets the edge (cut there, or no room left
    for it): TRUNCATED as context_full, and every request fit the window."""
    regex = literal(call("huge_output", n=lines))
    record = await run(proxy, tokenizer, {**GREEDY, "regex": regex}, plugin=settings(max_tool_iters=None))
    assert TREATMENTS[record.termination].status == "TRUNCATED"
    assert record.termination is Termination.CONTEXT_FULL, (record.termination, record.error)
    check_record(record, proxy)  # every request 200, input + max_new_tokens within the window
    assert len(record.trajectory) <= CONTEXT_LENGTH - SGLANG_CONTEXT_MARGIN
    assert record.tool_calls >= 2
    exchanges = proxy.generations("episode")
    assert all(e.body["input_ids"] for e in exchanges)
    # each turn's budget is the room left: the last request asked for exactly what remained of the window
    last = exchanges[-1].body
    assert (
        len(last["input_ids"]) + last["sampling_params"]["max_new_tokens"]
        == CONTEXT_LENGTH - SGLANG_CONTEXT_MARGIN
    )


@pytest.mark.parametrize("end_id", [IM_END, END_OF_TEXT], ids=["im_end", "endoftext"])
async def test_turns_end_on_each_end_id_of_the_model(proxy, tokenizer, end_id):
    """``logit_bias`` makes the model end its (grammar-written) tool call on ``end_id``; the client asks only for
    <|im_end|>, SGLang stops on the generation_config's ids too. Both turns record that id; the tool ran."""
    params = {**GREEDY, "regex": literal(CALL_ADD), "logit_bias": {str(end_id): 50.0}}
    record = await run(proxy, tokenizer, params, plugin=settings(max_tool_iters=1))
    assert record.termination is Termination.TOOL_LIMIT, record.error
    answered = check_record(record, proxy)
    assert len(answered) == 2 and record.tool_calls == 1
    for exchange in answered:
        assert exchange.answer["meta_info"]["finish_reason"] == {"type": "stop", "matched": end_id}
        assert exchange.answer["output_ids"][-1] == end_id
        assert exchange.body["sampling_params"]["stop_token_ids"] == [IM_END]
    generated = [s for s in record.trajectory.spans if s.kind == "generated"]
    assert [s.token_ids[-1] for s in generated] == [end_id, end_id]
