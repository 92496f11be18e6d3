"""MCP servers' tools in agent episodes, on the episode's own event loop (the ``mcp`` package's async client).

``McpToolbox`` (one per :class:`~slime_strands.agent.runtime.Runtime`) runs the servers of
``settings.mcp_servers``: a shared server's session is opened at the first sample and multiplexed by every
episode of the loop; an episode-scope server (or HTTP session) is started for one episode and stopped when it
ends. Each MCP tool reaches the agent as a Strands tool (``McpTool``) with the server's JSON schema.
"""

from .connection import McpServerError
from .tool import McpTool
from .toolbox import McpToolbox

__all__ = ["McpServerError", "McpTool", "McpToolbox"]
