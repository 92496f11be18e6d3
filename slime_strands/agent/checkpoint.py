"""The saved state of an aborted agent episode: frozen plain-data records and their (de)serialisation.

When slime aborts a rollout (``--partial-rollout``), an episode in flight stops and its sample goes back to
slime's buffer; at a later rollout step ``generate`` is called with it again and the episode continues where
it stopped (``slime_strands.agent.resume`` captures and restores it). An :class:`EpisodeCheckpoint` is everything
the continuation needs and nothing else: the Strands conversation (tool results included), every token
trajectory of the episode (the open one and the segments a compaction or a sub-agent closed) with the
server's per-turn answers (logprobs, top-p spans, routed-expert rows, weight versions), the model's state
between turns (a turn cut mid-generation included: the provider's part, ``provider/checkpoint.py``), the
tool-limit counters and the compaction state.

No tokenizer, model or agent object: :meth:`EpisodeCheckpoint.to_data` gives only ``str`` / ``int`` /
``float`` / ``bool`` / ``None`` / ``list`` / ``dict`` values (it survives JSON, pickling across a Ray hop and
slime's buffer), token ids as base64 int32 and logprobs as base64 float64 (exact, ~5 and ~11 bytes a token).
:meth:`EpisodeCheckpoint.from_data` reads it back strictly: anything else is a
:class:`~slime_strands.provider.checkpoint.MalformedCheckpointError`, never a half-read checkpoint.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..provider.checkpoint import (
    MalformedCheckpointError,
    ModelCheckpoint,
    TrajectoryCheckpoint,
    check_plain,
    checkpoint_reader,
    model_data,
    read_model,
    read_stats,
    read_trajectory,
    stats_data,
    trajectory_data,
)
from ..provider.model_stats import ModelStats
from ..strict_reader import StrictReader

__all__ = ["CHECKPOINT_VERSION", "EpisodeCheckpoint", "SegmentCheckpoint", "ToolCounters", "plain_message"]

CHECKPOINT_VERSION = 1
"""Bumped when the saved layout changes; a checkpoint of another version is not continued."""


@dataclass(frozen=True)
class SegmentCheckpoint:
    """A trajectory segment the episode had closed (a compaction, a collected sub-agent)."""

    kind: str
    opened_by: str
    closed_by: str
    status: str
    name: str
    trajectory: TrajectoryCheckpoint


@dataclass(frozen=True)
class ToolCounters:
    """The tool limiter's and the tool statistics' counters."""

    tool_iters: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_time_s: float = 0.0


@dataclass(frozen=True)
class EpisodeCheckpoint:
    """Everything an aborted episode needs to continue; see the module docstring."""

    system_prompt: str | None
    messages: tuple[Mapping[str, Any], ...]
    """The agent's conversation up to where the abort left it consistent (Strands messages, plain data)."""
    trajectory: TrajectoryCheckpoint
    """The main agent's open segment."""
    opened_by: str
    """How that segment was opened (``prompt`` or a compaction strategy)."""
    closed: tuple[SegmentCheckpoint, ...]
    model: ModelCheckpoint
    tools: ToolCounters
    subagents: tuple[ModelStats, ...] = ()
    """Counters of the collected sub-agents whose segments are in ``closed``."""
    compaction_pending: bool | None = None
    """A compaction the abort cut (its summary turn pending): its ``overflowed`` flag; None: none."""
    continuations: int = 0
    """Times the episode had been continued before this checkpoint was taken."""
    turns_saved: int = 0
    """Turns the earlier continuations did not generate again (summed over them)."""
    version: int = CHECKPOINT_VERSION

    @property
    def turns(self) -> int:
        """Generated turns the checkpoint carries (main and collected sub-agents, summaries included)."""
        return self.trajectory.turn_count + sum(s.trajectory.turn_count for s in self.closed)

    def to_data(self) -> dict[str, Any]:
        """Plain JSON types (see the module docstring)."""
        return {
            "version": self.version,
            "system_prompt": self.system_prompt,
            "messages": [plain_message(m) for m in self.messages],
            "trajectory": trajectory_data(self.trajectory),
            "opened_by": self.opened_by,
            "closed": [
                {
                    "kind": s.kind,
                    "opened_by": s.opened_by,
                    "closed_by": s.closed_by,
                    "status": s.status,
                    "name": s.name,
                    "trajectory": trajectory_data(s.trajectory),
                }
                for s in self.closed
            ],
            "model": model_data(self.model),
            "tools": dataclasses.asdict(self.tools),
            "subagents": [stats_data(c) for c in self.subagents],
            "compaction_pending": self.compaction_pending,
            "continuations": self.continuations,
            "turns_saved": self.turns_saved,
        }

    @classmethod
    def from_data(cls, data: Any) -> EpisodeCheckpoint:
        """Read back :meth:`to_data`; raises :class:`MalformedCheckpointError` on anything else."""
        d = checkpoint_reader(data, "checkpoint")
        version = d.integer("version", negative=False)
        if version != CHECKPOINT_VERSION:
            raise MalformedCheckpointError(
                f"checkpoint version {version}, this code reads {CHECKPOINT_VERSION}"
            )
        messages = d.items("messages")
        if not messages:  # an episode is aborted after its prompt is in the conversation: never before
            raise MalformedCheckpointError(
                "checkpoint: no messages (an episode goes on from its conversation)"
            )
        for i, message in enumerate(messages):
            _check_message(message, f"messages[{i}]")
        messages = [_image_bytes(m) for m in messages]
        tools = d.sub("tools")
        checkpoint = cls(
            system_prompt=d.optional_text("system_prompt"),
            messages=tuple(messages),
            trajectory=read_trajectory(d.sub("trajectory")),
            opened_by=d.text("opened_by"),
            closed=tuple(_read_segment(checkpoint_reader(s, "closed segment")) for s in d.items("closed")),
            model=read_model(d.sub("model")),
            tools=ToolCounters(**tools.scalars(ToolCounters, negative=False)),
            subagents=tuple(
                read_stats(checkpoint_reader(c, "subagent counters")) for c in d.items("subagents")
            ),
            compaction_pending=d.optional_flag("compaction_pending"),
            continuations=d.integer("continuations", negative=False),
            turns_saved=d.integer("turns_saved", negative=False),
        )
        tools.done()
        d.done()
        return checkpoint


# -- reading ---------------------------------------------------------------------------------------------


def _read_segment(d: StrictReader) -> SegmentCheckpoint:
    segment = SegmentCheckpoint(
        **d.scalars(SegmentCheckpoint), trajectory=read_trajectory(d.sub("trajectory"))
    )
    d.done()
    return segment


_BASE64 = "base64"
"""The key an image source's bytes are saved under, as base64 text (plain data survives every hop)."""


def _map_image_sources(message: Mapping[str, Any], convert: Any) -> dict[str, Any]:
    """``message`` with ``convert`` applied to the source of every image block (its own or a tool result's)."""

    def block(b: Mapping[str, Any]) -> Mapping[str, Any]:
        if "image" in b and isinstance(b["image"], Mapping):
            return {**b, "image": {**b["image"], "source": convert(b["image"].get("source") or {})}}
        if "toolResult" in b and isinstance(b["toolResult"], Mapping):
            result = b["toolResult"]
            return {**b, "toolResult": {**result, "content": [block(c) for c in result.get("content") or []]}}
        return b

    return {**message, "content": [block(b) for b in message.get("content") or []]}


def plain_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A Strands message as plain data: image bytes as base64 text."""

    def convert(source: Mapping[str, Any]) -> Mapping[str, Any]:
        data = source.get("bytes")
        if not isinstance(data, (bytes, bytearray)):
            return source
        return {_BASE64: base64.b64encode(data).decode("ascii")}

    return _map_image_sources(message, convert)


def _image_bytes(message: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`plain_message` read back: the images' bytes as Strands holds them."""

    def convert(source: Mapping[str, Any]) -> Mapping[str, Any]:
        if _BASE64 not in source:
            return source
        try:
            return {"bytes": base64.b64decode(str(source[_BASE64]), validate=True)}
        except ValueError as exc:
            raise MalformedCheckpointError(f"an image of the conversation is not base64: {exc}") from exc

    return _map_image_sources(message, convert)


def _check_message(message: Any, where: str) -> None:
    if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant"):
        raise MalformedCheckpointError(f"{where}: a Strands message with role user or assistant expected")
    if not isinstance(message.get("content"), list):
        raise MalformedCheckpointError(f"{where}: content must be a list of blocks")
    check_plain(message, where)
