"""Formats whose calls sit in one section of special tokens: Kimi-K2, DeepSeek-V3.1 and DeepSeek-V3 / R1::

    kimi_k2:      <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>
                  {json}<|tool_call_end|>...<|tool_calls_section_end|>
    deepseekv31:  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>...
                  <｜tool▁calls▁end｜>
    deepseekv3:   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{json}\n```
                  <｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>...<｜tool▁calls▁end｜>

Format facts: Kimi-K2's chat template writes ``<|tool_call_begin|>`` + the call id + ``<|tool_call_argument_begin|>``
+ the arguments JSON + ``<|tool_call_end|>`` per call inside the section, and shows a result as
``## Return of <id>``; the model writes ids as ``functions.NAME:IDX`` (SGLang's ``kimi_k2`` detector takes the
name from the id). DeepSeek-V3.1's template writes name + ``<｜tool▁sep｜>`` + the arguments JSON string
(SGLang's ``deepseekv31`` detector). DeepSeek-V3's and R1's templates (V3-0324, R1-0528) write the call's type
``function`` + ``<｜tool▁sep｜>`` + name + a newline + the arguments JSON string in a ```` ```json ```` fence, a
newline between calls (SGLang's ``deepseekv3`` detector reads the same).
"""

from __future__ import annotations

import re
from typing import ClassVar

from ._arguments import load_json_object
from .base import MalformedCall, ToolCall, ToolParser, ToolSchemas, clip, split_blocks

__all__ = ["DeepSeekV3ToolParser", "DeepSeekV31ToolParser", "KimiK2ToolParser", "SectionedToolParser"]


class SectionedToolParser(ToolParser):
    """Calls ``call_open HEADER call_sep JSON call_close`` inside ``section_open ... section_close``."""

    section_open: ClassVar[str]
    section_close: ClassVar[str]
    call_open: ClassVar[str]
    call_sep: ClassVar[str]
    call_close: ClassVar[str]
    header_format: ClassVar[str] = "a function name"

    def count_calls(self, text: str) -> int:
        return max(text.count(self.call_open), text.count(self.section_open))

    def header_name(self, header: str) -> tuple[str | None, str | None]:
        """``(name, call id)`` from the text before ``call_sep``; name None when malformed."""
        name = header.strip()
        return (name if name and not any(c.isspace() for c in name) else None), None

    def parse_calls(self, text: str, tools: ToolSchemas) -> tuple[str, list[ToolCall | MalformedCall]]:
        calls: list[ToolCall | MalformedCall] = []
        kept: list[str] = []
        pos = 0
        while True:
            start = text.find(self.section_open, pos)
            if start < 0:
                kept.append(text[pos:])
                break
            kept.append(text[pos:start])
            body_start = start + len(self.section_open)
            end = text.find(self.section_close, body_start)
            if end < 0:  # nothing in an unclosed section runs (like an unclosed <tool_call>)
                raw = text[start:]
                calls.append(
                    MalformedCall(
                        "unclosed_tag",
                        f"{self.section_open} was not closed with {self.section_close}: {clip(raw)}",
                        raw,
                    )
                )
                break
            calls.extend(self._section(text[body_start:end], tools))
            pos = end + len(self.section_close)
        content = "".join(kept)
        stray = content.count(self.call_open) + content.count(self.section_close)
        calls += [
            MalformedCall(
                "unclosed_tag",
                f"a tool call must sit between {self.section_open} and {self.section_close}",
                "",
            )
        ] * stray
        for token in (self.call_open, self.call_sep, self.call_close, self.section_close):
            content = content.replace(token, "")
        return content.strip(), calls

    def _section(self, body: str, tools: ToolSchemas) -> list[ToolCall | MalformedCall]:
        calls: list[ToolCall | MalformedCall] = []
        for before, call in split_blocks(body, self.call_open, self.call_close):
            if before.strip():
                calls.append(
                    MalformedCall(
                        "bad_arguments",
                        f"unexpected text in the tool-call section: {clip(before.strip())}",
                        before,
                    )
                )
            if isinstance(call, str):
                calls.append(self._call(call, tools))
            elif call is not None:
                calls.append(call)
        return calls

    def split_call(self, body: str) -> tuple[str, str | None, str] | MalformedCall:
        """``(name, call id, arguments JSON)`` of one call's body, or why it is malformed."""
        header, sep, arguments = body.partition(self.call_sep)
        if not sep:
            return MalformedCall(
                "bad_arguments",
                f"the tool call has no {self.call_sep} before its arguments: {clip(body)}",
                body,
            )
        name, call_id = self.header_name(header)
        if name is None:
            return MalformedCall(
                "missing_name",
                f"expected {self.header_format} before {self.call_sep}, got {clip(header)!r}",
                body,
            )
        return name, call_id, arguments.strip()

    def _call(self, body: str, tools: ToolSchemas) -> ToolCall | MalformedCall:
        split = self.split_call(body)
        if isinstance(split, MalformedCall):
            return split
        name, call_id, arguments = split
        payload = load_json_object(arguments, f"the arguments of the call to {name!r}", name)
        if isinstance(payload, MalformedCall):
            return MalformedCall(payload.kind, payload.message, body, name)
        return ToolCall(name=name, input=payload, raw=body, id=call_id)


class KimiK2ToolParser(SectionedToolParser):
    """Strict parser for Kimi-K2 calls; keeps the model's ``functions.NAME:IDX`` id for the template."""

    name = "kimi_k2"
    family = "Kimi-K2 / Kimi-K2-Thinking"
    markers = ("<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>")
    turn_starts = ("<|im_assistant|>assistant<|im_middle|>",)
    section_open = "<|tool_calls_section_begin|>"
    section_close = "<|tool_calls_section_end|>"
    call_open = "<|tool_call_begin|>"
    call_sep = "<|tool_call_argument_begin|>"
    call_close = "<|tool_call_end|>"
    header_format = "a call id functions.NAME:INDEX"
    _ID = re.compile(r"(?:functions\.)?([\w.\-]+):(\d+)")

    def header_name(self, header: str) -> tuple[str | None, str | None]:
        call_id = header.strip()
        match = self._ID.fullmatch(call_id)
        return (match.group(1), call_id) if match else (None, None)


class DeepSeekV31ToolParser(SectionedToolParser):
    """Strict parser for DeepSeek-V3.1 calls."""

    name = "deepseekv31"
    family = "DeepSeek-V3.1"
    markers = ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>")
    turn_starts = ("<｜Assistant｜>", "<｜tool▁output▁end｜>")  # the model answers right after a tool output
    section_open = "<｜tool▁calls▁begin｜>"
    section_close = "<｜tool▁calls▁end｜>"
    call_open = "<｜tool▁call▁begin｜>"
    call_sep = "<｜tool▁sep｜>"
    call_close = "<｜tool▁call▁end｜>"


class DeepSeekV3ToolParser(DeepSeekV31ToolParser):
    """Strict parser for DeepSeek-V3 / R1 calls: ``function<｜tool▁sep｜>NAME`` and the arguments in a json fence."""

    name = "deepseekv3"
    family = "DeepSeek-V3 / DeepSeek-R1"
    turn_starts = ("<｜Assistant｜>", "<｜tool▁outputs▁end｜>")
    header_format = "the call type 'function'"
    _FENCE_OPEN, _FENCE_CLOSE = "```json\n", "\n```"

    def header_name(self, header: str) -> tuple[str | None, str | None]:
        return ("function" if header.strip() == "function" else None), None

    def split_call(self, body: str) -> tuple[str, str | None, str] | MalformedCall:
        split = super().split_call(body)
        if isinstance(split, MalformedCall):
            return split
        rest = body.partition(self.call_sep)[2]
        name, newline, block = rest.partition("\n")
        name = name.strip()
        if not name or any(c.isspace() for c in name) or not newline:
            return MalformedCall(
                "missing_name",
                f"expected a function name and a newline after {self.call_sep}: {clip(rest)}",
                body,
            )
        block = block.strip()
        inner = block[len(self._FENCE_OPEN) :]
        if not block.startswith(self._FENCE_OPEN) or not inner.endswith(self._FENCE_CLOSE):
            return MalformedCall(
                "bad_arguments",
                f"the arguments of the call to {name!r} must be a ```json block: {clip(block)}",
                body,
                name,
            )
        return name, None, inner[: -len(self._FENCE_CLOSE)].strip()
