"""TokenManager: the append-only token trajectory of one episode.

The trajectory is the training data: token ids exactly as the server saw and produced them, a loss mask
(1 only for model-generated tokens) and the sampling logprobs (0.0 for tokens the model did not sample).
Nothing here is ever re-tokenized or rewritten; appending costs O(new tokens).

The three per-token columns are ``array`` objects, not lists: 4 + 1 + 8 bytes a token instead of a pointer
and often an int object each, and invisible to the cyclic garbage collector (a list of 100k ints is walked
element by element by every full collection, for every live trajectory of the process).

A trajectory is cut into :class:`Span` s: runs of one provenance (the prompt, each generated turn, the template
tokens between turns). A vision-language model's trajectory also holds its images, each once, at the position of
its expanded run of pads (:class:`~slime_strands.provider.images.ImagePlacement`): the ids are the EXPANDED ones
(what the model sees and slime trains on), :meth:`TokenManager.wire_ids` the ones every request sends (each
run collapsed to its one pad). ("Segment" means something else in this package: a context window of an episode, one
slime sample; ``Segment`` / ``segments`` / ``last_segment`` are the older names of the spans, kept.)
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .images import ImagePlacement, TrajectoryImage

__all__ = ["Segment", "Span", "SpanKind", "TokenManager", "TurnInfo", "collapse_images", "count_turns"]

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
        self._images: list[ImagePlacement] = []

    # -- appends ------------------------------------------------------------------------------

    def add_prompt(self, token_ids: Sequence[int], images: Sequence[ImagePlacement] = ()) -> Span:
        """Append the initial prompt (expanded ids; ``images`` placed relative to its start); only allowed on an
        empty trajectory."""
        if self._spans:
            raise ValueError("the initial prompt can only be added to an empty trajectory")
        if not token_ids:
            raise ValueError("the initial prompt must not be empty")
        self._place(token_ids, images)
        return self._append("prompt", token_ids, None, None)

    def add_observation(self, token_ids: Sequence[int], images: Sequence[ImagePlacement] = ()) -> Span:
        """Append template tokens the model did not generate (tool results, user turns, generation prompt), with
        the images they show (placed relative to their start)."""
        if not self._spans:
            raise ValueError("add the initial prompt first")
        if not token_ids:
            raise ValueError("an observation must not be empty")
        self._place(token_ids, images)
        return self._append("observation", token_ids, None, None)

    def _place(self, token_ids: Sequence[int], images: Sequence[ImagePlacement]) -> None:
        base = len(self._token_ids)
        for placed in images:
            if placed.start < 0 or placed.end > len(token_ids):
                raise ValueError(
                    f"an image's run {placed.start}..{placed.end} is outside its {len(token_ids)} tokens"
                )
        self._images += [ImagePlacement(base + p.start, p.image) for p in images]

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
    def images(self) -> list[ImagePlacement]:
        """The trajectory's images in order, each at the start of its expanded run of pads."""
        return list(self._images)

    def images_before(self, end: int) -> list[TrajectoryImage]:
        """The images whose runs lie in the first ``end`` tokens (a sample cut there holds exactly these)."""
        return [p.image for p in self._images if p.end <= end]

    @property
    def wire_length(self) -> int:
        """Length of :meth:`wire_ids`."""
        return len(self._token_ids) - sum(p.image.tokens - 1 for p in self._images)

    def wire_ids(self) -> list[int]:
        """The ids a request sends: each image's expanded run collapsed to its one pad (SGLang expands it)."""
        ids = self._token_ids.tolist()
        return collapse_images(ids, self._images) if self._images else ids

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


def collapse_images(ids: Sequence[int], images: Sequence[ImagePlacement]) -> list[int]:
    """``ids`` with each placed image's run of pads collapsed to its first pad (the wire form)."""
    out: list[int] = []
    previous = 0
    for placed in images:
        out += ids[previous : placed.start + 1]
        previous = placed.end
    out += ids[previous:]
    return out


def count_turns(kinds: Iterable[SpanKind]) -> int:
    """Generated turns in a trajectory of spans of these kinds: runs of consecutive generated spans
    (a turn an abort cut and its continuation are two server answers, one turn)."""
    turns, previous = 0, None
    for kind in kinds:
        turns += kind == "generated" and previous != "generated"
        previous = kind
    return turns
