"""A trajectory row laid out for reading, token by token: what both ``inspect`` renderers (terminal, HTML) show.

Each segment (context window) is cut into blocks at its spans: the prompt, every generated turn (trained
tokens: loss mask 1, with their logprobs) and the tool / template tokens between turns. Generated turns are
annotated with the tool calls the agent made of them and tool blocks with the results the tools returned (from
the row's ``messages``, which belong to the last segment). Token texts are decoded one token at a time; a
character split over several tokens (multi-byte UTF-8) is shown on its first token. An image's run of pads is
one cell naming the image (``[image 1: 77 tokens]``), which the HTML page shows inline.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .file import SavedSegment, TrajectoryRow

__all__ = ["Block", "SegmentView", "TokenCell", "TrajectoryView", "build_view", "token_texts"]

_REPLACEMENT = "\ufffd"
# A UTF-8 character spans at most 4 bytes; byte-level BPE pieces can be single bytes.
_MAX_CHARACTER_TOKENS = 8
_NOTE_CHARS = 300


@dataclass(frozen=True)
class TokenCell:
    index: int
    """Position in its segment."""
    token_id: int
    text: str
    trained: bool
    """Loss mask 1."""
    logprob: float
    image: str | None = None
    """For an image's run of pads, shown as one cell: the image's data URI (the page shows it inline)."""


@dataclass(frozen=True)
class Block:
    kind: str
    """``prompt``, ``generated`` or ``observation`` (tool results and template tokens)."""
    title: str
    start: int
    end: int
    cells: list[TokenCell]
    finish_reason: str | None = None
    notes: list[str] = field(default_factory=list)
    """Tool calls made in a generated turn; tool results shown in an observation block."""
    weight_version: str | None = None
    """The weight version the server generated the turn with (a continued episode mixes versions)."""

    @property
    def mean_logprob(self) -> float | None:
        trained = [c.logprob for c in self.cells if c.trained]
        return sum(trained) / len(trained) if trained else None

    def low_confidence(self, threshold: float) -> int:
        return sum(c.trained and c.logprob < threshold for c in self.cells)

    def header(self) -> list[str]:
        """What both renderers title the block with: its title, its token range and, for a generated turn, its
        finish reason, weight version and mean logprob."""
        parts = [self.title, f"tokens {self.start}-{self.end - 1} ({self.end - self.start})"]
        if self.kind == "generated":
            if self.finish_reason:
                parts.append(f"finish {self.finish_reason}")
            if self.weight_version is not None:
                parts.append(f"version {self.weight_version}")
            if self.mean_logprob is not None:
                parts.append(f"mean logprob {self.mean_logprob:.2f}")
        return parts


@dataclass(frozen=True)
class SegmentView:
    number: int
    blocks: list[Block]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def about(self) -> str:
        """The segment's ``info`` as ``key value`` pairs (empty for an ordinary episode)."""
        return " · ".join(f"{key} {value}" for key, value in self.info.items() if value not in (None, ""))

    @property
    def tokens(self) -> int:
        return sum(b.end - b.start for b in self.blocks)

    @property
    def trained(self) -> int:
        return sum(c.trained for b in self.blocks for c in b.cells)


@dataclass(frozen=True)
class TrajectoryView:
    row: TrajectoryRow
    segments: list[SegmentView]

    @property
    def headline(self) -> str:
        row = self.row
        calls = row.record.tool_calls
        return (
            f"trajectory {row.key} · dataset {row.dataset} · reward {row.reward:g} · {row.status} "
            f"({row.termination}) · {row.record.turns} turns · {calls} tool call{'s' * (calls != 1)} · "
            f"{sum(s.tokens for s in self.segments)} tokens, {sum(s.trained for s in self.segments)} trained"
        )

    @property
    def verdict(self) -> list[str]:
        """The code reward's verdict of a ``reward.kind: code`` row, as lines: its summary, then why (the
        failing test's first lines, or why nothing ran) and the program's output; empty for other rows."""
        code = self.row.code
        if code is None:
            return []
        lines = [code.summary()]
        if code.detail:
            lines += ["why:", *("  " + line for line in code.detail.splitlines())]
        if len(code.failures) > 1:
            lines.append(
                f"{len(code.failures) - 1} more failing test(s): "
                + "; ".join(_cut(f) for f in code.failures[1:])
            )
        if code.program_output:
            lines += ["program output:", *("  " + line for line in code.program_output.splitlines())]
        return lines


def token_texts(tokenizer: Any, token_ids: Sequence[int]) -> list[str]:
    """The text of each token, special tokens kept; a character split over tokens goes to the first of them."""
    ids = list(token_ids)
    texts = list(
        tokenizer.batch_decode(
            [[t] for t in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
    )
    i = 0
    while i < len(ids):
        if _REPLACEMENT not in texts[i]:
            i += 1
            continue
        for j in range(i + 2, min(len(ids), i + _MAX_CHARACTER_TOKENS) + 1):
            joined = tokenizer.decode(ids[i:j], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            if _REPLACEMENT not in joined:
                texts[i:j] = [joined] + [""] * (j - i - 1)
                i = j
                break
        else:
            i += 1
    return texts


def build_view(row: TrajectoryRow, tokenizer: Any) -> TrajectoryView:
    """``row`` cut into blocks per segment, every token decoded, tool calls and results attached."""
    segments = []
    for number, segment in enumerate(row.segments, start=1):
        notes = _turn_notes(row.messages) if number == len(row.segments) else []
        blocks = _blocks(segment, token_texts(tokenizer, segment.token_ids), notes)
        segments.append(SegmentView(number, blocks, segment.info))
    return TrajectoryView(row, segments)


def _cells(segment: SavedSegment, texts: list[str], start: int, end: int) -> list[TokenCell]:
    """The cells of tokens ``start``..``end``, each image's run of pads one cell."""
    runs = {image.start: (number, image) for number, image in enumerate(segment.images, start=1)}
    cells: list[TokenCell] = []
    i = start
    while i < end:
        if i in runs:
            number, image = runs[i]
            name = f"[image {number}: {image.tokens} tokens]"
            cells.append(TokenCell(i, segment.token_ids[i], name, False, 0.0, image.data_uri))
            i += image.tokens
            continue
        cells.append(
            TokenCell(i, segment.token_ids[i], texts[i], segment.loss_mask[i] == 1, segment.logprobs[i])
        )
        i += 1
    return cells


def _blocks(segment: SavedSegment, texts: list[str], notes: list[tuple[list[str], list[str]]]) -> list[Block]:
    blocks = []
    turn = 0
    for span in segment.spans:
        cells = _cells(segment, texts, span.start, span.end)
        if span.kind == "generated":
            turn += 1
            calls = notes[turn - 1][0] if turn <= len(notes) else []
            blocks.append(
                Block(
                    "generated",
                    f"turn {turn}",
                    span.start,
                    span.end,
                    cells,
                    span.finish_reason,
                    calls,
                    span.weight_version,
                )
            )
        elif span.kind == "observation":
            results = notes[turn - 1][1] if 0 < turn <= len(notes) else []
            title = "tool results" if results else "template tokens"
            blocks.append(Block("observation", title, span.start, span.end, cells, notes=results))
        else:
            blocks.append(Block("prompt", "prompt", span.start, span.end, cells))
    return blocks


def _turn_notes(messages: Sequence[dict[str, Any]]) -> list[tuple[list[str], list[str]]]:
    """Per assistant message: its tool calls, and the results of the tool messages that follow it."""
    turns: list[tuple[list[str], list[str]]] = []
    names: dict[str, str] = {}
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            calls = []
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                names[str(call.get("id"))] = str(function.get("name"))
                arguments = function.get("arguments")
                shown = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
                calls.append(_cut(f"call {function.get('name')} {shown}"))
            turns.append((calls, []))
        elif role == "tool" and turns:
            name = names.get(str(message.get("tool_call_id")), "tool")
            turns[-1][1].append(_cut(f"{name} -> {message.get('content', '')}"))
    return turns


def _cut(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _NOTE_CHARS else flat[: _NOTE_CHARS - 3] + "..."
