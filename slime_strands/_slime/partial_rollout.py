"""slime's partial rollout, on slime's side: where an aborted episode's checkpoint lives on its Sample, the
off-policy flag, and the shape a fanned-out episode takes in slime's groups.

    --partial-rollout [--mask-offpolicy-in-partial-rollout] [--over-sampling-batch-size N]

With ``--partial-rollout`` slime aborts the episodes still running once a step has enough samples and puts
their groups back in its buffer; the next step hands them to ``generate`` again (status ABORTED). An episode
the abort stopped leaves an :class:`~slime_strands.agent.checkpoint.EpisodeCheckpoint` in
``sample.metadata["strands_checkpoint"]`` (plain data: it survives the buffer and a Ray hop) and continues
from it, token for token, instead of starting again from the prompt (``resume_aborted: false`` restarts it,
and then, as in evaluation, no checkpoint is captured at all: ``SlimeConfig.continues_aborted``). The checkpoint is
removed from the sample once its next record is written (a cancelled continuation keeps it).

With ``--mask-offpolicy-in-partial-rollout``, as slime does for its own samples, every token an older policy
wrote before the last continuation gets loss mask 0 (their logprobs and top-p spans stay as sampled); without
it they are trained like the rest. ``sample.weight_versions`` has one entry per server answer, so the policy
change at the seam is visible.

slime's ``abort()`` reads ``.response`` and ``.metadata`` of every member of an aborted group, and re-entry
reads ``.status``, ``.response_length``, ``.reward`` and ``.session_id`` and sets ``.loss_mask``: a finished
fanned-out episode in such a group is :class:`EpisodeSamples`, a ``list[Sample]`` that answers those as its
last sample does; an aborted one is its one Sample. One that ended FAILED comes back to ``generate`` as that
list (:func:`original_sample`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..agent.checkpoint import EpisodeCheckpoint
from ..agent.record import EpisodeRecord, Termination
from ..provider.checkpoint import MalformedCheckpointError

__all__ = [
    "CHECKPOINT_KEY",
    "EpisodeSamples",
    "kept_on_cancel",
    "original_sample",
    "save_checkpoint",
    "take_checkpoint",
]

logger = logging.getLogger(__name__)

CHECKPOINT_KEY = "strands_checkpoint"
"""The key of ``sample.metadata`` that holds an aborted episode's :meth:`EpisodeCheckpoint.to_data`."""


def original_sample(sample: Any) -> Any:
    """The Sample slime gave ``generate`` for this episode. slime's ``abort()`` puts a whole group back in its
    buffer, a fanned-out episode that had ended (FAILED included) as its :class:`EpisodeSamples`; re-entry then
    hands that list to ``generate``: its last member is the original Sample (the others are copies of it), and
    the episode goes on from it as a recycled Sample of that status would."""
    while isinstance(sample, list) and sample:
        sample = sample[-1]
    return sample


def take_checkpoint(sample: Any) -> EpisodeCheckpoint | None:
    """The checkpoint of the episode a recycled sample (status ABORTED) stopped in, taken off the sample;
    None for any other sample, and (with a warning) for one that does not read back."""
    metadata = getattr(sample, "metadata", None)
    if not isinstance(metadata, dict) or CHECKPOINT_KEY not in metadata:
        return None
    data = metadata.pop(CHECKPOINT_KEY)
    status = getattr(getattr(sample, "status", None), "name", None)
    if status != "ABORTED":
        return None
    try:
        return EpisodeCheckpoint.from_data(data)
    except MalformedCheckpointError as exc:
        logger.warning(
            "slime-strands: sample %s carries an unreadable checkpoint (%s): it starts again",
            getattr(sample, "index", "?"),
            exc,
        )
        return None


@contextmanager
def kept_on_cancel(sample: Any) -> Iterator[None]:
    """Around ``generate``: a sample handed in ABORTED with a checkpoint that is cancelled before its new
    record is written is left ABORTED with that checkpoint (``generate`` takes it off and resets the sample
    first), so that a later step still continues its episode."""
    metadata = getattr(sample, "metadata", None)
    status = getattr(sample, "status", None)
    data = metadata.get(CHECKPOINT_KEY) if isinstance(metadata, dict) else None
    try:
        yield
    except asyncio.CancelledError:
        if data is not None and getattr(status, "name", None) == "ABORTED":
            sample.status = status
            sample.metadata[CHECKPOINT_KEY] = data
        raise


def save_checkpoint(sample: Any, record: EpisodeRecord) -> None:
    """Leave the checkpoint of an episode slime aborted on its (ABORTED) sample (a record has one only when
    ``SlimeConfig.continues_aborted`` held)."""
    status = getattr(getattr(sample, "status", None), "name", None)
    aborted = record.termination is Termination.ABORTED and status == "ABORTED"
    if aborted and record.checkpoint is not None:
        sample.metadata[CHECKPOINT_KEY] = record.checkpoint.to_data()


class EpisodeSamples(list[Any]):
    """The samples of one fanned-out episode (one per trajectory segment, the episode's last segment last).

    A plain ``list[Sample]`` to slime's batching; to the code that reads a group member as one Sample
    (``abort()``: ``response``, ``metadata``; re-entry: ``status``, ``response_length``, ``reward``,
    ``session_id``) it answers as its last sample, which holds the final answer. Setting ``session_id`` sets
    every member's (one episode, one session); setting ``loss_mask`` to zeros (slime masking an older policy's
    tokens) zeroes every member's."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or not len(self):
            raise AttributeError(name)
        return getattr(self[-1], name)

    @property
    def session_id(self) -> Any:
        return self[-1].session_id if self else None

    @session_id.setter
    def session_id(self, value: Any) -> None:
        for sample in self:
            sample.session_id = value

    @property
    def loss_mask(self) -> Any:
        return self[-1].loss_mask if self else None

    @loss_mask.setter
    def loss_mask(self, value: Any) -> None:
        if value is not None and not any(value):
            for sample in self:
                sample.loss_mask = [0] * int(sample.response_length)
        elif self:
            self[-1].loss_mask = value
