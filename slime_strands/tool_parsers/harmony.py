"""gpt-oss tool calls: the harmony format's messages, channels and recipients (``gpt-oss``)::

    <|channel|>analysis<|message|>REASONING<|end|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{json}<|call|>
    <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>

Format facts (OpenAI's harmony format; gpt-oss's chat template; SGLang's ``gpt-oss`` detector): a turn is one
or more messages, each a header, ``<|message|>``, a body and ``<|end|>`` (``<|call|>`` after a call,
``<|return|>`` after the final answer; the token that ended the turn is cut off before parsing). The generation
prompt ``<|start|>assistant`` opens the first message; later ones start with ``<|start|>assistant``. A header
holds ``<|channel|>CHANNEL``, and for a call the recipient ``to=functions.NAME``, before or after the channel
(the chat template writes ``assistant to=functions.NAME<|channel|>commentary json``), and the content type
(``<|constrain|>json`` or ``json``). The ``analysis`` channel is reasoning: a call addressed from it is drafted
inside reasoning and never runs. ``final`` and plain ``commentary`` bodies are the answer. A call's body must be
one JSON object.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._arguments import load_json_object
from .base import MalformedCall, ParseResult, ToolCall, ToolParser, ToolSchemas, clip

__all__ = ["GptOssToolParser"]

_START = "<|start|>"
_MESSAGE = "<|message|>"
_CHANNEL = "<|channel|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_HEADER = re.compile(
    r"(?:assistant)?\s*(?:to=(?P<before>\S+?)\s*)?<\|channel\|>(?P<channel>\w+)"
    r"(?:\s+to=(?P<after>\S+?))?\s*(?:<\|constrain\|>\s*)?(?P<type>json)?\s*",
    re.S,
)
_FUNCTIONS = "functions."


@dataclass(frozen=True)
class _Message:
    header: str
    body: str | None
    """None: the header has no ``<|message|>`` after it."""
    trailing: str = ""
    """Text after the message's end token (only a new message may follow one)."""


class GptOssToolParser(ToolParser):
    """Strict parser for harmony turns: reasoning, the answer and the calls, each from its channel."""

    name = "gpt-oss"
    family = "gpt-oss"
    markers = ("<|channel|>", "<|message|>", "<|call|>")
    turn_starts = ("<|channel|>final<|message|>",)

    def parse(
        self, text: str, *, starts_in_reasoning: bool = False, tools: ToolSchemas | None = None
    ) -> ParseResult:
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[ToolCall | MalformedCall] = []
        drafted = 0
        lead, messages = _messages(text)
        if lead.strip():
            content.append(lead.strip())
        for message in messages:
            head = _HEADER.fullmatch(message.header)
            if head is None or message.body is None or message.trailing.strip():
                calls.append(_malformed(message))
                continue
            recipient = head.group("before") or head.group("after")
            if head.group("channel") == "analysis":
                reasoning.append(message.body)
                drafted += recipient is not None
            elif recipient is not None:
                calls.append(_call(recipient, message.body))
            else:
                content.append(message.body)
        return ParseResult(
            content="\n".join(content).strip(),
            reasoning="".join(reasoning) if reasoning else None,
            calls=calls,
            reasoning_calls=drafted,
        )

    def parse_calls(self, text: str, tools: ToolSchemas) -> tuple[str, list[ToolCall | MalformedCall]]:
        result = self.parse(text, tools=tools)
        return result.content, result.calls

    def count_calls(self, text: str) -> int:
        return len(re.findall(r"\bto=\S", text))


def _messages(text: str) -> tuple[str, list[_Message]]:
    """Text before the first message (a model that wrote no header), and the messages."""
    pieces = text.split(_START)
    lead, messages = "", []
    for n, piece in enumerate(pieces):
        if n == 0 and _CHANNEL not in piece and _MESSAGE not in piece:
            lead = piece
            continue
        header, sep, body = piece.partition(_MESSAGE)
        ends = [at for at in (body.find(end) for end in _ENDS) if at >= 0]
        cut = min(ends) if ends else len(body)
        trailing = body[cut:]
        trailing = next((trailing[len(e) :] for e in _ENDS if trailing.startswith(e)), trailing)
        messages.append(_Message(header, body[:cut] if sep else None, trailing))
    return lead, messages


def _malformed(message: _Message) -> MalformedCall:
    raw = message.header + (_MESSAGE + message.body if message.body is not None else "")
    if message.trailing.strip():
        return MalformedCall("bad_json", f"text after the end of a message: {clip(message.trailing)}", raw)
    if message.body is None:
        return MalformedCall(
            "unclosed_tag", f"a message header without {_MESSAGE}: {clip(message.header)}", raw
        )
    if "to=" in message.header:
        return MalformedCall(
            "missing_name", f"a call whose header names no recipient: {clip(message.header)}", raw
        )
    return MalformedCall("unclosed_tag", f"a message header without a channel: {clip(message.header)}", raw)


def _call(recipient: str, body: str) -> ToolCall | MalformedCall:
    name = recipient[len(_FUNCTIONS) :] if recipient.startswith(_FUNCTIONS) else recipient
    if not name:
        return MalformedCall("missing_name", f"a call addressed to {recipient!r} names no function", body)
    payload = load_json_object(body.strip(), f"the arguments of the call to {name!r}", name)
    if isinstance(payload, MalformedCall):
        return payload
    return ToolCall(name=name, input=payload, raw=body)
