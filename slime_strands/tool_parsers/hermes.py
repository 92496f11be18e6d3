"""Hermes / Qwen3 tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

from __future__ import annotations

import json
import re
from typing import Any

from .base import ToolCall, ToolCallError, ToolParser

__all__ = ["HermesToolParser"]

_MAX_RAW_IN_MESSAGE = 300


class HermesToolParser(ToolParser):
    """Strict parser for the JSON-in-tags format of Qwen3 / Hermes chat templates.

    Every ``<tool_call>`` must be closed and hold one JSON object with a non-empty string ``name`` and an
    object ``arguments``. Anything else becomes a :class:`ToolCallError` that says what was wrong.
    """

    name = "hermes"
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def count_calls(self, text: str) -> int:
        return text.count(self.open_tag)

    def parse_calls(self, text: str) -> tuple[str, list[ToolCall | ToolCallError]]:
        calls: list[ToolCall | ToolCallError] = []
        kept: list[str] = []
        pattern = re.compile(re.escape(self.open_tag) + "|" + re.escape(self.close_tag))
        pos = 0
        while True:
            match = pattern.search(text, pos)
            if match is None:
                kept.append(text[pos:])
                break
            kept.append(text[pos : match.start()])
            if match.group() == self.close_tag:
                calls.append(
                    ToolCallError(
                        "unclosed_tag", f"found {self.close_tag} without a matching {self.open_tag}", ""
                    )
                )
                pos = match.end()
                continue
            body_start = match.end()
            nxt = pattern.search(text, body_start)
            if nxt is None or nxt.group() != self.close_tag:
                end = nxt.start() if nxt else len(text)
                raw = text[match.start() : end]
                calls.append(
                    ToolCallError(
                        "unclosed_tag",
                        f"{self.open_tag} was not closed with {self.close_tag}: {_clip(raw)}",
                        raw,
                    )
                )
                pos = end
                continue
            calls.append(self._parse_body(text[body_start : nxt.start()]))
            pos = nxt.end()
        return "".join(kept).strip(), calls

    def _parse_body(self, body: str) -> ToolCall | ToolCallError:
        raw = body.strip()
        try:
            payload: Any = json.loads(raw)
        except json.JSONDecodeError as exc:
            return ToolCallError("bad_json", f"the tool call is not valid JSON ({exc}): {_clip(raw)}", raw)
        except RecursionError:  # the policy can nest brackets deeper than the decoder recurses
            return ToolCallError("bad_json", f"the tool call JSON is nested too deeply: {_clip(raw)}", raw)
        if not isinstance(payload, dict):
            return ToolCallError(
                "bad_json",
                f"the tool call must be a JSON object, got {type(payload).__name__}: {_clip(raw)}",
                raw,
            )
        name = payload.get("name")
        if not isinstance(name, str) or not name.strip():
            return ToolCallError("missing_name", f'the tool call has no "name" string: {_clip(raw)}', raw)
        if "arguments" not in payload:
            return ToolCallError(
                "bad_arguments", f'the call to {name!r} has no "arguments" object', raw, name
            )
        arguments = payload["arguments"]
        if not isinstance(arguments, dict):
            return ToolCallError(
                "bad_arguments",
                f'"arguments" of the call to {name!r} must be a JSON object, got {type(arguments).__name__}',
                raw,
                name,
            )
        return ToolCall(name=name, input=arguments, raw=raw)


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_RAW_IN_MESSAGE else text[:_MAX_RAW_IN_MESSAGE] + "..."
