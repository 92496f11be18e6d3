"""Raw HTTP against the stand-in server, for the tests of the stand-in itself: one request per connection, the
status and JSON body (or a hang-up) as the server sent them, no client logic in between."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Callable
from typing import Any

from slime_strands.testing import SGLangTestServer

QWEN3_EOS = ("<|im_end|>", "<|endoftext|>")  # Qwen3's generation_config eos_token_id: [151645, 151643]
NEWLINE = 198


def prompt(tokenizer: Any, n: int) -> list[int]:
    """``n`` real ids ending with a newline (like the recorded prompts)."""
    text = "The quick brown fox jumps over the lazy dog. " * (n // 8 + 1)
    return [*tokenizer.encode(text, add_special_tokens=False)[: n - 1], NEWLINE]


def post(server: SGLangTestServer, path: str, body: Any) -> tuple[int | None, Any]:
    """(status, JSON body or ""), or (None, "") when the server hangs up without an answer."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
    except (http.client.RemoteDisconnected, ConnectionError):
        return None, ""
    finally:
        connection.close()
    return response.status, json.loads(data) if data else ""


def get(server: SGLangTestServer, path: str) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        data = response.read()
    finally:
        connection.close()
    return response.status, json.loads(data) if data else ""


def send_and_hang_up(server: SGLangTestServer, body: Any, until: Callable[[], bool]) -> None:
    """Send a /generate, wait until ``until()`` holds (e.g. the server runs it), then close the connection
    without reading the answer: a client timing out."""
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as connection:
        head = f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        connection.sendall(head.encode() + data)
        wait_until(until)


def wait_until(condition: Callable[[], bool]) -> None:
    """Poll a condition the server reaches by itself (the test's timeout bounds the wait)."""
    while not condition():
        time.sleep(0.005)
