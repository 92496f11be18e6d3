"""SGLangClient where the real SGLang 0.5.23 is less kind than a naive client assumes (issues 24.1 and 28.1):
its scheduler aborts every request whose id STARTS with the aborted one (and aborts a disconnected client's
request), and a server still loading answers 503 on every route, or reports no window at all.

Real HTTP against ``SGLangTestServer``; the 400 texts are SGLang 0.5.23's own (recorded answers)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from slime_strands.client import (
    RequestHandle,
    SGLangClient,
    SGLangContextLengthError,
    SGLangTimeoutError,
)
from slime_strands.testing import Fault, SGLangTestServer, Turn

pytestmark = pytest.mark.timeout(60)

PARAMS = {"max_new_tokens": 64}
PROMPT = [9707, 11, 1879, 0]  # "Hello, world!"
# SGLang 0.5.23's context refusals, as its server answered them (sglang-0.5.23-answers/error_*.json)
INPUT_TOO_LONG = "The input (1100 tokens) is longer than the model's context length (1024 tokens)."
TOTAL_TOO_LONG = (
    "Requested token count exceeds the model's maximum context length of 1024 tokens. You requested a total "
    "of 1100 tokens: 1000 tokens from the input messages and 100 tokens for the completion. Please reduce the "
    "number of tokens in the input messages or the completion to fit within the limit."
)
SCHEDULER_BOUND = (
    "Input length (1020 tokens) exceeds the maximum allowed length (1018 tokens). Use a shorter input or "
    "enable --allow-auto-truncate."
)


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=4096) as srv:
        yield srv


def client_for(server: SGLangTestServer, **kwargs) -> SGLangClient:
    kwargs.setdefault("retry_delay", 0.01)
    kwargs.setdefault("max_retries", 5)
    return SGLangClient(server.base_url, **kwargs)


def prefix_pairs(rids: list[str]) -> list[tuple[str, str]]:
    """Pairs of ids one of which SGLang's prefix-matching abort of the other would reach."""
    return [(a, b) for a, b in itertools.permutations(rids, 2) if b.startswith(a)]


# -- request ids ------------------------------------------------------------------------------------------


async def test_no_request_id_is_a_prefix_of_another(server):
    """Retries after transient failures and resends after server aborts: every attempt an id of its own."""
    server.script(
        Fault(status=503),
        Fault(drop_connection=True),
        Turn("cut", finish="abort", abort_message="worker restarted"),
        Fault(status=502),
        Turn("cut again", finish="abort", abort_message="worker restarted"),
        "fine",
    )
    client = client_for(server)
    result = await client.generate(PROMPT, PARAMS, abort_retries=2)
    assert result.finish_reason == "stop"
    rids = [r.body["rid"] for r in server.generate_requests]
    assert len(rids) == 6 and len(set(rids)) == 6
    assert prefix_pairs(rids) == [], "SGLang's abort of one attempt would kill another"
    assert result.rid == rids[-1], "the answer is the last attempt's"
    server.script("again")
    await client.generate(PROMPT, PARAMS, abort_retries=2)
    rids.append(server.generate_requests[-1].body["rid"])
    assert prefix_pairs(rids) == [], "nor of another request's"
    await client.aclose()


async def test_a_timeout_is_reported_as_a_timeout_and_each_attempt_aborted_by_its_id(server):
    """Each attempt outlasts the client's timeout: the client gives it up, aborts it by its exact id (a router
    may not pass the disconnect on), sends a fresh one, and at last says it timed out."""
    server.script(*[Turn("slow", delay_s=600)] * 2)  # only an abort answers them
    client = client_for(server, timeout=1.0, max_retries=1)
    with pytest.raises(
        SGLangTimeoutError, match=r"timed out: no answer within the 1\.0 s request timeout in 2"
    ):
        await client.generate(PROMPT, PARAMS, abort_retries=3)
    rids = [r.body["rid"] for r in server.generate_requests]
    assert len(rids) == 2 and prefix_pairs(rids) == []
    aborts = [r.body for r in server.requests if r.path == "/abort_request"]
    assert aborts == [{"rid": rid} for rid in rids], "each given-up attempt aborted, by its own id, in order"
    await client.aclose()


async def test_abort_by_handle_reaches_each_attempt_and_nothing_else(server):
    """A caller's handle holds the ids of its attempts in flight: aborting it reaches the one running (the
    retry after a 503), not another caller's request, and no attempt is sent after it."""
    server.script(Fault(status=503), Turn("mine", delay_s=600), key="a")
    server.script(Turn("theirs", delay_s=600), key="b")
    client = client_for(server)
    handle = RequestHandle()
    mine = asyncio.create_task(
        client.generate(PROMPT, PARAMS, routing_key="a", handle=handle, abort_retries=3)
    )
    theirs = asyncio.create_task(client.generate(PROMPT, PARAMS, routing_key="b"))
    while len(server.in_flight) < 2 or not handle.rids:
        await asyncio.sleep(0.01)
    (running,) = handle.rids
    first = server.generate_requests[0].body["rid"]
    assert running != first and running in server.in_flight, "the retry is the attempt in flight"
    await client.abort(handle)
    result = await mine
    assert result.finish_reason == "abort", "an abort the caller asked for is not sent again"
    assert server.aborted_rids == [running]
    assert not theirs.done() and len(server.in_flight) == 1
    again = await client.generate(PROMPT, PARAMS, handle=handle)
    assert again.finish_reason == "abort" and again.output_ids == []
    assert len(server.generate_requests) == 3, "nothing is sent once the handle is aborted"
    await client.abort()
    assert (await theirs).finish_reason == "abort"
    await client.aclose()


# -- the context window -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "window"),
    [
        (INPUT_TOO_LONG, 1024),
        (TOTAL_TOO_LONG, 1024),
        (SCHEDULER_BOUND, 1018 + 6),  # the scheduler's bound is the window less SGLang's margin
        ("Request prompt exceeds the KV memory budget: input_len=99.", None),
    ],
)
async def test_a_context_refusal_teaches_the_window(tokenizer, message, window):
    with SGLangTestServer(tokenizer, report_window=False) as server:
        server.script(Fault(status=400, body={"error": {"message": message}}))
        client = client_for(server)
        assert await client.context_length() is None, "the server answers, but says no window"
        with pytest.raises(SGLangContextLengthError) as info:
            await client.generate(PROMPT, PARAMS)
        assert info.value.window == window
        assert await client.context_length() == window
        await client.aclose()


async def test_the_smallest_window_named_wins(tokenizer):
    """/v1/models names the context; the scheduler then refuses at a smaller KV pool's bound."""
    with SGLangTestServer(tokenizer, context_length=4096) as server:
        server.script(Fault(status=400, body={"error": {"message": SCHEDULER_BOUND}}))
        client = client_for(server)
        assert await client.context_length() == 4096
        with pytest.raises(SGLangContextLengthError):
            await client.generate(PROMPT, PARAMS)
        assert await client.context_length() == 1024
        await client.aclose()


async def test_window_discovery_waits_out_a_server_answering_503_everywhere(tokenizer):
    """The first questions fall in the server's 503 window: they are asked again with the backoff of a
    request, so the window is known before any turn is sent (never None for want of asking)."""
    with SGLangTestServer(tokenizer, context_length=2048, unavailable_s=1.5) as server:
        client = client_for(server, retry_delay=0.05, max_retries=60)
        assert await client.context_length() == 2048
        asked = [r.path for r in server.requests]
        assert asked[-1] == "/v1/models" and set(asked) <= {"/v1/models", "/server_info", "/model_info"}
        await client.aclose()


async def test_concurrent_turns_share_one_discovery(server):
    client = client_for(server)
    windows = await asyncio.gather(*(client.context_length() for _ in range(16)))
    assert windows == [4096] * 16
    assert [r.path for r in server.requests] == ["/v1/models"], "asked once for 16 waiting turns"
    await client.aclose()
