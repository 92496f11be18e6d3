"""How a turn cut by ``length`` ends the episode, through slime's generate() (issue 24: "a turn cut by the
context window is labelled max_tokens, not context_full").

Strands only says "max_tokens"; the bound that sized the turn says why: the per-turn ``max_new_tokens``
(max_tokens), the room the context window left (context_full: here, or the server's silent clamp to a
smaller window or KV pool), or what the whole-trajectory response budget left (response_budget). Every
trajectory is checked against the server's records (``run`` does)."""

from __future__ import annotations

import pytest
from slime_helpers import CALL_ADD, SLIME_PARAMS, Sample, make_args, new_sample, record, run, session_requests

from slime_strands.agent.record import Termination
from slime_strands.provider.model import TurnCut
from slime_strands.testing import SGLangTestServer

pytestmark = pytest.mark.timeout(120)

LONG = "word " * 3000


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=8192) as srv:
        yield srv


async def prompt_length(server: SGLangTestServer) -> int:
    probe = await run(server, make_args(server), new_sample(), "Answer: 5")
    return len(probe.tokens) - probe.response_length


def test_every_bound_that_cuts_a_turn_is_an_ending_of_the_episode():
    # The provider says which bound cut a turn; the episode ends with the termination of the same value.
    assert {Termination(cut.value) for cut in TurnCut} == {
        Termination.MAX_TOKENS,
        Termination.CONTEXT_FULL,
        Termination.RESPONSE_BUDGET,
    }


async def test_a_turn_that_hits_its_max_new_tokens_is_max_tokens(server):
    args = make_args(server, strands={"sampling_params": {"max_new_tokens": 30}})
    sample = new_sample()
    out = await run(server, args, sample, LONG)
    assert out.status == Sample.Status.TRUNCATED and record(out).termination is Termination.MAX_TOKENS
    (request,) = session_requests(server, sample)
    assert request.body["sampling_params"]["max_new_tokens"] == 30 == out.response_length


async def test_a_turn_cut_by_the_context_window_is_context_full(server):
    prompt_len = await prompt_length(server)
    args = make_args(server, rollout_max_context_len=prompt_len + 40)
    out = await run(server, args, new_sample(), LONG)
    assert out.status == Sample.Status.TRUNCATED and record(out).termination is Termination.CONTEXT_FULL
    assert len(out.tokens) == prompt_len + 40


async def test_a_turn_the_server_clamped_silently_is_context_full(server, tokenizer):
    """The window reported is the context, but the KV pool is smaller: SGLang serves the turn with fewer new
    tokens than asked, and says only `length`."""
    prompt_len = await prompt_length(server)
    with SGLangTestServer(tokenizer, context_length=8192, kv_capacity=prompt_len + 40) as small:
        sample = new_sample()
        out = await run(small, make_args(small), sample, LONG)
        (request,) = session_requests(small, sample)
        asked = request.body["sampling_params"]["max_new_tokens"]
        served = small.meta_infos[request.body["rid"]]["finish_reason"]["length"]
        assert served < asked, "the server clamped it"
    assert out.status == Sample.Status.TRUNCATED and record(out).termination is Termination.CONTEXT_FULL


async def test_a_turn_cut_by_the_response_budget_is_response_budget(server):
    args = make_args(server, rollout_max_response_len=80)
    out = await run(server, args, new_sample(), CALL_ADD, LONG, params={**SLIME_PARAMS, "max_new_tokens": 80})
    assert out.status == Sample.Status.TRUNCATED and out.response_length == 80
    assert record(out).termination is Termination.RESPONSE_BUDGET
