"""How many weight versions old an episode's trained tokens are, and the bound on it (``strands.staleness``).

An episode slime aborts at a weight update and continues afterwards (``--partial-rollout``; the fully-async
rollout keeps episodes in flight across steps) holds tokens written by several policies. Each server answer
carries the ``weight_version`` it was generated with (one generated span of the trajectory, so one version per
span); an episode's *newest* version is the newest any of its answers came with. A version is the number slime
gives each weight update (``"1"``, ``"2"``, ... or zero-padded; SGLang's ``"default"`` before the first update is
0); a label that is no number cannot be ordered and is neither measured nor masked.

Measured (every training episode, saved on its record): the versions its *trained* tokens came from (earliest,
latest, how many distinct) and its staleness, newest seen minus earliest trained, in versions.

Bounded, per token (``max_versions: K``): a token whose version is more than K before the episode's newest is
not trained. ``on_exceed: mask`` gives it loss mask 0 (it stays in the context, its logprob as sampled); a
sample left with no trained token at all is removed from training (``remove_sample``) as slime removes its own,
so no sample without a trained token reaches the trainer. ``on_exceed: drop`` ends an episode whose tokens span
more than K versions FAILED (group-neutral, as every FAILED sample). K = 0 is the rule of slime's
``--mask-offpolicy-in-partial-rollout``; the two together must agree (``SlimeConfig`` refuses anything else).

:class:`TrainMask` is the one rule deciding which tokens of a generated span are trained: the sample writer
applies it, and :func:`bound_staleness` measures with it, so what is measured is what was written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..agent.record import EpisodeRecord, Termination
from ..provider.token_manager import Span, TokenManager
from ..settings import StalenessSettings

__all__ = ["TrainMask", "bound_staleness", "staleness_metrics", "version_number"]

_BEFORE_FIRST_UPDATE = "default"
"""SGLang's ``weight_version`` until a weight update names one."""


def version_number(label: str | None) -> int | None:
    """The number of a weight version label (``"3"``, ``"000003"``; SGLang's ``"default"`` is 0); None for a
    label that is not one (or no label: a server that does not report versions)."""
    if label is None:
        return None
    if label == _BEFORE_FIRST_UPDATE:
        return 0
    return int(label) if label.isascii() and label.isdecimal() else None


def span_version(span: Span) -> int | None:
    """The version number of a generated span (its server answer's ``weight_version``)."""
    return version_number(span.info.weight_version if span.info is not None else None)


@dataclass(frozen=True)
class TrainMask:
    """Which tokens of an episode's generated spans are trained."""

    before_continuation: bool = False
    """``--mask-offpolicy-in-partial-rollout``: tokens written before the episode's last continuation are not."""
    oldest_trained: int | None = None
    """The staleness bound's (mask): spans of a version older than this are not trained; None without one."""

    @classmethod
    def for_episode(
        cls, before_continuation: bool, max_versions: int | None, newest: str | None
    ) -> TrainMask:
        """The mask of an episode whose newest version is ``newest`` under a masking bound of ``max_versions``
        (None: no bound, or one that drops instead)."""
        number = version_number(newest)
        oldest = None if max_versions is None or number is None else number - max_versions
        return cls(before_continuation=before_continuation, oldest_trained=oldest)

    def stale(self, span: Span) -> bool:
        """Whether the bound takes the whole span out of the loss."""
        version = span_version(span)
        return self.oldest_trained is not None and version is not None and version < self.oldest_trained

    def masked(self, span: Span, carried: int) -> int:
        """How many of the span's first tokens get loss mask 0 (``carried``: the segment's tokens written before
        the last continuation)."""
        if self.stale(span):
            return len(span)
        if self.before_continuation:
            return max(0, min(len(span), carried - span.start))
        return 0


def _generated_spans(record: EpisodeRecord) -> Iterator[tuple[Span, int]]:
    """Every generated span of the episode's segments, with its segment's carried tokens."""
    parts: Sequence[tuple[TokenManager | None, int]] = [
        (s.trajectory, s.carried_tokens) for s in record.segments
    ]
    if not any(tm is not None for tm, _ in parts):
        parts = [(record.trajectory, record.segments[-1].carried_tokens if record.segments else 0)]
    for tm, carried in parts:
        if tm is None:
            continue
        for span in tm.spans[1:]:
            if span.kind == "generated" and len(span):
                yield span, carried


def bound_staleness(
    record: EpisodeRecord, bound: StalenessSettings, *, before_continuation: bool, training: bool
) -> EpisodeRecord:
    """``record`` with its versions measured (the trained tokens', under the mask the writer will apply) and,
    in training under ``on_exceed: drop``, FAILED when its tokens span more than ``max_versions`` versions."""
    spans = list(_generated_spans(record))
    numbered = [(v, span) for span, _ in spans if (v := span_version(span)) is not None]
    if not numbered:
        return record
    newest_number, newest_span = max(numbered, key=lambda pair: pair[0])
    assert newest_span.info is not None
    newest = newest_span.info.weight_version
    record = dataclasses.replace(record, version_newest=newest)
    if not training or not record.treatment.trains:
        return record
    mask = TrainMask.for_episode(before_continuation, bound.max_versions if bound.masks else None, newest)
    trained: dict[int, str] = {}
    stale_masked = 0
    for span, carried in spans:
        masked = mask.masked(span, carried)
        stale_masked += len(span) if mask.stale(span) else 0
        version = span_version(span)
        if masked < len(span) and version is not None and span.info is not None:
            trained.setdefault(version, str(span.info.weight_version))
    if not trained:
        return dataclasses.replace(record, stale_masked_tokens=stale_masked)
    earliest, latest = min(trained), max(trained)
    staleness = newest_number - earliest
    record = dataclasses.replace(
        record,
        version_earliest_trained=trained[earliest],
        version_latest_trained=trained[latest],
        versions_trained=len(trained),
        staleness=staleness,
        stale_masked_tokens=stale_masked,
    )
    if bound.drops and bound.max_versions is not None and staleness > bound.max_versions:
        return dataclasses.replace(
            record,
            termination=Termination.FAILED,
            stale_dropped=True,
            error=(
                f"staleness: its tokens span {staleness} weight versions ({trained[earliest]} to {newest}), more "
                f"than staleness.max_versions={bound.max_versions} (on_exceed: drop)"
            ),
        )
    return record


def staleness_metrics(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """The step's staleness (un-prefixed ``staleness/*`` keys): mean and max over the episodes with trained
    tokens of known versions, the share of them with tokens of more than one version, the tokens the bound
    masked and the episodes it dropped."""
    measured = [r.staleness for r in records if r.staleness is not None and not r.stale_dropped]
    out = {
        "staleness/masked_tokens": float(sum(r.stale_masked_tokens for r in records)),
        "staleness/dropped_episodes": float(sum(r.stale_dropped for r in records)),
    }
    if measured:
        multi = sum(
            r.versions_trained > 1 for r in records if r.staleness is not None and not r.stale_dropped
        )
        out["staleness/mean"] = sum(measured) / len(measured)
        out["staleness/max"] = float(max(measured))
        out["staleness/multi_version_frac"] = multi / len(measured)
    return out
