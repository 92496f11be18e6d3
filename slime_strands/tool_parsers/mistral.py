"""Mistral tool calls (``mistral``): after ``[TOOL_CALLS]``, a JSON array of calls or one call per marker::

    [TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}, "id": "a1b2c3d4e"}]      Mistral 7B v0.3, Nemo
    [TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]mul[ARGS]{"b": 2}                    Small 3.1+, Devstral, Magistral
    [TOOL_CALLS]add[CALL_ID]a1b2c3d4e[ARGS]{"a": 1}                              Small 3.2's template

Format facts (Mistral's chat templates; SGLang's ``mistral`` detector reads the array and the ``[ARGS]`` forms):
the array holds objects with a ``name`` string and an ``arguments`` object (Nemo's template adds the call's
9-character ``id``, kept as the call id the template shows again); the ``[ARGS]`` form writes the name, an
optional ``[CALL_ID]`` and id, then the arguments object. Reasoning models (Magistral, Ministral 3 Reasoning)
think between ``[THINK]`` and ``[/THINK]``. Anything after a call but the next ``[TOOL_CALLS]`` is an error.
"""

from __future__ import annotations

import json
import re

from ._arguments import json_call, json_error, json_object
from .base import MalformedCall, ToolCall, ToolParser, ToolSchemas, clip

__all__ = ["MistralToolParser"]

_MARKER = "[TOOL_CALLS]"
_ARGS = "[ARGS]"
_CALL_ID = "[CALL_ID]"
_ARRAY = re.compile(r"\s*\[\s*[{\]]")


class MistralToolParser(ToolParser):
    """Strict parser for both Mistral forms: each ``[TOOL_CALLS]`` starts a call (or an array) of its own."""

    name = "mistral"
    family = "Mistral (7B v0.3, Nemo, Small 3.x, Devstral, Magistral)"
    markers = (_MARKER,)
    turn_starts = ("[/INST]", "[/TOOL_RESULTS]")
    think_open = "[THINK]"
    think_close = "[/THINK]"

    def count_calls(self, text: str) -> int:
        return text.count(_MARKER)

    def parse_calls(self, text: str, tools: ToolSchemas) -> tuple[str, list[ToolCall | MalformedCall]]:
        content, _, rest = text.partition(_MARKER)
        if not _:
            return text.strip(), []
        calls: list[ToolCall | MalformedCall] = []
        for piece in rest.split(_MARKER):  # each marker starts a call of its own
            calls += _array(piece) if _ARRAY.match(piece) else [_compact(piece)]
        return content.strip(), calls


def _array(piece: str) -> list[ToolCall | MalformedCall]:
    """``[{...}, ...]``: one call per object; nothing but whitespace may follow the array."""
    text = piece.strip()
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        return [json_error(exc, "the tool-call array", text)]
    if text[end:].strip():
        return [MalformedCall("bad_json", f"unexpected text after the tool calls: {clip(text[end:])}", text)]
    calls: list[ToolCall | MalformedCall] = []
    for item in value:
        raw = json.dumps(item, ensure_ascii=False)
        payload = json_object(item, "the tool call", raw)
        if isinstance(payload, MalformedCall):
            return [*calls, payload]
        call_id = payload.get("id")
        call = json_call({k: v for k, v in payload.items() if k != "id"}, raw, ("arguments",))
        if isinstance(call, ToolCall) and isinstance(call_id, str) and call_id:
            call = ToolCall(call.name, call.input, call.raw, call_id)
        calls.append(call)
    return calls


def _compact(piece: str) -> ToolCall | MalformedCall:
    """``NAME[ARGS]{...}`` or ``NAME[CALL_ID]ID[ARGS]{...}``."""
    head, sep, arguments = piece.partition(_ARGS)
    if not sep:
        return MalformedCall(
            "bad_arguments", f"the tool call has no {_ARGS} before its arguments: {clip(piece)}", piece
        )
    name, has_id, call_id = (part.strip() for part in head.partition(_CALL_ID))
    if not name or any(c.isspace() or c in "[]{}" for c in name):
        return MalformedCall("missing_name", f"expected a function name after {_MARKER}: {clip(head)}", piece)
    if has_id and not call_id:
        return MalformedCall("bad_arguments", f"{_CALL_ID} of the call to {name!r} names no id", piece, name)
    text = arguments.strip()
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        error = json_error(exc, f"the arguments of the call to {name!r}", text, name)
        return MalformedCall(error.kind, error.message, piece, name)
    if text[end:].strip():
        return MalformedCall(
            "bad_json", f"unexpected text after the call to {name!r}: {clip(text[end:])}", piece, name
        )
    payload = json_object(value, f"the arguments of the call to {name!r}", text, name)
    if isinstance(payload, MalformedCall):
        return MalformedCall(payload.kind, payload.message, piece, name)
    return ToolCall(name=name, input=payload, raw=piece, id=call_id or None)
