"""Helpers of the MCP tests: the real MCP servers of ``tests/mcp_servers`` as ``mcp_servers`` settings, a
streamable-HTTP server process on a free port, the calls an episode's model writes, and what a process holds
(child processes, threads, fds) to show nothing of a server outlives it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

SERVERS = Path(__file__).resolve().parent / "mcp_servers"
ANSWER = "The sum is 5.\nAnswer: \\boxed{5}"


def stdio_server(script: str, name: str, **settings: Any) -> dict[str, Any]:
    """``mcp_servers`` settings of the script ``tests/mcp_servers/<script>.py`` over stdio."""
    return {
        "name": name,
        "transport": "stdio",
        "command": sys.executable,
        "args": [str(SERVERS / f"{script}.py")],
        **settings,
    }


def http_server(url: str, name: str, **settings: Any) -> dict[str, Any]:
    return {"name": name, "transport": "streamable_http", "url": url, **settings}


def call(name: str, **arguments: Any) -> str:
    """An assistant turn calling ``name`` (Qwen3's hermes format)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def tool_texts(tokenizer: Any, sample: Any) -> list[str]:
    """The text of every tool result the model was shown in ``sample`` (Qwen3's ``<tool_response>`` blocks of
    its decoded tokens)."""
    text = tokenizer.decode(sample.tokens)
    return re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, flags=re.S)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def http_mcp_server(script: str) -> Iterator[str]:
    """``tests/mcp_servers/<script>.py`` serving streamable HTTP on a free port; yields its MCP url."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVERS / f"{script}.py"), "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP MCP server did not start: {process.stderr.read()!r}")  # type: ignore[union-attr]
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait()
        if process.stderr is not None:
            process.stderr.close()


def connections_to(url: str) -> list[Any]:
    """This process's open TCP connections to the server of ``url`` (``http://127.0.0.1:PORT/...``)."""
    port = int(url.split(":")[2].split("/")[0])
    return [
        c
        for c in psutil.Process().connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status != psutil.CONN_TIME_WAIT
    ]


def children() -> list[psutil.Process]:
    """This process's live descendants that run one of ``tests/mcp_servers`` (zombies reaped or not, they hold
    nothing): only the MCP servers, so that a process another test left behind does not count here."""
    alive = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.status() != psutil.STATUS_ZOMBIE and any(
                str(SERVERS) in arg for arg in process.cmdline()
            ):
                alive.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # ended since the listing, or not ours to read
            pass
    return alive


def wait_for(predicate: Any, timeout: float = 60.0) -> bool:
    """Polls ``predicate`` until it holds (True) or ``timeout`` passes (False): for what ends in the
    background, such as a process the kernel has yet to reap."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def held() -> tuple[int, int, int]:
    """(child processes, threads, pipe and file fds) of this process that an MCP session could hold: the
    threads of the in-process SGLang stand-in (one per keep-alive connection) and of asyncio's default executor
    (it grows with the load) are not counted, nor are sockets (the client's pool to the stand-in); a stdio
    server's pipes, its stderr file and asyncio's child-watcher thread per server are."""
    threads = [
        t
        for t in threading.enumerate()
        if "process_request_thread" not in t.name and not t.name.startswith("asyncio_")
    ]
    fds = [
        fd for fd in os.listdir("/proc/self/fd") if not _readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    ]
    return len(children()), len(threads), len(fds)


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # closed since the listing
        return "socket:"
