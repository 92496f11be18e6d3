"""SGLangTestServer's lifecycle: a stopped server leaves no thread behind (a pytest process runs hundreds of
them), keep-alive connections a client still holds included, as a real server closes them when it stops."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from standin_kit import post, prompt, send_and_hang_up, wait_until

from slime_strands import SGLangClient
from slime_strands.testing import SGLangTestServer, Turn


def _server_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "sglang-test-server" or "process_request" in t.name}


async def test_stop_ends_the_server_and_every_connection_thread(tokenizer):
    before = _server_threads()
    server = SGLangTestServer(tokenizer).start()
    server.script("Hello.<|im_end|>", "Again.<|im_end|>")
    client = SGLangClient(server.base_url, retry_delay=0.01, max_retries=0)
    prompt = tokenizer.encode("Say hello.")
    for _ in range(2):  # the pool keeps its connection open: its handler thread waits for a next request
        assert (await client.generate(prompt, {"max_new_tokens": 8})).output_ids
    assert _server_threads() - before, "the server and its connection are served by threads"
    server.stop()
    assert _server_threads() - before == set()
    await client.aclose()


def test_a_server_is_started_once(tokenizer):
    with SGLangTestServer(tokenizer) as server, pytest.raises(RuntimeError, match="already running"):
        server.start()
    server.start().stop()  # a stopped server can start again


def test_stop_ends_waiting_and_running_requests_and_their_threads(tokenizer):
    """A request running, one waiting in the queue and one whose client hung up: stop() answers or drops each
    and joins every thread."""
    before = _server_threads()
    server = SGLangTestServer(tokenizer, context_length=100, kv_capacity=100).start()
    server.script(Turn("held", delay_s=600), Turn("held too", delay_s=600))
    request = {"input_ids": prompt(tokenizer, 15), "sampling_params": {"max_new_tokens": 60}}
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(post, server, "/generate", {**request, "rid": "running"})
        wait_until(lambda: server.running == ["running"])
        waiting = pool.submit(post, server, "/generate", {**request, "rid": "waiting"})
        wait_until(lambda: server.waiting == ["waiting"])
        send_and_hang_up(server, {**request, "rid": "gone"}, until=lambda: "gone" in server.waiting)
        server.stop()
        assert running.result()[1]["meta_info"]["finish_reason"]["message"] == "Aborted"
        assert waiting.result()[1]["meta_info"]["finish_reason"]["message"] == "Abort in waiting queue"
    assert _server_threads() - before == set()
    assert server.in_flight == []
