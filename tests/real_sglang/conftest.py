"""Fixtures of the real-SGLang tier: SGLang 0.5.23 itself serving a tiny random-weight Qwen3 on the CPU for the
tier's tests (see server_setup.py for how it is found or started), and a recording proxy in front of it.

Every test starts on an idle server (the fixture waits for it) and gets a fresh proxy, so what the proxy
recorded is the test's own.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from real_sglang.recording_proxy import RecordingProxy
from real_sglang.server_process import SGLangServerProcess
from real_sglang.server_setup import RunningServer, running_server_url, start_server, wait_idle


@pytest.fixture(scope="package")
def sglang_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServerProcess | RunningServer]:
    """SGLang 0.5.23 serving the tiny Qwen3 (window 1,024 tokens, KV pool 4,096) for the tier's tests: started
    at the first, stopped after the last (the rest of the suite runs without it)."""
    url = running_server_url()
    if url:
        yield RunningServer(url)
        return
    server = start_server(tmp_path_factory.mktemp("real-sglang"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def proxy(sglang_server: SGLangServerProcess | RunningServer) -> Iterator[RecordingProxy]:
    """A fresh recording proxy in front of an idle server."""
    wait_idle(sglang_server.base_url)
    with RecordingProxy(sglang_server.base_url) as recording:
        yield recording
    wait_idle(sglang_server.base_url)
