"""SGLangTestServer's lifecycle: a stopped server leaves no thread behind (a pytest process runs hundreds of
them), keep-alive connections a client still holds included, as a real server closes them when it stops."""

from __future__ import annotations

import socket
import struct
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


def _reset(connection: socket.socket) -> None:
    """Close with a TCP reset, as a client killed by Ctrl-C (an interrupted eval) leaves its connections."""
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    connection.close()


def test_a_client_that_resets_its_connections_prints_no_traceback(tokenizer, capfd):
    """The demo server runs in the user's terminal (README block 1): a client gone mid-connection (reset while
    its keep-alive connection waits for a next request, or before its request was read) is no error of the
    server's, and nothing is printed; the server answers the next client."""
    server = SGLangTestServer(tokenizer).start()
    try:
        host, port = server.base_url.removeprefix("http://").split(":")
        idle = socket.create_connection((host, int(port)), timeout=30)
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert idle.recv(1024).startswith(b"HTTP/1.1 200"), "answered; the connection stays open"
        _reset(idle)
        partial = socket.create_connection((host, int(port)), timeout=30)
        partial.sendall(b'POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"input_ids"')
        _reset(partial)
        fresh = socket.create_connection((host, int(port)), timeout=30)
        fresh.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert fresh.recv(1024).startswith(b"HTTP/1.1 200")
        fresh.close()
    finally:
        server.stop()  # joins every handler thread: whatever they printed is printed by now
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err, err
