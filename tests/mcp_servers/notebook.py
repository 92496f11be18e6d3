"""A stateful MCP server: a notebook and a counter, one per process over stdio, one per MCP session over HTTP.

``python notebook.py`` serves stdio (the process is the episode's: its state is the episode's);
``python notebook.py --http PORT`` serves streamable HTTP, keeping a notebook per session id, so an episode
that opens its own session sees only its own state.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections import defaultdict

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("notebook", log_level="WARNING")
NOTES: defaultdict[str, list[str]] = defaultdict(list)


def _key(ctx: Context) -> str:
    """The MCP session's id over HTTP; over stdio the process is the session."""
    request = ctx.request_context.request
    if request is None:
        return "stdio"
    return str(request.headers.get("mcp-session-id"))


@server.tool()
def write(text: str, ctx: Context) -> str:
    """Append a line to the notebook; says how many lines it holds."""
    NOTES[_key(ctx)].append(text)
    return f"{len(NOTES[_key(ctx)])} lines"


@server.tool()
def read(ctx: Context) -> str:
    """The notebook's lines, one per line ('(empty)' when there are none)."""
    return "\n".join(NOTES[_key(ctx)]) or "(empty)"


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
