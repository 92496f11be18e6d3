"""The example MCP server of configs/strands_mcp.yaml: arithmetic (stateless) and a scratch notebook (stateful).

Written with the ``mcp`` package's FastMCP (``MCPServer`` in mcp 2), served over stdio. The config runs it
twice: once shared, offering only the arithmetic, and once per episode, offering only the notebook (each
episode's notebook starts empty and dies with the episode).
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("math", log_level="WARNING")
_NOTES: list[str] = []


@server.tool()
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@server.tool()
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


@server.tool()
def write(text: str) -> str:
    """Write a line in your scratch notebook; says how many lines it holds."""
    _NOTES.append(text)
    return f"{len(_NOTES)} lines"


@server.tool()
def read() -> str:
    """Read your scratch notebook back."""
    return "\n".join(_NOTES) or "(empty)"


if __name__ == "__main__":
    server.run()
