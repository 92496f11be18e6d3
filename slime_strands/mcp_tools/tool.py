"""An MCP server's tool as a Strands tool: the server's name, description and JSON schema, its calls sent on a
session of the episode's loop and their results made Strands tool results (a failed call is a tool error the
model sees; the episode goes on)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

from strands.types._events import ToolResultEvent
from strands.types.tools import AgentTool, ToolGenerator, ToolResult, ToolResultContent, ToolSpec, ToolUse

from .connection import McpCallError
from .results import tool_result_content

__all__ = ["McpTool"]

Caller = Callable[[str, dict[str, Any]], Awaitable[Any]]
"""Sends one call (the MCP tool's own name, its arguments) and returns the server's ``CallToolResult``."""


class McpTool(AgentTool):
    """One MCP tool offered to the agent as ``name`` (the server's prefix and the MCP tool's name)."""

    def __init__(
        self, name: str, spec: ToolSpec, mcp_name: str, call: Caller, *, server: str, images: bool = True
    ) -> None:
        """``images``: false for a model that cannot be shown images (a text model): an image the server
        sends becomes a line saying so."""
        super().__init__()
        self._images = images
        self._name = name
        self._spec = spec
        self._mcp_name = mcp_name
        self._call = call
        self.server = server

    @property
    def call(self) -> Caller:
        """What sends this tool's calls."""
        return self._call

    @property
    def tool_name(self) -> str:
        return self._name

    @property
    def tool_spec(self) -> ToolSpec:
        return self._spec

    @property
    def tool_type(self) -> str:
        return "mcp"

    def bound_to(self, call: Caller, *, images: bool = True) -> McpTool:
        """The same tool, its calls sent by ``call`` (an episode's own session)."""
        return McpTool(self._name, self._spec, self._mcp_name, call, server=self.server, images=images)

    async def stream(
        self, tool_use: ToolUse, invocation_state: dict[str, Any], **kwargs: Any
    ) -> ToolGenerator:
        arguments = tool_use.get("input")
        try:
            if not isinstance(arguments, dict):
                raise McpCallError(f"the arguments must be an object, got {type(arguments).__name__}")
            result = await self._call(self._mcp_name, arguments)
            content, error = tool_result_content(result, images=self._images)
        except McpCallError as exc:
            content, error = [{"text": f"Error: {self._name}: {exc}"}], True
        except ValueError as exc:
            content, error = (
                [{"text": f"Error: {self._name}: the MCP server's answer is malformed: {exc}"}],
                True,
            )
        answer: ToolResult = {
            "toolUseId": tool_use["toolUseId"],
            "status": "error" if error else "success",
            "content": cast(list[ToolResultContent], content),
        }
        yield ToolResultEvent(answer)


def tool_spec(name: str, mcp_tool: Any) -> ToolSpec:
    """The Strands spec of an MCP tool offered as ``name``: its description and input schema as the server
    gave them (the chat template renders them like any tool's)."""
    schema = dict(getattr(mcp_tool, "input_schema", None) or {"type": "object", "properties": {}})
    description = getattr(mcp_tool, "description", None) or getattr(mcp_tool, "title", None) or mcp_tool.name
    return {"name": name, "description": str(description), "inputSchema": {"json": schema}}
