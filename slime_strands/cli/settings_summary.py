"""A few lines saying what a plugin settings file sets: what ``slime-strands validate-config`` prints after "ok".

The whole settings object is a screenful of defaults; what a reader checks is which tools the agent gets and
what the file changes from the defaults, so only that is shown (long texts by their length).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from ..settings import PluginSettings

__all__ = ["settings_summary"]

_SHOWN_CHARS = 60


def settings_summary(
    settings: PluginSettings, tools: Sequence[Any], mcp_tools: Sequence[Any] = ()
) -> list[str]:
    """The tools (name and dotted path), the MCP servers' tools (name, server), the parser, thinking and
    context choices, and every other setting that differs from its default."""
    names = [f"{tool.tool_name} ({path})" for tool, path in zip(tools, settings.tools, strict=True)]
    thinking = "the template's default" if settings.enable_thinking is None else settings.enable_thinking
    changed = [
        f"{name} {_shown(value)}"
        for name, value in _changes(settings, PluginSettings(), "")
        if name not in ("tools", "mcp_servers")  # on the first lines
    ]
    scopes = {server.name: server.scope for server in settings.mcp_servers}
    mcp = [f"{tool.tool_name} ({tool.server}, {scopes[tool.server]})" for tool in mcp_tools]
    return [
        f"tools: {', '.join(names) or 'none'}",
        *([f"MCP tools: {', '.join(mcp)}"] if mcp else []),
        f"tool parser: {settings.tool_parser}; thinking: {thinking}; context management: "
        f"{settings.context_management}",
        f"changed from the defaults: {', '.join(changed) or 'nothing'}",
    ]


def _changes(settings: Any, default: Any, prefix: str) -> list[tuple[str, Any]]:
    """``(dotted name, value)`` of every field of ``settings`` that differs from ``default``, nested sections
    field by field."""
    out: list[tuple[str, Any]] = []
    for field in dataclasses.fields(settings):
        value, base = getattr(settings, field.name), getattr(default, field.name)
        if value == base:
            continue
        if dataclasses.is_dataclass(value):
            out += _changes(value, base, f"{prefix}{field.name}.")
        else:
            out.append((prefix + field.name, value))
    return out


def _shown(value: Any) -> str:
    if isinstance(value, str) and len(value) > _SHOWN_CHARS:
        return f"({len(value)} characters)"
    if isinstance(value, tuple):
        value = list(value)
    text = json.dumps(dict(value) if hasattr(value, "keys") else value, ensure_ascii=False)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."
