"""A stateless MCP server (the `mcp` package's FastMCP, ``MCPServer`` in mcp 2) the MCP tests share between episodes.

Run as a script: ``python calc.py`` serves stdio; ``python calc.py --http PORT`` serves streamable HTTP on
127.0.0.1. Its tools cover what a tool result can be: text, an image, structured content, an error, a 1 MB
text, a call that hangs, and the server's own death.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys

from mcp.server.mcpserver import Image, MCPServer

server = MCPServer("calc", log_level="WARNING")

# A 2x2 red PNG, written out so the server needs no image library.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGP4z8DAwMDAxMDAwMDAAAANHQEDasKb6QAAAABJRU5ErkJggg=="
)


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
async def hang(seconds: float) -> str:
    """Sleep for the given number of seconds, then answer."""
    await asyncio.sleep(seconds)
    return "woke up"


@server.tool()
def big(n_bytes: int) -> str:
    """Return n_bytes characters of text."""
    line = "0123456789abcdef" * 4 + "\n"
    return (line * (n_bytes // len(line) + 1))[:n_bytes]


@server.tool()
def picture() -> Image:
    """Return a small picture."""
    return Image(data=PNG, format="png")


@server.tool()
def stats(numbers: list[float]) -> dict[str, float]:
    """Mean and max of some numbers (structured content)."""
    return {"mean": sum(numbers) / len(numbers), "max": max(numbers)}


@server.tool()
def fail(reason: str) -> str:
    """Fail with the given reason."""
    raise ValueError(reason)


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
def die() -> str:
    """The server exits at once (a crash in the middle of a call)."""
    os._exit(3)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        asyncio.run(server.run_streamable_http_async(port=int(sys.argv[2])))
    else:
        server.run()
        os._exit(0)  # stdin closed: gone at once, without the interpreter's finalization (~0.3 s of CPU)
