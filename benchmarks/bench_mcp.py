"""What an MCP tool costs per call against the same tool as a Python Strands tool, at 64 and 512 concurrent
episodes; what an episode-scope stdio server costs to start; the peak processes and threads.

Each "episode" is a coroutine that makes ``--calls`` calls of ``add`` the way Strands' executor does
(``tool.stream(tool_use, state)`` to its result), all episodes at once on one event loop: as a Python tool
(``@strands.tool``), through a shared MCP session (``scope: shared``, one stdio server process), through an
episode-scope stdio server (a process per episode, ``--max-live`` of them at once: at 512 episodes the episodes
wait for a slot, so that row measures 512 starts, 64 at a time) and through episode-scope
streamable-HTTP sessions (one server process, a session per episode). The servers are the tests' FastMCP
calculator (``tests/mcp_servers/calc.py``). Figures: wall time and this process's CPU per call (the server's
CPU is not counted: it is the price of any out-of-process tool), and their ratio to the Python tool's.

    python benchmarks/bench_mcp.py                              # 64 and 512 episodes, 20 calls each
    python benchmarks/bench_mcp.py --episodes 8 --calls 3 --starts 2  # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALC = os.path.join(ROOT, "tests", "mcp_servers", "calc.py")


class Peak:
    """Samples this process's descendants and threads every 20 ms; keeps the most of each."""

    def __init__(self) -> None:
        import psutil

        self._me = psutil.Process()
        self.processes = self.threads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.processes = max(self.processes, len(self._me.children(recursive=True)))
            self.threads = max(self.threads, threading.active_count() - 1)  # less this watcher
            time.sleep(0.02)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


async def _episodes(tools_for: Any, episodes: int, calls: int) -> tuple[float, float, int]:
    """(wall s, CPU s, errors) of ``episodes`` coroutines each making ``calls`` calls of the tool
    ``tools_for()`` gives (an async context manager yielding the episode's ``add``)."""
    errors = 0

    async def one(i: int) -> None:
        nonlocal errors
        async with tools_for() as add:
            for c in range(calls):
                use = {"toolUseId": f"{i}-{c}", "name": add.tool_name, "input": {"a": i, "b": c}}
                async for event in add.stream(use, {}):
                    result = getattr(event, "tool_result", None)
                    if result is not None and result["status"] != "success":
                        errors += 1

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(episodes)))
    return time.perf_counter() - wall, time.process_time() - cpu, errors


def _settings(**server: Any) -> Any:
    from slime_strands.settings import McpServerSettings

    return McpServerSettings(**{"name": "calc", "tools": ("add",), "startup_timeout_s": 120.0, **server})


def _stdio(**kw: Any) -> Any:
    return _settings(command=sys.executable, args=(CALC,), **kw)


async def _mode(mode: str, episodes: int, calls: int, url: str | None, max_live: int) -> dict[str, Any]:
    import contextlib

    from strands import tool

    from slime_strands.mcp_tools import McpToolbox

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    toolbox = None
    if mode == "python":

        @contextlib.asynccontextmanager
        async def tools_for() -> Any:
            yield add

    else:
        server = {
            "shared": lambda: _stdio(),
            "episode stdio": lambda: _stdio(scope="episode", max_live=max_live),
            "episode http": lambda: _settings(
                transport="streamable_http", url=url, scope="episode", max_live=512
            ),
        }[mode]()
        toolbox = McpToolbox([server])
        await toolbox.preflight()

        @contextlib.asynccontextmanager
        async def tools_for() -> Any:
            async with toolbox.episode() as tools:
                yield tools[0]

    with Peak() as peak:
        wall, cpu, errors = await _episodes(tools_for, episodes, calls)
    if toolbox is not None:
        await toolbox.aclose()
    n = episodes * calls
    return {
        "wall_s": wall,
        "wall_ms": 1e3 * wall / n,
        "cpu_ms": 1e3 * cpu / n,
        "errors": errors,
        "procs": peak.processes,
        "threads": peak.threads,
    }


async def _start_cost(starts: int) -> tuple[float, float]:
    """Median wall ms to start an episode-scope stdio server (to MCP's initialize answered), and to stop it."""
    from slime_strands.mcp_tools.connection import Connection

    up, down = [], []
    for _ in range(starts):
        connection = Connection(_stdio(scope="episode"))
        t = time.perf_counter()
        await connection.open()
        up.append(time.perf_counter() - t)
        t = time.perf_counter()
        await connection.close()
        down.append(time.perf_counter() - t)
    return 1e3 * statistics.median(up), 1e3 * statistics.median(down)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--starts", type=int, default=8, help="episode-scope stdio starts timed one by one")
    parser.add_argument(
        "--max-live", type=int, default=64, help="episode-scope stdio: most server processes alive at once"
    )
    options = parser.parse_args()
    sys.path.insert(0, ROOT)
    port = _free_port()
    http = subprocess.Popen(
        [sys.executable, CALC, "--http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}/mcp"
        up, down = asyncio.run(_start_cost(options.starts))
        print(
            f"episode-scope stdio server: start {up:.0f} ms, stop {down:.0f} ms (median of {options.starts})"
        )
        print(
            "| episodes | tool | wall s | wall ms/call | CPU ms/call | vs Python (CPU) | peak processes | peak threads "
            "| errors |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for episodes in options.episodes:
            base = None
            for mode in ("python", "shared", "episode http", "episode stdio"):
                row = asyncio.run(_mode(mode, episodes, options.calls, url, options.max_live))
                base = base or row
                ratio = row["cpu_ms"] / base["cpu_ms"] if base["cpu_ms"] else float("nan")
                print(
                    f"| {episodes} | {mode} | {row['wall_s']:.1f} | {row['wall_ms']:.3f} | {row['cpu_ms']:.3f} | "
                    f"{ratio:.1f}x | "
                    f"{row['procs']} | {row['threads']} | {row['errors']} |",
                    flush=True,
                )
    finally:
        http.kill()
        http.wait()


if __name__ == "__main__":
    main()
