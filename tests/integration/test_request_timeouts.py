"""A client timeout through slime's generate() against a server that aborts as SGLang 0.5.23 does (issue 24.1).

SGLang's scheduler aborts every request whose id STARTS with the aborted one, and it aborts the request of a
client that disconnected (its timeout) a moment later. A retry whose id extended the first attempt's was
killed by that abort, blamed on the server, sent again and killed again, until the sample FAILED with "the
server aborted the request N times without being asked to". Every trajectory produced is checked against
the server's records (``run`` does)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from slime_helpers import Sample, install_generate_state, make_args, new_sample, record, run

from slime_strands import rollout
from slime_strands.agent.record import Termination
from slime_strands.provider.client import SGLangClient
from slime_strands.testing import SGLangTestServer, Turn
from slime_strands.testing.invariants import assert_sample_matches_server

pytestmark = pytest.mark.timeout(120)

ANSWER = "The sum is 5.\nAnswer: \\boxed{5}"
STUCK = Turn("a turn queued behind others", delay_s=600)  # only an abort answers it


@pytest.fixture
def server(tokenizer):
    # the stand-in aborts as SGLang 0.5.23 does: by rid prefix, and a hung-up client's request (checked every
    # disconnect_check_s, and at once when a request arrives whose rid extends a hung-up one)
    with SGLangTestServer(tokenizer, context_length=8192, disconnect_check_s=0.05) as srv:
        yield srv


def timeout_args(server: SGLangTestServer, **strands: Any) -> Any:
    return make_args(server, strands={"request_timeout_s": 1.0, "server_abort_retries": 3, **strands})


async def test_a_retry_after_a_timeout_is_not_killed_by_the_abort_of_the_first_attempt(server):
    sample = new_sample()
    server.responder = lambda body, headers: Turn(ANSWER)  # whatever comes after the stuck attempt
    out = await run(server, timeout_args(server), sample, STUCK)
    assert out.status == Sample.Status.COMPLETED, record(out).error
    assert record(out).termination is Termination.END_TURN
    first, retry = (r.body["rid"] for r in server.generate_requests[:2])
    assert first in server.aborted_rids and retry not in server.aborted_requests
    assert not retry.startswith(first)


async def test_a_sample_whose_every_attempt_times_out_fails_as_a_timeout(server):
    sample = new_sample()
    server.responder = lambda body, headers: STUCK
    out = await run(server, timeout_args(server, max_retries=1), sample)
    assert out.status == Sample.Status.FAILED
    error = record(out).error or ""
    assert (
        error.startswith("SGLangTimeoutError: POST ")
        and "no answer within the 1.0 s request timeout" in error
    )
    assert "aborted" not in error
    rids = [r.body["rid"] for r in server.generate_requests]
    assert len(rids) == 2 and server.aborted_rids[: len(rids)] == rids, "each given-up attempt aborted"


async def test_slimes_abort_reaches_the_attempt_in_flight_after_a_timeout(server, monkeypatch, tokenizer):
    """slime aborts (its flag, then abort_all) while the retry of a timed-out turn runs: the sample ends
    ABORTED, and nothing is sent again."""
    state = install_generate_state(monkeypatch, tokenizer)
    sample = new_sample()
    server.script(STUCK, STUCK, key=sample.session_id)
    task = asyncio.create_task(rollout.generate(timeout_args(server), sample, {"max_new_tokens": 512}))
    while (
        len(server.generate_requests) < 2 or server.generate_requests[1].body["rid"] not in server.in_flight
    ):
        await asyncio.sleep(0.01)
    state.aborted = True
    await SGLangClient(server.base_url).abort()  # abort_all, what slime posts to every worker
    out = await task
    assert out.status == Sample.Status.ABORTED and record(out).termination is Termination.ABORTED
    assert len(server.generate_requests) == 2
    assert_sample_matches_server(out, server, routing_key=sample.session_id)
