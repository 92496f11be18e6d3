"""A server that stops answering is logged once per base URL, however many requests and clients retry, and its
return once: real HTTP to the SGLang-protocol test server, no mocks."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from slime_strands import SGLangClient, SGLangConnectionError
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
