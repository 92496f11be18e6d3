"""The typed record of one agent episode, and the one table saying what each way of ending means.

:class:`EpisodeRecord` is what an episode produced (how it ended, its counters and, while in memory, its token
trajectory). The rollout writes it into ``sample.metadata["strands"]`` (plain JSON types: slime pickles
samples across Ray and saves them), and the reward and metrics functions read it back with
:meth:`EpisodeRecord.of` instead of picking a dict apart. :data:`TREATMENTS` is the single place that maps each
:class:`Termination` to slime's ``Sample.Status``, the reward handling and the metric it is counted under
(the layout follows slime's own ``slime/agent/trajectory.py``: frozen records, an enum for the kinds).

An episode is one or more trajectory segments (:class:`SegmentRecord`): the main agent's, split wherever
context management rewrote the history, and the collected sub-agents'. Each segment is its own slime sample;
``segments`` keeps their boundaries in every sibling's record, and ``segment`` says which one a sample holds.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import SlimeStrandsError
from ..settings import COMPACTION_STRATEGIES
from ..strict_reader import StrictReader

if TYPE_CHECKING:
    from ..provider.token_manager import TokenManager
    from .checkpoint import EpisodeCheckpoint

__all__ = [
    "METADATA_KEY",
    "TREATMENTS",
    "EpisodeRecord",
    "MalformedRecordError",
    "RewardRule",
    "SampleTreatment",
    "SegmentRecord",
    "Termination",
    "has_malformed_record",
]

METADATA_KEY = "strands"
"""The key of ``sample.metadata`` that holds :meth:`EpisodeRecord.to_metadata`."""


class MalformedRecordError(SlimeStrandsError, ValueError):
    """A saved episode or segment record that is not one (a writer bug, or metadata of another version)."""


class Termination(enum.Enum):
    """How an episode ended."""

    END_TURN = "end_turn"  # the model answered without calling a tool
    TOOL_LIMIT = "tool_limit"  # max_tool_iters / max_tool_calls stopped it before running more tools
    MAX_TOKENS = "max_tokens"  # a turn finished with `length` at its per-turn max_new_tokens
    RESPONSE_BUDGET = "response_budget"  # the whole-trajectory response budget left no room for a turn, or
    # cut a turn short (`length` at the tokens the budget left)
    CONTEXT_FULL = "context_full"  # the context window left no room (ours, or SGLang's 400), or cut a turn
    # short (`length` at the room the window left, or the server's silent clamp to its window)
    ABORTED = "abort"  # slime aborted the rollout (GenerateState.aborted): no reward, slime skips it
    FAILED = "failure"  # infrastructure failure: nothing to learn from


class RewardRule(enum.Enum):
    """Who sets ``sample.reward``."""

    SCORE = "score"  # left None: slime's reward function scores the response
    NONE = "none"  # stays None: slime skips scoring aborted samples
    ZERO = "zero"  # 0.0 (or {reward_key: 0.0}); the reward post-process leaves it out of its group


@dataclass(frozen=True)
class SampleTreatment:
    """What slime does with a sample whose episode ended one way (one :class:`Termination`): its status,
    who sets its reward, whether its loss is removed, the metric it is counted under."""

    status: str
    """Name of the ``Sample.Status`` member."""
    reward: RewardRule
    remove_sample: bool
    """slime zeroes the loss mask of a removed sample."""
    metric: str
    """Counted as ``<prefix>/termination/<metric>``."""

    @property
    def trains(self) -> bool:
        """Whether slime trains on the sample (so it must carry routing / top-p replay data)."""
        return self.status in ("COMPLETED", "TRUNCATED") and not self.remove_sample


TREATMENTS: dict[Termination, SampleTreatment] = {
    Termination.END_TURN: SampleTreatment("COMPLETED", RewardRule.SCORE, False, "end_turn"),
    Termination.TOOL_LIMIT: SampleTreatment("TRUNCATED", RewardRule.SCORE, False, "tool_limit"),
    Termination.MAX_TOKENS: SampleTreatment("TRUNCATED", RewardRule.SCORE, False, "max_tokens"),
    Termination.RESPONSE_BUDGET: SampleTreatment("TRUNCATED", RewardRule.SCORE, False, "response_budget"),
    Termination.CONTEXT_FULL: SampleTreatment("TRUNCATED", RewardRule.SCORE, False, "context_full"),
    Termination.ABORTED: SampleTreatment("ABORTED", RewardRule.NONE, False, "abort"),
    Termination.FAILED: SampleTreatment("FAILED", RewardRule.ZERO, True, "failure"),
}


_SEGMENT_KINDS = ("main", "subagent")
_OPENERS = ("prompt", "subagent", *COMPACTION_STRATEGIES)


@dataclass(frozen=True)
class SegmentRecord:
    """One trajectory segment of an episode: one slime sample, exact token-in/token-out on its own.

    The main agent's first segment starts from the sample's prompt; each compaction closes the current one
    (``closed_by="compaction"``) and opens the next from the re-rendered, compacted conversation (its prompt,
    masked). A collected sub-agent's trajectory is a segment of its own. Segments are listed in the order
    they closed; the main agent's last segment (the final answer) is last.
    """

    kind: str
    """``main`` or ``subagent``."""
    opened_by: str
    """``prompt`` (the episode's start), ``summarize`` / ``sliding_window`` (a compaction) or ``subagent``."""
    closed_by: str
    """``compaction``, or the :class:`Termination` value that ended this agent."""
    status: str
    """Name of the sample's ``Sample.Status``."""
    prompt_length: int
    """Tokens of the segment's prompt (the initial rendering, or the compacted conversation re-rendered)."""
    response_length: int
    generated_tokens: int
    turns: int
    """Generated turns in the segment (a summary turn included)."""
    tokens_saved: int = 0
    """For a segment opened by a compaction: tokens the previous main segment held when it closed minus this
    segment's prompt (what the rewrite removed; 0 otherwise)."""
    name: str = ""
    """The tool that ran a sub-agent segment."""
    final_turn_chars: int | None = None
    """Length of the segment's last generated turn at the end of its decoded response."""
    carried_tokens: int = 0
    """Tokens of the segment (its prompt included) written before the episode's last continuation (partial
    rollout): by an older policy. The whole segment for one closed before it; 0 when never continued."""
    trajectory: TokenManager | None = field(default=None, repr=False, compare=False)
    """The segment's token trajectory; not saved."""
    response: str = field(default="", repr=False, compare=False)
    """The segment's decoded response (special tokens kept); not saved."""

    def __post_init__(self) -> None:
        if self.kind not in _SEGMENT_KINDS:
            raise MalformedRecordError(f"segment kind must be one of {_SEGMENT_KINDS}, got {self.kind!r}")
        if self.opened_by not in _OPENERS:
            raise MalformedRecordError(f"segment opened_by must be one of {_OPENERS}, got {self.opened_by!r}")
        if self.closed_by != "compaction" and self.closed_by not in {t.value for t in Termination}:
            raise MalformedRecordError(
                f"segment closed_by must be 'compaction' or a termination, got {self.closed_by!r}"
            )

    @property
    def compacted(self) -> bool:
        """Whether the segment starts from a compacted history."""
        return self.opened_by in COMPACTION_STRATEGIES

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _NOT_SAVED}

    @classmethod
    def from_dict(cls, data: Any, where: str = "segment") -> SegmentRecord:
        """Read back :meth:`to_dict`; raises :class:`MalformedRecordError` on anything else."""
        d = StrictReader(data, where, MalformedRecordError)
        segment = cls(**d.scalars(cls, defaults=True, skip=_NOT_SAVED))
        d.done()
        return segment


@dataclass(frozen=True)
class EpisodeRecord:
    """One episode: how it ended, what it cost, and (in memory only) its trajectory.

    Frozen: whoever changes how an episode ended (a writer that finds its replay data broken, the rollout that
    adds its attempts and wall time) makes a new record with :func:`dataclasses.replace` and hands it on, so a
    record a caller holds never changes under it. ``parse_errors`` is a read-only mapping, ``segments`` and
    ``messages`` tuples, whatever was passed in.
    """

    termination: Termination
    evaluation: bool = False
    error: str | None = None
    """Why a FAILED episode failed (exception type and message)."""
    turns: int = 0
    """Model calls that reached the server (an aborted-and-retried request counts once), summary turns and
    collected sub-agents' calls included."""
    tool_iters: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    parse_errors: Mapping[str, int] = field(default_factory=lambda: types.MappingProxyType({}))
    tool_time_s: float = 0.0
    generation_time_s: float = 0.0
    client_overhead_s: float = 0.0
    wall_time_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    tool_outputs_truncated: int = 0
    response_tokens: int = 0
    """Tokens after the prompt in the episode's trajectory (generated + tool/template tokens), summed over its
    segments. ``prompt_tokens`` / ``cached_tokens`` (what the server prefilled / found cached) and
    ``tool_outputs_truncated`` count collected sub-agents too; the time counters are the main agent's (a
    sub-agent's time is in ``tool_time_s``)."""
    generated_tokens: int = 0
    final_turn_chars: int | None = None
    """Length of the last assistant turn at the end of ``response`` (rewards grade only that)."""
    regenerations: int = 0
    """Times this sample came back to ``generate`` after an unfinished attempt (partial rollout)."""
    continuations: int = 0
    """Times the episode continued where an abort had stopped it (partial rollout), instead of restarting."""
    turns_saved: int = 0
    """Generated turns the continuations carried over (not generated again), summed over them."""
    offpolicy_masked_tokens: int = 0
    """Generated tokens written before the last continuation that ``--mask-offpolicy-in-partial-rollout``
    took out of the loss (their loss mask 0)."""
    version_newest: str | None = None
    """The newest ``weight_version`` the episode's server answers came with (``slime_strands._slime.staleness``)."""
    version_earliest_trained: str | None = None
    """The oldest weight version of a token the episode trains on (None: nothing trained, or no versions)."""
    version_latest_trained: str | None = None
    versions_trained: int = 0
    """Distinct weight versions among the tokens the episode trains on."""
    staleness: int | None = None
    """Versions between the episode's oldest trained token and the newest version it saw."""
    stale_masked_tokens: int = 0
    """Generated tokens the staleness bound took out of the loss (``staleness.on_exceed: mask``)."""
    stale_dropped: bool = False
    """The staleness bound ended the episode FAILED (``staleness.on_exceed: drop``)."""
    rollout_thread: str | None = None
    """The name of the thread whose event loop called ``generate`` for this attempt: slime's ``async_utils``
    loop for its default rollout and for eval, ``fully-async-rollout`` for slime's fully-async worker (on rollout
    workers too: the driver's, where slime called it)."""
    segments: Sequence[SegmentRecord] = ()
    """The episode's trajectory segments, in sample order (empty when nothing was generated)."""
    segment: int | None = None
    """Which of ``segments`` this sample holds; None when the sample holds the whole episode (one segment)."""
    trajectory: TokenManager | None = field(default=None, repr=False, compare=False)
    """The token trajectory of the main agent's last segment (prompt, generated turns with the server's
    meta_info, observations): the whole trajectory when nothing was compacted; not saved."""
    response: str = field(default="", repr=False, compare=False)
    """The decoded response of that segment (special tokens kept); it becomes ``sample.response``, so it is not
    saved twice."""
    system_prompt: str | None = field(default=None, repr=False, compare=False)
    messages: Sequence[Mapping[str, Any]] = field(default=(), repr=False, compare=False)
    """The agent's conversation (Strands messages, system prompt apart): the agent's view for inspection,
    never the training data (the trajectory is); not saved."""
    checkpoint: EpisodeCheckpoint | None = field(default=None, repr=False, compare=False)
    """What an ABORTED episode needs to continue (``slime_strands.agent.resume``); saved apart from the record."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "parse_errors", types.MappingProxyType(dict(self.parse_errors)))
        object.__setattr__(self, "segments", tuple(self.segments))
        object.__setattr__(self, "messages", tuple(self.messages))

    @property
    def treatment(self) -> SampleTreatment:
        return TREATMENTS[self.termination]

    @property
    def compactions(self) -> int:
        """Times the history was rewritten (segments opened by a compaction)."""
        return sum(s.compacted for s in self.segments)

    @property
    def tokens_saved(self) -> int:
        """Tokens the compactions removed from the context, summed over them."""
        return sum(s.tokens_saved for s in self.segments)

    @property
    def subagents(self) -> int:
        """Collected sub-agent segments."""
        return sum(s.kind == "subagent" for s in self.segments)

    def carried_generated_tokens(self) -> int:
        """Generated tokens of the episode's segments written before its last continuation (in memory only:
        read from the segments' trajectories)."""
        return sum(
            sum(s.trajectory.loss_mask[: s.carried_tokens])
            for s in self.segments
            if s.trajectory is not None and s.carried_tokens
        )

    @property
    def closes_episode(self) -> bool:
        """Whether this sample holds the episode's last segment (or all of it): per-episode numbers (metrics)
        are read from it once, not from each sibling."""
        return self.segment is None or self.segment == len(self.segments) - 1

    def for_segment(self, index: int) -> EpisodeRecord:
        """The record of the sample that holds ``segments[index]`` (its own last-turn length)."""
        part = self.segments[index]
        return dataclasses.replace(
            self,
            segment=index,
            final_turn_chars=part.final_turn_chars,
            trajectory=part.trajectory,
            response=part.response,
        )

    def to_metadata(self) -> dict[str, Any]:
        """Plain JSON types for ``sample.metadata[METADATA_KEY]``."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in _NOT_SAVED:
                continue
            value = getattr(self, f.name)
            out[f.name] = value.value if isinstance(value, Termination) else value
        out["parse_errors"] = dict(self.parse_errors)
        out["segments"] = [s.to_dict() for s in self.segments]
        return out

    @classmethod
    def from_metadata(cls, data: Mapping[str, Any], *, unknown_keys: bool = False) -> EpisodeRecord:
        """Read back :meth:`to_metadata`; raises :class:`MalformedRecordError` on anything else. With
        ``unknown_keys`` a key this version does not know is ignored (a counter a later version added, in a
        file it wrote) instead of refused."""
        d = StrictReader(data, "episode record", MalformedRecordError)
        values = d.scalars(cls, defaults=True, skip=_NOT_SAVED)
        values["termination"] = d.choice("termination", Termination)
        if d.has("parse_errors"):
            values["parse_errors"] = d.counts("parse_errors")
        if d.has("segments"):
            values["segments"] = [
                SegmentRecord.from_dict(item, f"{d.where}.segments[{i}]")
                for i, item in enumerate(d.items("segments"))
            ]
        if not unknown_keys:
            d.done()
        record = cls(**values)
        if record.segment is not None and not 0 <= record.segment < len(record.segments):
            raise MalformedRecordError(
                f"segment {record.segment} is not one of the {len(record.segments)} segments"
            )
        return record

    @classmethod
    def of(cls, sample: Any) -> EpisodeRecord | None:
        """The record ``generate`` wrote on ``sample``; None for samples of other generate functions or with
        a malformed record (see :func:`has_malformed_record`)."""
        return cls.in_metadata(getattr(sample, "metadata", None))

    @classmethod
    def in_metadata(cls, metadata: Any) -> EpisodeRecord | None:
        """The record in a ``sample.metadata`` dict, or None (absent or malformed)."""
        if not isinstance(metadata, Mapping) or METADATA_KEY not in metadata:
            return None
        try:
            return cls.from_metadata(metadata[METADATA_KEY])
        except (MalformedRecordError, TypeError):
            return None


_NOT_SAVED = frozenset({"trajectory", "response", "system_prompt", "messages", "checkpoint"})


def has_malformed_record(sample: Any) -> bool:
    """True when ``sample.metadata`` has our key but it does not hold a record (a writer bug to report)."""
    metadata = getattr(sample, "metadata", None)
    return isinstance(metadata, Mapping) and METADATA_KEY in metadata and EpisodeRecord.of(sample) is None
