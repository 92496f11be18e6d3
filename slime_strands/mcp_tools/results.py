"""An MCP ``CallToolResult`` as the content of a Strands tool result: what the model's render then fits like any
tool's output (``max_tool_output_tokens``; an image through the image path, its pads counted)."""

from __future__ import annotations

import base64
import binascii
from typing import Any

__all__ = ["tool_result_content"]

_IMAGE_FORMATS = {
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/jpg": "jpeg",
    "image/gif": "gif",
    "image/webp": "webp",
}


def tool_result_content(result: Any, *, images: bool = True) -> tuple[list[dict[str, Any]], bool]:
    """(Strands content blocks, is an error) of a ``CallToolResult``. Text stays text; an image (PNG, JPEG,
    GIF, WebP) becomes an image block; what a model cannot be shown (audio, a binary resource, an image of
    another type) becomes a line saying what it was. Structured content is shown as JSON only when the server
    sent no content blocks (the MCP spec has servers also send it serialised as text). A result that is none
    of this is a ``ValueError`` (the caller turns it into a tool error). ``images`` false (a text model): an
    image becomes a line saying the model cannot be shown it."""
    blocks = getattr(result, "content", None)
    if not isinstance(blocks, list):
        raise ValueError(f"the MCP result has no content list ({type(result).__name__})")
    content = [_block(item, images) for item in blocks]
    structured = getattr(result, "structured_content", None)
    if not content and structured is not None:
        content.append({"json": structured})
    if not content:
        content.append({"text": ""})
    return content, bool(getattr(result, "is_error", False))


def _block(item: Any, images: bool) -> dict[str, Any]:
    kind = getattr(item, "type", None)
    if kind == "text":
        return {"text": str(item.text)}
    if kind == "image" and not images:
        return {"text": f"[an image ({item.mime_type}): this model cannot be shown images]"}
    if kind == "image":
        fmt = _IMAGE_FORMATS.get(str(item.mime_type).lower())
        if fmt is None:
            return {"text": f"[an image of type {item.mime_type} the model cannot be shown]"}
        try:
            data = base64.b64decode(item.data, validate=True)
        except (binascii.Error, ValueError):
            return {"text": "[an image the server sent is not valid base64]"}
        return {"image": {"format": fmt, "source": {"bytes": data}}}
    if kind == "resource":
        resource = item.resource
        text = getattr(resource, "text", None)
        if text is not None:
            return {"text": str(text)}
        return {
            "text": f"[a binary resource {resource.uri} ({getattr(resource, 'mime_type', None) or 'no type'})]"
        }
    if kind == "resource_link":
        return {"text": f"[resource {item.uri}{': ' + item.description if item.description else ''}]"}
    if kind == "audio":
        return {"text": "[audio the model cannot be shown]"}
    raise ValueError(f"unknown MCP content type {kind!r}")
