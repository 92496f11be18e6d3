"""Strands messages and tool specs in the form chat templates take: role / content messages with
``tool_calls`` and ``tool`` results, and OpenAI-style function specs.

Every content block is kept (text joined, tool results flattened to their text), so what the template renders
is what the agent saw. The model renders new messages with these each turn; the eval writes a trajectory row's
conversation with them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .chat_template import TemplateError

__all__ = ["to_template_messages", "to_template_tools", "tool_result_text"]


def tool_result_text(result: Mapping[str, Any]) -> str:
    """Flatten a Strands toolResult's content blocks into the text the template shows the model."""
    parts: list[str] = []
    for block in result.get("content") or []:
        if "text" in block:
            parts.append(str(block["text"]))
        elif "json" in block:
            parts.append(json.dumps(block["json"], ensure_ascii=False))
        elif "image" in block:
            parts.append("[image omitted]")
        elif "document" in block:
            parts.append("[document omitted]")
    return "\n".join(parts)


def to_template_tools(tool_specs: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Strands tool specs -> the OpenAI-style function list chat templates expect."""
    if not tool_specs:
        return None
    tools = []
    for spec in tool_specs:
        schema = spec.get("inputSchema", {})
        parameters = schema.get("json", schema) if isinstance(schema, Mapping) else {}
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": spec["name"],
                    "description": spec.get("description", ""),
                    "parameters": parameters,
                },
            }
        )
    return tools


def to_template_messages(
    messages: Sequence[Mapping[str, Any]],
    tool_order: Sequence[str] | None = None,
    tool_ids: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Strands messages -> chat-template messages.

    Every content block is kept: text blocks are joined, each toolResult becomes one ``tool`` message (in
    ``tool_order`` when given: the order of the assistant's calls), toolUse blocks become ``tool_calls``.
    ``tool_ids`` maps a ``toolUseId`` to the call id the model wrote (Kimi-K2's ``functions.add:0``), which
    templates show with the result.
    """
    ids = tool_ids or {}
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        blocks = message.get("content") or []
        texts = [str(b["text"]) for b in blocks if "text" in b]
        if role == "assistant":
            calls = [
                {
                    "id": ids.get(b["toolUse"]["toolUseId"], b["toolUse"]["toolUseId"]),
                    "type": "function",
                    "function": {"name": b["toolUse"]["name"], "arguments": b["toolUse"]["input"]},
                }
                for b in blocks
                if "toolUse" in b
            ]
            entry: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
            if calls:
                entry["tool_calls"] = calls
            out.append(entry)
            continue
        if role != "user":
            raise TemplateError(f"unsupported message role {role!r}")
        results = [b["toolResult"] for b in blocks if "toolResult" in b]
        if tool_order:
            rank = {tool_id: i for i, tool_id in enumerate(tool_order)}
            results.sort(key=lambda r: rank.get(r.get("toolUseId", ""), len(rank)))
        for result in results:
            tool_use_id = result.get("toolUseId")
            out.append(
                {
                    "role": "tool",
                    "content": tool_result_text(result),
                    "tool_call_id": ids.get(tool_use_id, tool_use_id) if tool_use_id else tool_use_id,
                }
            )
        if texts or not results:
            out.append({"role": "user", "content": "\n".join(texts)})
    return out
