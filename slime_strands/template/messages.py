"""Strands messages and tool specs in the form chat templates take: role / content messages with
``tool_calls`` and ``tool`` results, and OpenAI-style function specs.

Every content block is kept (text joined, tool results flattened to their text), so what the template renders
is what the agent saw. A message or tool result holding images gets list content instead, in block order:
``{"type": "image", "image": <the Strands image content>}`` and ``{"type": "text", "text": ...}`` items, the
form Qwen-VL templates render (one ``<|vision_start|><|image_pad|><|vision_end|>`` per image item); a message
without images keeps its string content, byte for byte as before. The model renders new messages with these
each turn; the eval writes a trajectory row's conversation with them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .chat_template import TemplateError

__all__ = [
    "IMAGE_TEXT",
    "image_items",
    "to_template_messages",
    "to_template_tools",
    "tool_message",
    "tool_result_text",
]

IMAGE_TEXT = "[image omitted]"
"""What an image is as plain text (a text-only view of a tool result)."""


def image_items(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The Strands image contents of template messages, in the order a template renders them."""
    return [
        item["image"]
        for message in messages
        if isinstance(message.get("content"), list)
        for item in message["content"]
        if item.get("type") == "image"
    ]


def _content(parts: list[tuple[str, Any]], joiner: str) -> str | list[dict[str, Any]]:
    """``(kind, value)`` parts as template content: the texts joined when there is no image, else a list."""
    if all(kind == "text" for kind, _ in parts):
        return joiner.join(value for _, value in parts)
    return [
        {"type": "image", "image": value} if kind == "image" else {"type": "text", "text": value}
        for kind, value in parts
    ]


def tool_message(content: Any, call_id: str | None, role: str = "tool") -> dict[str, Any]:
    """A tool result as chat templates take it: the one shape of every result an episode renders AND of every
    result the template probe renders (``facts.py``), so that a template is refused only for what an episode
    would hit (Mistral Small 3.1's concatenates the ``tool_call_id``, and raises on a message without it)."""
    return {"role": role, "content": content, "tool_call_id": call_id}


def tool_result_text(result: Mapping[str, Any]) -> str:
    """Flatten a Strands toolResult's content blocks into text (images named, not shown)."""
    return "\n".join(
        value if kind == "text" else IMAGE_TEXT for kind, value in _result_parts(result, images=True)
    )


def _message_parts(blocks: Sequence[Mapping[str, Any]], *, images: bool) -> list[tuple[str, Any]]:
    """A user message's text and image blocks, in order (its tool results are messages of their own)."""
    parts: list[tuple[str, Any]] = []
    for block in blocks:
        if "text" in block:
            parts.append(("text", str(block["text"])))
        elif "image" in block:
            parts.append(("image", block["image"]) if images else ("text", IMAGE_TEXT))
    return parts


def _result_parts(result: Mapping[str, Any], *, images: bool) -> list[tuple[str, Any]]:
    parts: list[tuple[str, Any]] = []
    for block in result.get("content") or []:
        if "text" in block:
            parts.append(("text", str(block["text"])))
        elif "json" in block:
            parts.append(("text", json.dumps(block["json"], ensure_ascii=False)))
        elif "image" in block:
            parts.append(("image", block["image"]) if images else ("text", IMAGE_TEXT))
        elif "document" in block:
            parts.append(("text", "[document omitted]"))
    return parts


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
    *,
    images: bool = True,
) -> list[dict[str, Any]]:
    """Strands messages -> chat-template messages.

    Every content block is kept: text blocks are joined, each toolResult becomes one ``tool`` message (in
    ``tool_order`` when given: the order of the assistant's calls), toolUse blocks become ``tool_calls``.
    ``tool_ids`` maps a ``toolUseId`` to the call id the model wrote (Kimi-K2's ``functions.add:0``), which
    templates show with the result. ``images`` False names each image as text instead (a text-only view).
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
        parts = _message_parts(blocks, images=images)
        if tool_order:
            rank = {tool_id: i for i, tool_id in enumerate(tool_order)}
            results.sort(key=lambda r: rank.get(r.get("toolUseId", ""), len(rank)))
        for result in results:
            tool_use_id = result.get("toolUseId")
            out.append(
                tool_message(
                    _content(_result_parts(result, images=images), "\n"),
                    ids.get(tool_use_id, tool_use_id) if tool_use_id else tool_use_id,
                )
            )
        if parts or not results:
            out.append({"role": "user", "content": _content(parts, "\n")})
    return out
