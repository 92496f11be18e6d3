"""TokenManager: the append-only token trajectory of one episode.

The trajectory is the training data: token ids exactly as the server saw and produced them, a loss mask
(1 only for model-generated tokens) and the sampling logprobs (0.0 for tokens the model did not sample).
Nothing here is ever re-tokenized or rewritten; appending costs O(new tokens).

The three per-token columns are ``array`` objects, not lists: 4 + 1 + 8 bytes a token instead of a pointer
and often an int object each, and invisible to the cyclic garbage collector (a list of 100k ints is walked
element by element by every full collection, for every live trajectory of the process).

A trajectory is cut into :class:`Span` s: runs of one provenance (the prompt, each generated turn, the template
tokens between turns). ("Segment" means something else in this package: a context window of an episode, one
slime sample; ``Segment`` / ``segments`` / ``last_segment`` are the older names of the spans, kept.)
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Segment", "Span", "SpanKind", "TokenManager", "TurnInfo", "count_turns"]

SpanKind = Literal["prompt", "generated", "observation"]


@dataclass(frozen=True)
class TurnInfo:
    """What the server said about one generated turn."""

    finish_reason: str
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    weight_version: str | None = None
    rid: str | None = None
    meta_info: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The server's ``meta_info`` for the turn (see ``GenerateResult.meta_info``): what slime's
    ``Sample.append_response_tokens`` aligns with the turn's tokens (top-p spans, routed experts, weight
    version, prefix-cache and speculative-decoding stats, finish reason)."""


@dataclass(frozen=True)
class Span:
    """A contiguous run of the trajectory with one provenance.

    ``prompt``: the initial rendering (system + tools + first messages); ``generated``: one server answer,
    byte-for-byte its ``output_ids``; ``observation``: template-rendered tool results / user messages
    appended between turns (and generation prompts).
    """

    kind: SpanKind
    start: int
    token_ids: tuple[int, ...]
    info: TurnInfo | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)


Segment = Span
"""The older name of :class:`Span` (``slime_strands.Segment``)."""


class TokenManager:
    """Append-only trajectory: ``token_ids``, ``loss_mask``, ``logprobs`` and provenance ``spans``.

    ``spans[0]`` is the initial prompt; everything after it is the response in slime's sense.
    Logprobs of non-generated tokens are 0.0 (what slime expects for masked positions).
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget the trajectory (start a new episode)."""
        self._token_ids = array("i")  # token ids fit in a C int (SGLang sends them as int32)
        self._loss_mask = array("b")
        self._logprobs = array("d")  # Python floats are C doubles: exact
        self._spans: list[Span] = []

    # -- appends ------------------------------------------------------------------------------

    def add_prompt(self, token_ids: Sequence[int]) -> Span:
        """Append the initial prompt; only allowed on an empty trajectory."""
        if self._spans:
            raise ValueError("the initial prompt can only be added to an empty trajectory")
        if not token_ids:
            raise ValueError("the initial prompt must not be empty")
        return self._append("prompt", token_ids, None, None)

    def add_observation(self, token_ids: Sequence[int]) -> Span:
        """Append template tokens the model did not generate (tool results, user turns, generation prompt)."""
        if not self._spans:
            raise ValueError("add the initial prompt first")
        if not token_ids:
            raise ValueError("an observation must not be empty")
        return self._append("observation", token_ids, None, None)

    def add_generation(self, token_ids: Sequence[int], logprobs: Sequence[float], info: TurnInfo) -> Span:
        """Append one server answer: its ``output_ids`` and their sampling logprobs (trained on)."""
        if not self._spans:
            raise ValueError("add the initial prompt first")
        if len(token_ids) != len(logprobs):
            raise ValueError(f"{len(token_ids)} tokens but {len(logprobs)} logprobs")
        return self._append("generated", token_ids, logprobs, info)

    def _append(
        self,
        kind: SpanKind,
        token_ids: Sequence[int],
        logprobs: Sequence[float] | None,
        info: TurnInfo | None,
    ) -> Span:
        ids = tuple(map(int, token_ids))  # map in C: a 250k-token tool output is appended on the event loop
        packed = array("i", ids)  # an id that is not a C int raises here, before anything is appended
        sampled = None if logprobs is None else array("d", map(float, logprobs))
        span = Span(kind=kind, start=len(self._token_ids), token_ids=ids, info=info)
        self._token_ids.extend(packed)
        if sampled is None:
            self._loss_mask.frombytes(bytes(len(ids)))
            self._logprobs.frombytes(bytes(self._logprobs.itemsize * len(ids)))  # 0.0 is all zero bytes
        else:
            self._loss_mask.frombytes(b"\x01" * len(ids))
            self._logprobs.extend(sampled)
        self._spans.append(span)
        return span

    # -- views (copies: callers cannot corrupt the record) -------------------------------------

    @property
    def token_ids(self) -> list[int]:
        return self._token_ids.tolist()

    @property
    def loss_mask(self) -> list[int]:
        return self._loss_mask.tolist()

    @property
    def logprobs(self) -> list[float]:
        return self._logprobs.tolist()

    @property
    def spans(self) -> list[Span]:
        return list(self._spans)

    @property
    def segments(self) -> list[Span]:
        """The older name of :attr:`spans`."""
        return self.spans

    def __len__(self) -> int:
        return len(self._token_ids)

    @property
    def prompt_length(self) -> int:
        """Tokens of the initial prompt (``spans[0]``); 0 before the first turn."""
        return len(self._spans[0]) if self._spans else 0

    @property
    def response_length(self) -> int:
        """Tokens after the initial prompt: generated and observation tokens alike."""
        return len(self._token_ids) - self.prompt_length

    @property
    def generated_length(self) -> int:
        """Tokens the model sampled (the ones with loss_mask 1)."""
        return sum(len(s) for s in self._spans if s.kind == "generated")

    @property
    def turns(self) -> list[TurnInfo]:
        """Server info of every generated turn, in order."""
        return [s.info for s in self._spans if s.kind == "generated" and s.info is not None]

    @property
    def turn_count(self) -> int:
        """Generated turns (see :func:`count_turns`)."""
        return count_turns(s.kind for s in self._spans)

    @property
    def last_span(self) -> Span | None:
        return self._spans[-1] if self._spans else None

    @property
    def last_segment(self) -> Span | None:
        """The older name of :attr:`last_span`."""
        return self.last_span


def count_turns(kinds: Iterable[SpanKind]) -> int:
    """Generated turns in a trajectory of spans of these kinds: runs of consecutive generated spans
    (a turn an abort cut and its continuation are two server answers, one turn)."""
    turns, previous = 0, None
    for kind in kinds:
        turns += kind == "generated" and previous != "generated"
        previous = kind
    return turns
