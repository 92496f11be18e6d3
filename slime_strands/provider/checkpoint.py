"""The saved state of an aborted agent episode: frozen plain-data records and their (de)serialisation.

When slime aborts a rollout (``--partial-rollout``), an episode in flight stops and its sample goes back to
slime's buffer; at a later rollout step ``generate`` is called with it again and the episode continues where
it stopped (``slime_strands.agent.resume`` captures and restores it). An :class:`EpisodeCheckpoint` is everything
the continuation needs and nothing else: the Strands conversation (tool results included), every token
trajectory of the episode (the open one and the segments a compaction or a sub-agent closed) with the
server's per-turn answers (logprobs, top-p spans, routed-expert rows, weight versions), the model's state
between turns (a turn cut mid-generation included), the tool-limit counters and the compaction state.

No tokenizer, model or agent object: :meth:`EpisodeCheckpoint.to_data` gives only ``str`` / ``int`` /
``float`` / ``bool`` / ``None`` / ``list`` / ``dict`` values (it survives JSON, pickling across a Ray hop and
slime's buffer), token ids as base64 int32 and logprobs as base64 float64 (exact, ~5 and ~11 bytes a token).
:meth:`EpisodeCheckpoint.from_data` reads it back strictly: anything else is a
:class:`MalformedCheckpointError`, never a half-read checkpoint.
"""

from __future__ import annotations

import base64
import dataclasses
import sys
from array import array
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import SlimeStrandsError
from ..strict_reader import StrictReader, is_int
from .model_stats import ModelStats, TurnCut
from .token_manager import SpanKind, TokenManager, TurnInfo, count_turns

__all__ = [
    "CHECKPOINT_VERSION",
    "EpisodeCheckpoint",
    "MalformedCheckpointError",
    "ModelCheckpoint",
    "PendingTurn",
    "SegmentCheckpoint",
    "ToolCounters",
    "TrajectoryCheckpoint",
    "check_plain",
]

CHECKPOINT_VERSION = 1
"""Bumped when the saved layout changes; a checkpoint of another version is not continued."""
_KINDS: tuple[SpanKind, ...] = ("prompt", "observation", "generated")
_LITTLE = sys.byteorder == "little"


class MalformedCheckpointError(SlimeStrandsError, ValueError):
    """Saved data that is not an episode checkpoint of this version (the episode then starts again)."""


# -- records -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrajectoryCheckpoint:
    """One token trajectory (a :class:`~slime_strands.provider.token_manager.TokenManager`), exactly."""

    kinds: tuple[SpanKind, ...]
    lengths: tuple[int, ...]
    token_ids: str
    """Every token, base64 of little-endian int32."""
    logprobs: str
    """The generated tokens' logprobs in order, base64 of little-endian float64."""
    turns: tuple[TurnInfo, ...]
    """The server's info of each generated span, in order (meta_info included)."""

    @classmethod
    def of(cls, tm: TokenManager) -> TrajectoryCheckpoint:
        spans = tm.spans
        logprobs = tm.logprobs
        sampled = [lp for s in spans if s.kind == "generated" for lp in logprobs[s.start : s.end]]
        return cls(
            kinds=tuple(s.kind for s in spans),
            lengths=tuple(len(s) for s in spans),
            token_ids=_pack("i", tm.token_ids),
            logprobs=_pack("d", sampled),
            turns=tuple(s.info or TurnInfo("stop") for s in spans if s.kind == "generated"),
        )

    def rebuild(self) -> TokenManager:
        """The trajectory, appended span by span through TokenManager's validating API."""
        ids, logprobs, turns = _unpack("i", self.token_ids), _unpack("d", self.logprobs), iter(self.turns)
        if sum(self.lengths) != len(ids):
            raise MalformedCheckpointError(f"{len(ids)} token ids for spans of {sum(self.lengths)}")
        tm, at, sampled = TokenManager(), 0, 0
        for kind, length in zip(self.kinds, self.lengths, strict=True):
            part = ids[at : at + length]
            try:
                if kind == "prompt":
                    tm.add_prompt(part)
                elif kind == "observation":
                    tm.add_observation(part)
                else:
                    turn = next(turns, None)
                    if turn is None:
                        raise MalformedCheckpointError("the turns do not match the generated spans")
                    tm.add_generation(part, logprobs[sampled : sampled + length], turn)
                    sampled += length
            except ValueError as exc:
                raise MalformedCheckpointError(f"span {kind} at {at} does not rebuild: {exc}") from exc
            at += length
        if sampled != len(logprobs) or next(turns, None) is not None:
            raise MalformedCheckpointError("the logprobs or turns do not match the generated spans")
        return tm

    @property
    def turn_count(self) -> int:
        return count_turns(self.kinds)


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
class PendingTurn:
    """A model call the abort cut after its input was appended to the trajectory: the next call continues it."""

    messages: int
    """Messages the call had rendered (the continuation is the call made with that many messages)."""
    starts_in_reasoning: bool
    """Whether the turn's generation prompt opened a reasoning block (how its output is parsed)."""
    max_new_tokens: int
    """The turn's ``max_new_tokens`` as it was sent: its continuation asks for what the cut left of it."""
    bound: TurnCut
    """How the turn ends the episode if it finishes ``length`` (the bound that set ``max_new_tokens``)."""


@dataclass(frozen=True)
class ModelCheckpoint:
    """What an ``SGLangModel`` knows between turns besides its trajectory."""

    messages_seen: int
    pending: PendingTurn | None
    last_tool_ids: tuple[str, ...]
    call_errors: Mapping[str, tuple[str, str, str, str | None]]
    """``toolUseId`` -> (kind, message, raw, name) of a malformed call whose error result is still due."""
    template_ids: Mapping[str, str]
    counters: ModelStats
    """The model's counters (a copy)."""


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
            "messages": [dict(m) for m in self.messages],
            "trajectory": _trajectory_data(self.trajectory),
            "opened_by": self.opened_by,
            "closed": [
                {
                    "kind": s.kind,
                    "opened_by": s.opened_by,
                    "closed_by": s.closed_by,
                    "status": s.status,
                    "name": s.name,
                    "trajectory": _trajectory_data(s.trajectory),
                }
                for s in self.closed
            ],
            "model": _model_data(self.model),
            "tools": {
                "tool_iters": self.tools.tool_iters,
                "tool_calls": self.tools.tool_calls,
                "tool_errors": self.tools.tool_errors,
                "tool_time_s": self.tools.tool_time_s,
            },
            "subagents": [_counters_data(c) for c in self.subagents],
            "compaction_pending": self.compaction_pending,
            "continuations": self.continuations,
            "turns_saved": self.turns_saved,
        }

    @classmethod
    def from_data(cls, data: Any) -> EpisodeCheckpoint:
        """Read back :meth:`to_data`; raises :class:`MalformedCheckpointError` on anything else."""
        d = _reader(data, "checkpoint")
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
        tools = d.sub("tools")
        checkpoint = cls(
            system_prompt=d.optional_text("system_prompt"),
            messages=tuple(messages),
            trajectory=_read_trajectory(d.sub("trajectory")),
            opened_by=d.text("opened_by"),
            closed=tuple(_read_segment(_reader(s, "closed segment")) for s in d.items("closed")),
            model=_read_model(d.sub("model")),
            tools=ToolCounters(**tools.scalars(ToolCounters, negative=False)),
            subagents=tuple(_read_counters(_reader(c, "subagent counters")) for c in d.items("subagents")),
            compaction_pending=d.optional_flag("compaction_pending"),
            continuations=d.integer("continuations", negative=False),
            turns_saved=d.integer("turns_saved", negative=False),
        )
        tools.done()
        d.done()
        return checkpoint


# -- writing ---------------------------------------------------------------------------------------------


def _pack(typecode: str, values: Sequence[int] | Sequence[float]) -> str:
    packed = array(typecode, values)
    if not _LITTLE:
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def _unpack(typecode: str, text: str) -> list[Any]:
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
        values = array(typecode)
        values.frombytes(raw)
    except (ValueError, UnicodeEncodeError) as exc:  # binascii.Error is a ValueError
        raise MalformedCheckpointError(f"not base64 {typecode!r} values: {exc}") from exc
    if not _LITTLE:
        values.byteswap()
    return values.tolist()


def _trajectory_data(t: TrajectoryCheckpoint) -> dict[str, Any]:
    return {
        "kinds": list(t.kinds),
        "lengths": list(t.lengths),
        "token_ids": t.token_ids,
        "logprobs": t.logprobs,
        "turns": [
            {
                "finish_reason": info.finish_reason,
                "prompt_tokens": info.prompt_tokens,
                "cached_tokens": info.cached_tokens,
                "weight_version": info.weight_version,
                "rid": info.rid,
                "meta_info": dict(info.meta_info),
            }
            for info in t.turns
        ],
    }


def _counters_data(stats: ModelStats) -> dict[str, Any]:
    data = {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)}
    data["parse_errors"] = dict(stats.parse_errors)
    data["last_cut"] = None if stats.last_cut is None else stats.last_cut.value
    return data


def _model_data(m: ModelCheckpoint) -> dict[str, Any]:
    pending = m.pending
    return {
        "messages_seen": m.messages_seen,
        "pending": None
        if pending is None
        else {
            "messages": pending.messages,
            "starts_in_reasoning": pending.starts_in_reasoning,
            "max_new_tokens": pending.max_new_tokens,
            "bound": pending.bound.value,
        },
        "last_tool_ids": list(m.last_tool_ids),
        "call_errors": {k: list(v) for k, v in m.call_errors.items()},
        "template_ids": dict(m.template_ids),
        "counters": _counters_data(m.counters),
    }


# -- reading ---------------------------------------------------------------------------------------------


def _reader(data: Any, where: str) -> StrictReader:
    return StrictReader(data, where, MalformedCheckpointError)


def _read_trajectory(d: StrictReader) -> TrajectoryCheckpoint:
    kinds = d.items("kinds")
    if not all(k in _KINDS for k in kinds):
        raise MalformedCheckpointError(f"{d.where}.kinds: unknown kind in {kinds!r:.80}")
    lengths = d.items("lengths")
    if len(lengths) != len(kinds) or not all(is_int(n) and n > 0 for n in lengths):
        raise MalformedCheckpointError(f"{d.where}.lengths: one positive length per span expected")
    turns = []
    for i, item in enumerate(d.items("turns")):
        t = _reader(item, f"{d.where}.turns[{i}]")
        meta_info = t.mapping("meta_info")
        check_plain(meta_info, f"{t.where}.meta_info")
        turns.append(TurnInfo(**t.scalars(TurnInfo, negative=False), meta_info=meta_info))
        t.done()
    trajectory = TrajectoryCheckpoint(
        kinds=tuple(kinds),
        lengths=tuple(lengths),
        token_ids=d.text("token_ids"),
        logprobs=d.text("logprobs"),
        turns=tuple(turns),
    )
    d.done()
    return trajectory


def _read_segment(d: StrictReader) -> SegmentCheckpoint:
    segment = SegmentCheckpoint(
        kind=d.text("kind"),
        opened_by=d.text("opened_by"),
        closed_by=d.text("closed_by"),
        status=d.text("status"),
        name=d.text("name"),
        trajectory=_read_trajectory(d.sub("trajectory")),
    )
    d.done()
    return segment


def _read_counters(d: StrictReader) -> ModelStats:
    stats = ModelStats(
        **d.scalars(ModelStats, negative=False),
        parse_errors=Counter(d.counts("parse_errors")),
        last_cut=d.optional_choice("last_cut", TurnCut),
    )
    d.done()
    return stats


def _read_model(d: StrictReader) -> ModelCheckpoint:
    pending = None
    if d.get("pending") is not None:
        p = d.sub("pending")
        pending = PendingTurn(**p.scalars(PendingTurn, negative=False), bound=p.choice("bound", TurnCut))
        p.done()
    call_errors: dict[str, tuple[str, str, str, str | None]] = {}
    for key, value in d.mapping("call_errors").items():
        if (
            not isinstance(value, (list, tuple))
            or len(value) != 4
            or not all(isinstance(v, str) for v in value[:3])
        ):
            raise MalformedCheckpointError(
                f"{d.where}.call_errors[{key!r}]: (kind, message, raw, name) expected"
            )
        if value[3] is not None and not isinstance(value[3], str):
            raise MalformedCheckpointError(f"{d.where}.call_errors[{key!r}]: name must be a string or null")
        call_errors[key] = (value[0], value[1], value[2], value[3])
    template_ids = d.mapping("template_ids")
    check_plain(template_ids, f"{d.where}.template_ids")
    if not all(isinstance(v, str) for v in template_ids.values()):
        raise MalformedCheckpointError(f"{d.where}.template_ids: call ids must be strings")
    last_tool_ids = d.items("last_tool_ids")
    if not all(isinstance(v, str) for v in last_tool_ids):
        raise MalformedCheckpointError(f"{d.where}.last_tool_ids: tool use ids must be strings")
    model = ModelCheckpoint(
        messages_seen=d.integer("messages_seen"),
        pending=pending,
        last_tool_ids=tuple(last_tool_ids),
        call_errors=call_errors,
        template_ids=template_ids,
        counters=_read_counters(d.sub("counters")),
    )
    d.done()
    return model


def _check_message(message: Any, where: str) -> None:
    if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant"):
        raise MalformedCheckpointError(f"{where}: a Strands message with role user or assistant expected")
    if not isinstance(message.get("content"), list):
        raise MalformedCheckpointError(f"{where}: content must be a list of blocks")
    check_plain(message, where)


_PLAIN_SCALARS = (str, int, float, bool, type(None))


def check_plain(value: Any, where: str) -> None:
    """Only JSON types (str-keyed dicts, lists, scalars): what survives every hop a sample makes."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            if not all(isinstance(k, str) for k in item):
                raise MalformedCheckpointError(f"{where}: a mapping with a non-string key")
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif not isinstance(item, _PLAIN_SCALARS):
            raise MalformedCheckpointError(f"{where}: {type(item).__name__} is not plain data")
