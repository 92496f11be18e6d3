"""The model's part of a partial-rollout checkpoint: its token trajectory and its state between turns, as
frozen plain-data records, and their (de)serialisation.

An aborted episode's checkpoint (``slime_strands.agent.checkpoint.EpisodeCheckpoint``) holds the model's
trajectories as :class:`TrajectoryCheckpoint` s and what it knows between turns as a :class:`ModelCheckpoint`
(a turn an abort cut mid-generation included: :class:`PendingTurn`); the model saves and restores them
(``SGLangModel.checkpoint_state`` / ``restore_state``). Only plain JSON values: token ids as base64 int32 and
logprobs as base64 float64 (exact, ~5 and ~11 bytes a token). Read back strictly (:func:`checkpoint_reader`):
anything else is a :class:`MalformedCheckpointError`, never a half-read checkpoint.
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
from .images import ImagePlacement, TrajectoryImage
from .model_stats import ModelStats, TurnCut
from .token_manager import SpanKind, TokenManager, TurnInfo, count_turns

__all__ = [
    "MalformedCheckpointError",
    "ModelCheckpoint",
    "PendingTurn",
    "TrajectoryCheckpoint",
    "check_plain",
    "checkpoint_reader",
    "model_data",
    "read_model",
    "read_stats",
    "read_trajectory",
    "stats_data",
    "trajectory_data",
]

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
    images: tuple[ImagePlacement, ...] = ()
    """A vision-language model's images, each at the start of its expanded run (each image once)."""

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
            images=tuple(tm.images),
        )

    def rebuild(self) -> TokenManager:
        """The trajectory, appended span by span through TokenManager's validating API."""
        ids, logprobs, turns = _unpack("i", self.token_ids), _unpack("d", self.logprobs), iter(self.turns)
        if sum(self.lengths) != len(ids):
            raise MalformedCheckpointError(f"{len(ids)} token ids for spans of {sum(self.lengths)}")
        tm, at, sampled = TokenManager(), 0, 0
        for kind, length in zip(self.kinds, self.lengths, strict=True):
            part = ids[at : at + length]
            images = [
                ImagePlacement(p.start - at, p.image) for p in self.images if at <= p.start < at + length
            ]
            try:
                if images and kind == "generated":
                    raise ValueError("an image in a generated span")
                if kind == "prompt":
                    tm.add_prompt(part, images)
                elif kind == "observation":
                    tm.add_observation(part, images)
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
        if len(tm.images) != len(self.images):
            raise MalformedCheckpointError("an image is outside the trajectory's spans")
        return tm

    @property
    def turn_count(self) -> int:
        return count_turns(self.kinds)


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


def trajectory_data(t: TrajectoryCheckpoint) -> dict[str, Any]:
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
        "images": [
            {
                "start": p.start,
                "tokens": p.image.tokens,
                "size": list(p.image.size),
                "data_uri": p.image.data_uri,
            }
            for p in t.images
        ],
    }


def stats_data(stats: ModelStats) -> dict[str, Any]:
    data = {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)}
    data["parse_errors"] = dict(stats.parse_errors)
    data["last_cut"] = None if stats.last_cut is None else stats.last_cut.value
    return data


def model_data(m: ModelCheckpoint) -> dict[str, Any]:
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
        "counters": stats_data(m.counters),
    }


# -- reading ---------------------------------------------------------------------------------------------


def checkpoint_reader(data: Any, where: str) -> StrictReader:
    """A strict reader of saved checkpoint data: anything else is a :class:`MalformedCheckpointError`."""
    return StrictReader(data, where, MalformedCheckpointError)


def read_trajectory(d: StrictReader) -> TrajectoryCheckpoint:
    kinds = d.items("kinds")
    if not all(k in _KINDS for k in kinds):
        raise MalformedCheckpointError(f"{d.where}.kinds: unknown kind in {kinds!r:.80}")
    lengths = d.items("lengths")
    if len(lengths) != len(kinds) or not all(is_int(n) and n > 0 for n in lengths):
        raise MalformedCheckpointError(f"{d.where}.lengths: one positive length per span expected")
    turns = []
    for i, item in enumerate(d.items("turns")):
        t = checkpoint_reader(item, f"{d.where}.turns[{i}]")
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
        images=_read_images(d),
    )
    d.done()
    return trajectory


def _read_images(d: StrictReader) -> tuple[ImagePlacement, ...]:
    """The trajectory's images (none in a checkpoint older writers saved)."""
    if not d.has("images"):
        return ()
    return tuple(
        _read_image(checkpoint_reader(item, f"{d.where}.images[{i}]"))
        for i, item in enumerate(d.items("images"))
    )


def _read_image(d: StrictReader) -> ImagePlacement:
    size = d.items("size")
    if len(size) != 2 or not all(is_int(n) and n > 0 for n in size):
        d.fail(f"{d.where}.size: (width, height) in pixels expected")
    placed = ImagePlacement(
        d.integer("start", negative=False),
        TrajectoryImage(d.text("data_uri"), d.integer("tokens", negative=False), (size[0], size[1])),
    )
    if placed.image.tokens < 1:
        d.fail(f"{d.where}.tokens: an image has at least one token")
    d.done()
    return placed


def read_stats(d: StrictReader) -> ModelStats:
    stats = ModelStats(
        **d.scalars(ModelStats, negative=False),
        parse_errors=Counter(d.counts("parse_errors")),
        last_cut=d.optional_choice("last_cut", TurnCut),
    )
    d.done()
    return stats


def read_model(d: StrictReader) -> ModelCheckpoint:
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
        counters=read_stats(d.sub("counters")),
    )
    d.done()
    return model


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
