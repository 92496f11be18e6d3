"""Aborts mid-turn against the REAL server: slime's (its abort flag, then ``/abort_request`` with ``abort_all``
as slime's ``abort_servers_until_idle`` sends it) and one nobody asked for (an abort of the request's id, as a
restarting worker behind a router would answer): the first ends the episode ABORTED with the partial turn the
server generated, the second is sent again and the episode goes on as if nothing happened."""

from __future__ import annotations

import asyncio

import pytest

from real_sglang.real_helpers import check_record, post_json, rid_prefix_pairs, server_loads, settings
from real_sglang.recording_proxy import RecordingProxy
from slime_strands.agent.episode import EpisodeSpec, run_episode
from slime_strands.agent.record import TREATMENTS, Termination
from slime_strands.provider.client import SGLangClient

pytestmark = [pytest.mark.real_sglang, pytest.mark.timeout(600)]

LONG_TURN = {"temperature": 0.0, "ignore_eos": True}
"""Greedy and no end: the turn runs to its max_new_tokens (hundreds of decode steps) unless aborted."""
WAIT_S = 180.0


async def _running(proxy: RecordingProxy, base_url: str) -> str:
    """The rid of the episode's request once the server runs it (its load report, polled with a bound)."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not ((loads := await asyncio.to_thread(server_loads, base_url)).running and proxy.generations()):
        assert asyncio.get_running_loop().time() < deadline, f"the turn never ran: {loads}"
        await asyncio.sleep(0.1)  # polling the server's load report, bounded above
    return str(proxy.generations()[-1].rid)


async def _episode(proxy, tokenizer, max_new_tokens: int, should_stop=None):
    client = SGLangClient(proxy.base_url, retry_delay=0.05, max_retries=3)
    try:
        return await run_episode(
            tokenizer,
            client,
            settings(),
            EpisodeSpec(
                prompt="What is 2 + 3?",
                sampling_params={**LONG_TURN, "max_new_tokens": max_new_tokens},
                routing_key="episode",
            ),
            should_stop=should_stop,
        )
    finally:
        await client.aclose()


async def test_slimes_abort_mid_turn_ends_the_episode_aborted(proxy, tokenizer, sglang_server):
    aborted = {"flag": False}
    episode = asyncio.create_task(_episode(proxy, tokenizer, 900, should_stop=lambda: aborted["flag"]))
    await _running(proxy, sglang_server.base_url)
    aborted["flag"] = True  # slime's GenerateState.aborted, then its abort of every server
    await asyncio.to_thread(post_json, proxy.base_url, "/abort_request", {"abort_all": True})
    record = await episode
    assert record.termination is Termination.ABORTED, record.error
    assert TREATMENTS[record.termination].status == "ABORTED"
    (exchange,) = proxy.generations("episode")
    finish = exchange.answer["meta_info"]["finish_reason"]
    assert (finish["type"], finish["message"]) == ("abort", "Aborted"), finish
    assert 0 < len(exchange.answer["output_ids"]) < 900, "aborted mid-turn, with the partial output"
    check_record(record, proxy)  # the partial turn is the server's, token for token
    generated = [s for s in record.trajectory.spans if s.kind == "generated"]
    assert list(generated[-1].token_ids) == exchange.answer["output_ids"]


async def test_an_abort_nobody_asked_for_is_sent_again(proxy, tokenizer, sglang_server):
    episode = asyncio.create_task(_episode(proxy, tokenizer, 200))
    rid = await _running(proxy, sglang_server.base_url)
    await asyncio.to_thread(post_json, proxy.base_url, "/abort_request", {"rid": rid})
    record = await episode
    assert record.termination is Termination.MAX_TOKENS, (
        record.error
    )  # the turn ran to its end the second time
    attempts = proxy.generations("episode")
    assert [e.finish_type for e in attempts] == ["abort", "length"]
    assert attempts[0].body["input_ids"] == attempts[1].body["input_ids"]
    assert not rid_prefix_pairs([e.rid for e in attempts]), [e.rid for e in attempts]
    answered = check_record(record, proxy)  # the aborted attempt's partial output is not in the trajectory
    assert [e.rid for e in answered] == [attempts[1].rid]
    assert len(record.trajectory) == len(attempts[1].body["input_ids"]) + 200
