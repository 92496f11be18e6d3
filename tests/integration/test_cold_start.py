"""The context window when the server does not say it at first (issue 28.1), through slime's generate().

slime starts rollouts as soon as its engines answer; a router or an engine still loading answers 503 on
every route for a while, and a server may report no window at all. A turn sized for an unknown window is a
turn SGLang refuses ("Requested token count exceeds the model's maximum context length of N tokens"): the
sample FAILED with nothing generated. Every trajectory produced is checked against the server's records
(``run`` does)."""

from __future__ import annotations

import asyncio

import pytest
from slime_helpers import CALL_ADD, SLIME_PARAMS, Sample, make_args, new_sample, record, run, session_requests

from slime_strands.agent.record import Termination
from slime_strands.provider.client import SGLANG_CONTEXT_MARGIN
from slime_strands.testing import SGLangTestServer

pytestmark = pytest.mark.timeout(180)

RECIPE = {**SLIME_PARAMS, "max_new_tokens": 40960}  # slime's --rollout-max-response-len in the recipe
ANSWER = "The sum is 5.\nAnswer: \\boxed{5}"


def recipe_args(server: SGLangTestServer):
    # the backoff of a request (ceiling 8 x 0.05 s), as many times as a request is retried
    return make_args(
        server, rollout_max_response_len=40960, strands={"max_retries": 60, "retry_delay_s": 0.05}
    )


def fits(request, window: int) -> bool:
    body = request.body
    return (
        len(body["input_ids"]) + body["sampling_params"]["max_new_tokens"] <= window - SGLANG_CONTEXT_MARGIN
    )


async def test_a_cold_start_sends_no_turn_the_server_must_refuse(tokenizer):
    """The first seconds answer 503 on every route: the window is asked again until it is known, and no
    turn is sent before; every sample of the batch completes."""
    window = 4096
    with SGLangTestServer(tokenizer, context_length=window, unavailable_s=2.0) as server:
        args = recipe_args(server)
        samples = [new_sample() for _ in range(8)]
        outs = await asyncio.gather(*(run(server, args, s, CALL_ADD, ANSWER, params=RECIPE) for s in samples))
        assert [o.status for o in outs] == [Sample.Status.COMPLETED] * 8, [record(o).error for o in outs]
        requests = server.generate_requests
        assert len(requests) == 16 and all(fits(r, window) for r in requests), "no turn sized for no window"


async def test_a_server_that_reports_no_window_ends_every_sample_well(tokenizer):
    """No max_model_len anywhere: a first turn is refused, its text names the window, the turn is clamped and
    sent again (a turn sized after that is not refused). A short answer completes, a long one is cut at the window (context_full), and a
    prompt longer than the window FAILS with that reason."""
    window = 1024
    with SGLangTestServer(tokenizer, context_length=window, report_window=False) as server:
        args = recipe_args(server)
        short, long, too_long = new_sample(), new_sample(), new_sample("Repeat: " + "word " * 1200)
        outs = await asyncio.gather(
            run(server, args, short, CALL_ADD, ANSWER, params=RECIPE),
            run(server, args, long, "word " * 3000, params=RECIPE),
            run(server, args, too_long, "never served", params=RECIPE),
        )
        assert [o.status for o in outs] == [
            Sample.Status.COMPLETED,
            Sample.Status.TRUNCATED,
            Sample.Status.FAILED,
        ], [record(o).error for o in outs]
        assert record(outs[1]).termination is Termination.CONTEXT_FULL
        assert len(outs[1].tokens) == window - SGLANG_CONTEXT_MARGIN, "cut at the window SGLang named"
        assert record(outs[2]).error == "no token generated (context_full)"
        refusals = 0
        for sample in (short, long, too_long):
            requests = session_requests(server, sample)
            refused = [r for r in requests if not fits(r, window)]
            assert refused == requests[: len(refused)] and len(refused) <= 1, "refused once at most, first"
            assert all(r.body["rid"] not in server.answers for r in refused)
            refusals += len(refused)
        assert refusals >= 1, "the window was learned from a refusal: the server reports none"
        assert len(session_requests(server, too_long)) <= 1, "a prompt that cannot fit is not sent again"
