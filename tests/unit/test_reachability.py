"""A server that stops answering is logged once per base URL, however many requests and clients retry, and its
return once: real HTTP to the SGLang-protocol test server, no mocks."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time

import pytest

from slime_strands import SGLangClient, SGLangConnectionError, SGLangTimeoutError
from slime_strands.provider.reachability import Reachability
from slime_strands.testing import Fault, SGLangTestServer, Turn

pytestmark = pytest.mark.timeout(60)

PARAMS = {"max_new_tokens": 8}


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=4096) as srv:
        yield srv


def _lines(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


async def test_a_failing_server_is_logged_once_and_its_return_once(server, tokenizer, caplog):
    caplog.set_level(logging.WARNING, logger="slime_strands.provider.client")
    ids = tokenizer.encode("x", add_special_tokens=False)
    clients = [SGLangClient(server.base_url, max_retries=3, retry_delay=0.01) for _ in range(2)]
    server.responder = lambda body, headers: Fault(status=503)
    failed = await asyncio.gather(
        *(client.generate(ids, PARAMS) for client in clients for _ in range(4)), return_exceptions=True
    )
    assert all(isinstance(error, SGLangConnectionError) for error in failed), failed
    assert len(server.generate_requests) == 8 * 4, "every request was retried"
    (stopped,) = _lines(caplog, "stopped answering")
    assert stopped.startswith(f"SGLang at {server.base_url} stopped answering (POST /generate: HTTP 503)")
    assert _lines(caplog, "answers again") == []

    server.responder = lambda body, headers: Turn("ok")
    answered = await asyncio.gather(*(client.generate(ids, PARAMS) for client in clients for _ in range(4)))
    assert all(result.finish_reason == "stop" for result in answered)
    (back,) = _lines(caplog, "answers again")
    assert back.startswith(f"SGLang at {server.base_url} answers again after ")
    assert back.endswith("(32 failed attempt(s) in between)")
    assert len(_lines(caplog, "stopped answering")) == 1
    for client in clients:
        await client.aclose()


async def test_an_unreachable_server_is_logged_once(caplog):
    caplog.set_level(logging.WARNING, logger="slime_strands.provider.client")
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    client = SGLangClient(url, max_retries=2, retry_delay=0.01)
    failed = await asyncio.gather(
        *(client.generate([1, 2], PARAMS) for _ in range(5)), return_exceptions=True
    )
    assert all(isinstance(error, SGLangConnectionError) for error in failed)
    (stopped,) = _lines(caplog, "stopped answering")
    assert stopped.startswith(f"SGLang at {url} stopped answering (POST /generate: ClientConnectorError")
    await client.aclose()


# -- a busy server is not a dead one (issue 32.2) -----------------------------------------------------------


async def _keep_answering(client: SGLangClient, ids: list[int], stop: asyncio.Event) -> int:
    """Quick requests, one after another, until ``stop``: the other requests a busy server keeps answering."""
    answered = 0
    while not stop.is_set():
        result = await client.generate(ids, PARAMS)
        assert result.finish_reason == "stop"
        answered += 1
        await asyncio.sleep(0.02)
    return answered


async def test_timeouts_of_a_server_that_answers_others_are_one_line_and_a_count(tokenizer, caplog):
    """Ten attempts outlast the client's 2 s timeout (each is held by the server) while other requests keep being
    answered: one WARNING says they time out while the server answers others and what to change, nothing says it
    stopped answering, and once no request timed out for a whole timeout the next answer counts them."""
    caplog.set_level(logging.INFO, logger="slime_strands.provider.client")
    ids = tokenizer.encode("x", add_special_tokens=False)
    with SGLangTestServer(tokenizer, context_length=4096) as server:
        server.responder = lambda body, headers: Turn("ok")
        server.script(*[Turn("slow", delay_s=600)] * 10, key="held")  # only the client's abort ends them
        client = SGLangClient(server.base_url, max_retries=1, retry_delay=0.01, timeout=2.0)
        url, stop = server.base_url, asyncio.Event()
        others = asyncio.create_task(_keep_answering(client, ids, stop))
        timed_out = await asyncio.gather(
            *(client.generate(ids, PARAMS, routing_key="held") for _ in range(5)), return_exceptions=True
        )
        assert all(isinstance(error, SGLangTimeoutError) for error in timed_out), timed_out
        await asyncio.sleep(
            4.3
        )  # longer than a retry may take to time out, with answers and no timeout: over
        stop.set()
        assert await others > 10
        await client.aclose()
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [
        f"requests to SGLang at {url} time out at 2 s while it answers others (POST /generate): it is busy, not "
        "down; they are retried. Raise the request timeout (request_timeout_s, null: no limit) or lower the "
        "concurrency (slime's --sglang-server-concurrency, eval's --concurrency); a line will count them once they "
        "stop"
    ]
    (count,) = _lines(caplog, "request(s) timed out")
    assert count.startswith(f"SGLang at {url}: 10 request(s) timed out at 2 s in ")
    assert re.search(r", while it answered \d+ other generation\(s\); none since$", count), count
    assert client.reachability.failures_in_a_row == 0, "a busy server is no failing one (eval's watch)"


async def test_a_dead_server_stopped_answering_and_answers_again(tokenizer, caplog):
    """The same client against a server that stops (its port refuses connections) and starts again on that port:
    one line when it stops, one when it is back, and nothing about timeouts."""
    caplog.set_level(logging.INFO, logger="slime_strands.provider.client")
    ids = tokenizer.encode("x", add_special_tokens=False)
    server = SGLangTestServer(tokenizer, context_length=4096).start()
    server.responder = lambda body, headers: Turn("ok")
    url, port = server.base_url, server.port
    client = SGLangClient(url, max_retries=2, retry_delay=0.05, timeout=1.0)
    assert (await client.generate(ids, PARAMS)).finish_reason == "stop"
    server.stop()
    failed = await asyncio.gather(*(client.generate(ids, PARAMS) for _ in range(4)), return_exceptions=True)
    assert all(isinstance(error, SGLangConnectionError) for error in failed), failed
    assert not any(isinstance(error, SGLangTimeoutError) for error in failed)
    with SGLangTestServer(tokenizer, context_length=4096, port=port) as again:
        again.responder = lambda body, headers: Turn("ok")
        assert (await client.generate(ids, PARAMS)).finish_reason == "stop"
    await client.aclose()
    (stopped,) = _lines(caplog, "stopped answering")
    assert stopped.startswith(f"SGLang at {url} stopped answering (POST /generate: Client")  # reset, refused
    (back,) = _lines(caplog, "answers again")
    assert back.endswith("(12 failed attempt(s) in between)")
    assert _lines(caplog, "time out") == [] and _lines(caplog, "timed out") == []


async def test_a_server_that_answers_no_generation_within_the_timeout_is_said_so_once(tokenizer, caplog):
    """Every generation is held (overloaded, or a hung scheduler: it still accepts connections and answers the
    aborts of what it holds): one line says its requests time out and none is answered, never that it stopped
    answering (it refuses nothing); each such timeout is a failed attempt, so eval's watch asks /health."""
    caplog.set_level(logging.INFO, logger="slime_strands.provider.client")
    ids = tokenizer.encode("x", add_special_tokens=False)
    with SGLangTestServer(tokenizer, context_length=4096) as server:
        server.responder = lambda body, headers: Turn("held", delay_s=600)
        client = SGLangClient(server.base_url, max_retries=1, retry_delay=0.01, timeout=1.0)
        url = server.base_url
        failed = await asyncio.gather(
            *(client.generate(ids, PARAMS) for _ in range(3)), return_exceptions=True
        )
        assert all(isinstance(error, SGLangTimeoutError) for error in failed), failed
        assert client.reachability.failures_in_a_row == 6, (
            "each timed-out attempt is a failure: eval's watch acts"
        )
        await client.aclose()
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [
        f"requests to SGLang at {url} time out at 1 s and it answered no generation in that time (POST /generate): "
        "it is overloaded, or hung; they are retried. Raise the request timeout (request_timeout_s, null: no "
        "limit) or lower the concurrency (slime's --sglang-server-concurrency, eval's --concurrency); a line will "
        "count them once they stop"
    ]


def test_a_busy_servers_timeouts_are_no_failures_until_it_stops_generating():
    """The count eval's watch acts on, read right after the timeouts (no answer in between resets it): timeouts
    within a timeout of the last answered generation are a busy server's and count 0; the same timeouts once
    no generation was answered for longer than the timeout count one failure each."""
    state = Reachability("http://busy.invalid:1")
    state.answered(generated=True)
    for _ in range(5):
        state.timed_out("POST /generate", 600.0)
    assert state.failures_in_a_row == 0 and not state.failing, "a busy server is no failing one"
    state.failed("POST /generate: connection refused")
    assert state.failures_in_a_row == 1, "a refused connection is a failure, busy or not"

    idle = Reachability("http://idle.invalid:1")
    for _ in range(3):
        idle.timed_out("POST /generate", 600.0)
    assert idle.failures_in_a_row == 3, "no generation was ever answered: each timeout is a failure"

    stale = Reachability("http://stale.invalid:1")
    stale.answered(generated=True)
    answered_at = time.monotonic()
    while time.monotonic() - answered_at <= 0.05:  # the last answer is now older than the 0.05 s timeout
        time.sleep(0.01)
    stale.timed_out("POST /generate", 0.05)
    stale.timed_out("POST /generate", 0.05)
    assert stale.failures_in_a_row == 2, "no generation answered within the timeout: it counts"
    stale.answered()
    assert stale.failures_in_a_row == 0
