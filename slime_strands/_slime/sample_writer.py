"""Episode record -> slime ``Sample``: the fields slime's trainer reads, aligned the way slime aligns them.

Each turn is recorded with exactly the semantics of slime's ``Sample.append_response_tokens`` (slime main,
``slime/utils/types.py``): a model turn is trainable with its logprobs and its server ``meta_info`` (ragged
top-p replay spans, routed-expert rows appended after ``routed_experts_start_len``, the weight version, prefix
cache and speculative-decoding stats); tool and template tokens are not trainable (loss mask 0, logprob 0.0,
empty top-p spans). This module re-implements that in plain Python + numpy (slime's needs torch, and older
slime lacks it); the tests compare the two on the same turns.

slime converts every sample of a batch the same way, so a sample it trains on must carry the replay data the
run asked for, and a FAILED sample must carry it too (masked): one FAILED sample must never crash a step.
Replay data that is missing or does not line up makes the sample FAILED, loudly, instead of crashing.

A vision-language model's sample carries the images its tokens show, as slime's own VLM rollout fills them
(``slime/rollout/sglang_rollout.py``, ``examples/geo3k_vlm_multi_turn``): ``multimodal_inputs = {"images":
[PIL...], "videos": None}`` and ``multimodal_train_inputs`` (the image processor's ``pixel_values`` and
``image_grid_thw``, which slime's trainer concatenates per micro-batch and feeds the model's ``forward``
alongside the tokens: the k-th grid must be the k-th run of pads in ``tokens``). Each sample gets exactly the
images whose runs are in ITS tokens: a segment its own, a FAILED sample those of the prompt it keeps.

An episode of several trajectory segments (compaction, collected sub-agents) becomes one sample per segment
(:func:`write_samples`), each written exactly like a whole episode from its own trajectory: its own prompt,
tokens, loss mask, logprobs, status, top-p spans and routed experts. Bad replay data in any segment makes
the whole episode one FAILED sample.

The episode record is frozen: a writer that turns an episode FAILED returns the new record (the one it saved
in ``sample.metadata``) instead of changing the caller's, and the caller goes on with what it got back.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..agent.record import METADATA_KEY, EpisodeRecord, RewardRule, Termination
from ..errors import SlimeStrandsError
from ..provider.images import TrajectoryImage, Vision
from ..provider.token_manager import TokenManager
from ..strict_reader import is_int
from .staleness import TrainMask

__all__ = [
    "ReplayError",
    "SampleContract",
    "Written",
    "reset_for_generation",
    "write_sample",
    "write_samples",
]

logger = logging.getLogger(__name__)

_NO_MASK = TrainMask()
"""Every generated token trained."""

_TOP_P_IDS = ("top_p_token_ids", "top_p_kept_token_ids")  # current and older SGLang patch names
_TOP_P_OFFSETS = ("top_p_token_offsets", "top_p_kept_token_offsets")


class ReplayError(SlimeStrandsError):
    """The server's replay data (routed experts, top-p spans) is missing or does not fit the trajectory."""


@dataclass(frozen=True)
class SampleContract:
    """What slime's trainer will demand of every sample of the batch."""

    routing: tuple[int, int] | None = None
    """``(num_layers, moe_router_topk)`` under ``--use-rollout-routing-replay``: ``len(tokens) - 1`` rows."""
    top_p: bool = False
    """``--rollout-top-p`` below 1: ragged top-p spans, ``len(offsets) == response_length + 1``."""
    speculative: bool = False
    """``--sglang-speculative-algorithm``: ``spec_info`` accumulates each turn's stats."""
    reward_key: str | None = None
    """``--reward-key`` (``--eval-reward-key`` in eval): a fixed reward must be a dict with this key."""
    mask_offpolicy: bool = False
    """``--partial-rollout --mask-offpolicy-in-partial-rollout``: tokens written before the episode's last
    continuation (``SegmentRecord.carried_tokens``) get loss mask 0, their logprobs kept (as slime masks)."""
    max_versions: int | None = None
    """``strands.staleness`` with ``on_exceed: mask``: tokens from more than this many weight versions before
    the episode's newest get loss mask 0 (``slime_strands._slime.staleness``); None: no such bound."""
    vision: Vision | None = field(default=None, compare=False)
    """A vision-language model's image processor: the sample's ``multimodal_*`` fields are written (None for a
    text model: they are left as slime made them)."""


@dataclass(frozen=True)
class Written:
    """What :func:`write_samples` wrote: the samples, and the episode's record as written (FAILED when the
    replay data did not fit)."""

    samples: tuple[Any, ...]
    record: EpisodeRecord


def reset_for_generation(sample: Any) -> int:
    """Give a sample coming (back) to ``generate`` a clean slate; returns how many attempts came before.

    slime re-queues whole groups (partial rollout, fully async) and regenerates every sample that is not
    COMPLETED / TRUNCATED; its reward is computed only when None. The sample is written again from the
    episode's record (an episode continued from its checkpoint, ``slime_strands._slime.partial_rollout``, or started
    again), so everything a previous attempt left (tokens, masks, replay data, a FAILED sample's reward and
    ``remove_sample``, counters) is reset.
    """
    previous = EpisodeRecord.of(sample)
    status_cls = type(sample).Status
    if previous is not None:
        attempts = previous.regenerations + 1
    else:
        attempts = int(getattr(sample, "status", status_cls.PENDING) != status_cls.PENDING)
    sample.tokens = []
    sample.response = ""
    sample.response_length = 0
    sample.loss_mask = None
    sample.rollout_log_probs = None
    sample.rollout_top_p_token_ids = None
    sample.rollout_top_p_token_offsets = None
    sample.rollout_routed_experts = None
    sample.multimodal_train_inputs = None
    sample.teacher_log_probs = None
    sample.weight_versions = []
    sample.reward = None
    sample.remove_sample = False
    sample.non_generation_time = 0.0
    sample.spec_info = type(sample).SpecInfo()
    sample.prefix_cache_info = type(sample).PrefixCacheInfo()
    sample.status = status_cls.PENDING
    if not isinstance(getattr(sample, "metadata", None), dict):
        sample.metadata = {}
    sample.metadata.pop(METADATA_KEY, None)
    return attempts


def write_sample(
    sample: Any, record: EpisodeRecord, contract: SampleContract, tokenizer: Any
) -> EpisodeRecord:
    """Fill ``sample`` from ``record`` (after :func:`reset_for_generation`) with the episode's last segment (all
    of it when it has one), then save the record in ``sample.metadata``; returns the record saved. A trajectory
    whose replay data is incomplete makes it a FAILED record (``record`` itself is never changed)."""
    if len(record.segments) > 1:
        record = record.for_segment(len(record.segments) - 1)
    if record.trajectory is not None and record.termination is not Termination.FAILED:
        trains = record.treatment.trains
        carried = record.segments[-1].carried_tokens if record.segments else 0
        try:
            mask = _train_mask(contract, record) if trains else _NO_MASK
            _write_trajectory(sample, record.trajectory, contract if trains else None, carried, mask)
            _write_images(sample, record.trajectory.images_before(len(record.trajectory)), contract.vision)
        except ReplayError as exc:
            record = _failed(sample, record, exc)
        else:
            sample.response = record.response
    if record.termination is Termination.FAILED:
        _write_failed(sample, record.trajectory, contract, tokenizer)
    _label(sample, record, record.treatment.status, contract)
    if record.treatment.trains and record.trajectory is not None:
        _remove_if_untrained(sample, record.trajectory)
    sample.non_generation_time = float(sample.non_generation_time or 0.0) + record.tool_time_s
    return record


def write_samples(sample: Any, record: EpisodeRecord, contract: SampleContract, tokenizer: Any) -> Written:
    """One sample per trajectory segment of an episode slime trains on, in ``record.segments`` order (the
    episode's last segment is ``sample`` itself, the others copies of it); a single sample for an episode of
    one segment or one slime does not train on. The episode's tool time is counted once, on the last sample.
    Bad replay data in any segment makes the whole episode one FAILED sample (and a FAILED record)."""
    if len(record.segments) < 2 or not record.treatment.trains:
        return Written((sample,), write_sample(sample, record, contract, tokenizer))
    last = len(record.segments) - 1
    samples = [copy.deepcopy(sample) for _ in range(last)] + [sample]
    mask = _train_mask(contract, record)
    try:
        for target, segment in zip(samples, record.segments, strict=True):
            assert segment.trajectory is not None
            _write_trajectory(target, segment.trajectory, contract, segment.carried_tokens, mask)
            _write_images(target, segment.trajectory.images_before(len(segment.trajectory)), contract.vision)
    except ReplayError as exc:  # the FAILED layout resets what the appender touched
        failed = write_sample(sample, _failed(sample, record, exc), contract, tokenizer)
        return Written((sample,), failed)
    for index, (target, segment) in enumerate(zip(samples, record.segments, strict=True)):
        target.response = segment.response
        _label(target, record.for_segment(index), segment.status, contract)
        if segment.trajectory is not None:
            _remove_if_untrained(target, segment.trajectory)
    sample.non_generation_time = float(sample.non_generation_time or 0.0) + record.tool_time_s
    return Written(tuple(samples), record.for_segment(last))


def _train_mask(contract: SampleContract, record: EpisodeRecord) -> TrainMask:
    """The rule of which generated tokens the episode's samples train (slime's flag, the staleness bound)."""
    return TrainMask.for_episode(contract.mask_offpolicy, contract.max_versions, record.version_newest)


def _remove_if_untrained(sample: Any, tm: TokenManager) -> None:
    """A sample whose generated tokens are all masked (by slime's off-policy flag or the staleness bound) is
    removed from training, as slime removes its own: no sample without a trained token reaches the trainer."""
    if tm.generated_length and not any(sample.loss_mask or ()):
        sample.remove_sample = True


def _failed(sample: Any, record: EpisodeRecord, exc: ReplayError) -> EpisodeRecord:
    logger.error("slime-strands: sample %s FAILED: %s", getattr(sample, "index", "?"), exc)
    return dataclasses.replace(record, termination=Termination.FAILED, error=f"ReplayError: {exc}")


def _label(sample: Any, record: EpisodeRecord, status: str, contract: SampleContract) -> None:
    """Status, reward rule, the counters slime's examples read, and the record."""
    treatment = record.treatment
    sample.status = type(sample).Status[status]
    sample.remove_sample = treatment.remove_sample
    if treatment.reward is RewardRule.ZERO:
        sample.reward = {contract.reward_key: 0.0} if contract.reward_key else 0.0
    sample.tool_iters = record.tool_iters  # what slime's strands example exposes to reward functions
    sample.tool_calls = record.tool_calls
    sample.metadata[METADATA_KEY] = record.to_metadata()


# -- successful (or aborted) trajectories ------------------------------------------------------------


def _write_trajectory(
    sample: Any,
    tm: TokenManager,
    contract: SampleContract | None,
    carried: int = 0,
    mask: TrainMask = _NO_MASK,
) -> None:
    """Append every span after the prompt as slime's appender would; ``contract`` None (an aborted
    sample slime never trains) writes tokens, mask and logprobs only. ``mask`` says which generated tokens
    get loss mask 0 (an older policy's: before position ``carried`` under ``--mask-offpolicy-in-partial-rollout``,
    or older than the staleness bound)."""
    ids, logprobs = tm.token_ids, tm.logprobs
    appender = _Appender(sample, ids[: tm.prompt_length], contract)
    if contract is None:
        mask = _NO_MASK
    turn = 0
    for span in tm.spans[1:]:
        if span.kind == "generated":
            turn += 1
            meta = span.info.meta_info if span.info is not None and contract is not None else None
            masked = mask.masked(span, carried)
            appender.model_turn(turn, span.token_ids, logprobs[span.start : span.end], meta, masked)
        else:
            appender.other_tokens(span.token_ids)
    appender.finish()


class _Appender:
    """Accumulates the response like ``Sample.append_response_tokens`` and assigns the fields once."""

    def __init__(self, sample: Any, prompt: Sequence[int], contract: SampleContract | None) -> None:
        self.sample = sample
        self.contract = contract
        self.tokens = list(prompt)
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.top_p_ids: list[int] | None = None
        self.top_p_offsets: list[int] | None = None
        self.experts: np.ndarray | None = None

    def model_turn(
        self,
        turn: int,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        meta: Mapping[str, Any] | None,
        masked: int = 0,
    ) -> None:
        """One server answer: trainable (its first ``masked`` tokens not: an older policy's), with its
        logprobs and its meta_info's replay data."""
        self.tokens += token_ids
        self.loss_mask += [0] * masked + [1] * (len(token_ids) - masked)
        self.logprobs += logprobs
        if meta is None:
            return
        self._top_p(turn, len(token_ids), meta)
        self._routed_experts(turn, meta)
        if "finish_reason" in meta:
            if self.contract is not None and self.contract.speculative:
                self.sample.spec_info.add(meta_info=meta)
            self.sample.prefix_cache_info.add(meta_info=meta)
            if "weight_version" in meta:
                self.sample.weight_versions.append(meta["weight_version"])

    def other_tokens(self, token_ids: Sequence[int]) -> None:
        self.tokens += token_ids
        self.loss_mask += [0] * len(token_ids)
        self.logprobs += [0.0] * len(token_ids)
        if self.top_p_offsets is not None:  # tokens the model did not sample: empty spans
            self.top_p_offsets += [self.top_p_offsets[-1]] * len(token_ids)

    def _top_p(self, turn: int, n_tokens: int, meta: Mapping[str, Any]) -> None:
        ids, offsets = _int32_array(meta, _TOP_P_IDS), _int32_array(meta, _TOP_P_OFFSETS)
        if ids is None and offsets is None:
            if self.contract is not None and self.contract.top_p:
                raise ReplayError(
                    f"top-p replay is on (--rollout-top-p < 1) but turn {turn} came back without "
                    "top_p_token_ids (SGLang needs slime's top-p patch to return them)"
                )
            return
        if ids is None or offsets is None:
            raise ReplayError(f"turn {turn}: the server returned top-p token ids or offsets, not both")
        if len(offsets) != n_tokens + 1 or offsets[0] != 0 or offsets[-1] != len(ids):
            raise ReplayError(
                f"turn {turn}: top-p offsets do not fit its {n_tokens} tokens "
                f"(len(offsets)={len(offsets)}, first={offsets[:1].tolist()}, last={offsets[-1:].tolist()}, "
                f"len(ids)={len(ids)})"
            )
        if self.top_p_offsets is None or self.top_p_ids is None:
            # The first spans: everything the model did not sample before them is empty.
            self.top_p_ids, self.top_p_offsets = [], [0] * (len(self.loss_mask) - n_tokens + 1)
        base = self.top_p_offsets[-1]
        self.top_p_ids += ids.tolist()
        self.top_p_offsets += [base + int(o) for o in offsets[1:]]

    def _routed_experts(self, turn: int, meta: Mapping[str, Any]) -> None:
        flat = _int32_array(meta, ("routed_experts",))
        routing = self.contract.routing if self.contract is not None else None
        if flat is None:
            finish = meta.get("finish_reason")
            if isinstance(finish, Mapping) and finish.get("type") == "abort":
                return  # an answer an abort cut may come without rows: its continuation brings them
            if routing is not None:
                raise ReplayError(
                    f"routing replay is on (--use-rollout-routing-replay) but turn {turn} came back without "
                    "routed_experts (start SGLang with --enable-return-routed-experts)"
                )
            return
        if routing is None:
            return  # not asked for (slime's appender would need num_layers / moe_router_topk to decode it)
        layers, topk = routing
        full_rows = len(self.tokens) - 1  # the routing of every position but the last sampled token
        start = meta.get("routed_experts_start_len") or 0
        if not is_int(start):
            raise ReplayError(f"turn {turn}: routed_experts_start_len is {start!r}, not a position")
        per_row = layers * topk
        if flat.size == (full_rows - start) * per_row:
            pass
        elif start and flat.size == full_rows * per_row:
            start = 0  # the full array although we asked for less (a router that dropped the field)
        else:
            raise ReplayError(
                f"turn {turn}: {flat.size} routed-expert values do not fit {full_rows} positions from "
                f"{start} with {layers} layers x top-{topk}"
            )
        rows = flat.reshape(-1, layers, topk)
        if start == 0:
            self.experts = rows
        elif self.experts is None or self.experts.shape[0] < start:
            held = 0 if self.experts is None else self.experts.shape[0]
            raise ReplayError(f"turn {turn}: routing rows start at {start} but only {held} rows are held")
        else:
            self.experts = np.concatenate([self.experts[:start], rows])

    def finish(self) -> None:
        sample, response_length = self.sample, len(self.loss_mask)
        if self.contract is not None and self.contract.routing is not None:
            rows = 0 if self.experts is None else self.experts.shape[0]
            if rows != len(self.tokens) - 1:
                raise ReplayError(f"{rows} routed-expert rows for {len(self.tokens)} tokens")
        sample.tokens = self.tokens
        sample.response_length = response_length
        sample.loss_mask = self.loss_mask
        sample.rollout_log_probs = self.logprobs
        if self.top_p_offsets is not None:
            sample.rollout_top_p_token_ids = self.top_p_ids
            sample.rollout_top_p_token_offsets = self.top_p_offsets
        if self.experts is not None:
            sample.rollout_routed_experts = self.experts


def _int32_array(meta: Mapping[str, Any], keys: Iterable[str]) -> np.ndarray | None:
    """SGLang's int32 arrays in ``meta_info``: a base64 string, raw bytes or a list (as slime decodes them).
    Anything that does not decode is a ReplayError (the sample fails, not the rollout step)."""
    key = next((key for key in keys if key in meta), None)
    value = None if key is None else meta[key]
    if value is None:
        return None
    try:
        if isinstance(value, str):
            value = base64.b64decode(value.encode("ascii"))
        if isinstance(value, (bytes, bytearray, memoryview)):
            return np.frombuffer(bytes(value), dtype=np.int32)
        return np.asarray(value, dtype=np.int32).reshape(-1)
    except (ValueError, TypeError, OverflowError) as exc:  # binascii.Error is a ValueError
        raise ReplayError(f"meta_info[{key!r}] is not an int32 array: {exc}") from exc


def _write_images(sample: Any, images: Sequence[TrajectoryImage], vision: Vision | None) -> None:
    """The images of the sample's tokens, in their order, as slime's VLM trainer reads them (see the module
    docstring); nothing for a text model's sample."""
    if vision is None and not images:
        return
    if not images:
        sample.multimodal_inputs = sample.multimodal_train_inputs = None
        return
    sample.multimodal_inputs = {"images": [image.pil() for image in images], "videos": None}
    sample.multimodal_train_inputs = vision.train_inputs(images) if vision is not None else None


# -- failed episodes ---------------------------------------------------------------------------------


def _write_failed(sample: Any, tm: TokenManager | None, contract: SampleContract, tokenizer: Any) -> None:
    """A sample slime can batch with the others and never learns from: the prompt and one masked filler token,
    with empty top-p spans and placeholder routing when the run replays them (validated like real rows:
    every MoE layer routes to a non-zero expert somewhere)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    filler = eos if isinstance(eos, int) else 0
    prompt = tm.token_ids[: tm.prompt_length] if tm is not None and tm.prompt_length else [filler]
    sample.tokens = [*prompt, filler]
    _write_images(sample, tm.images_before(tm.prompt_length) if tm is not None else [], contract.vision)
    sample.response_length = 1
    sample.loss_mask = [0]
    sample.rollout_log_probs = [0.0]
    sample.response = str(getattr(tokenizer, "eos_token", None) or "")
    sample.weight_versions = []
    sample.spec_info = type(sample).SpecInfo()
    sample.prefix_cache_info = type(sample).PrefixCacheInfo()
    sample.rollout_top_p_token_ids = [] if contract.top_p else None
    sample.rollout_top_p_token_offsets = [0, 0] if contract.top_p else None
    if contract.routing is not None:
        layers, topk = contract.routing
        sample.rollout_routed_experts = np.broadcast_to(
            np.arange(topk, dtype=np.int32), (len(prompt), layers, topk)
        ).copy()
    else:
        sample.rollout_routed_experts = None
