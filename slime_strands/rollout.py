"""slime's custom generate function: one Strands agent episode per Sample, token-in/token-out.

    --custom-generate-function-path slime_strands.rollout.generate

Three steps per sample: the slime adapter turns the ``Sample`` and sampling params into an
:class:`~slime_strands.agent.episode.EpisodeSpec`, with slime's flags read once per args object into a typed
:class:`~slime_strands._slime.config.SlimeConfig` (the only reader of the namespace: everything below gets the
view; it holds the shared :class:`~slime_strands.agent.runtime.Runtime`);
:func:`~slime_strands.agent.episode.run_episode` runs the agent and returns the typed
:class:`~slime_strands.agent.record.EpisodeRecord`; :func:`~slime_strands._slime.sample_writer.write_sample` turns the
record into the Sample's fields (``record.TREATMENTS`` says which status, reward and metrics each ending gets).

Partial rollout (``--partial-rollout``): an episode slime's abort stops leaves a checkpoint on its ABORTED
sample, and when slime hands the sample back ``generate`` continues the episode where it stopped (see
``slime_strands._slime.partial_rollout``); a sample without one starts from its prompt.

Fan-out: when an episode may produce several samples (``context_management`` compacts its history, or
``collect_subagents`` trains its sub-agents), training returns ``list[Sample]``, one per trajectory segment,
all with the sample's ``rollout_id`` (slime's default: its ``index``), so slime keeps them together for
train-step splitting and its per-rollout loss mean. It is a list even when the episode has one segment:
slime flattens a batch by looking at its first item, so a batch cannot mix ``Sample`` and ``list[Sample]``.
The reward: the episode's reward (what slime's reward function gives the last segment, which holds the final
answer) on EVERY segment, not divided by their number, because slime's loss already averages over the
rollout's tokens across its segments (``rollout_mask_sums``): every token of the episode then gets the
advantage an unsplit episode would get. ``generate`` scores the episode itself so slime's per-segment
scoring does not grade segments that hold no answer. Evaluation returns one Sample (the last segment): eval
metrics count one sample per attempt. An aborted episode returns its one Sample, a finished one an
``EpisodeSamples`` (a ``list[Sample]`` slime's partial rollout can also read as one sample).

Errors: a :class:`~slime_strands.errors.ConfigurationError` (bad settings, a tool that does not import, a
template that fails the probe, slime flags the plugin cannot honour) is RAISED at the first sample: every
sample would fail the same way. Cancellation propagates (slime cancels pending rollouts on abort). Anything
else ends this one sample FAILED, never the rollout step.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from ._slime.adapter import episode_spec, sample_contract, score_sample, slime_generate_state
from ._slime.config import SlimeConfig
from ._slime.partial_rollout import (
    EpisodeSamples,
    kept_on_cancel,
    original_sample,
    save_checkpoint,
    take_checkpoint,
)
from ._slime.sample_writer import SampleContract, reset_for_generation, write_sample, write_samples
from ._slime.staleness import bound_staleness
from .agent.checkpoint import EpisodeCheckpoint
from .agent.record import EpisodeRecord, RewardRule, Termination
from .agent.runner import EpisodeJob
from .agent.runtime import Runtime
from .errors import ConfigurationError
from .workers import runner_for

__all__ = ["generate"]

logger = logging.getLogger(__name__)


async def generate(
    args: Any, sample: Any, sampling_params: Mapping[str, Any], evaluation: bool = False
) -> Any:
    """Run one agent episode for ``sample`` and fill its fields; returns ``sample``, or its segments'
    samples when the settings fan out in training (see the module docstring). ``sample`` may be such a list
    (slime hands back a group its abort collected whole): the episode runs again for its original Sample."""
    sample = original_sample(sample)  # a fanned-out episode slime's abort put back whole
    with kept_on_cancel(sample):
        return await _generate(args, sample, sampling_params, evaluation)


async def _generate(args: Any, sample: Any, sampling_params: Mapping[str, Any], evaluation: bool) -> Any:
    started = time.perf_counter()
    checkpoint = take_checkpoint(sample)  # a recycled sample continues its episode where it stopped
    attempts = reset_for_generation(sample)
    slime = SlimeConfig.of(args)  # the one read of slime's args: checked, then passed down
    runtime = slime.runtime
    resumes = slime.continues_aborted(evaluation)
    if not resumes:
        checkpoint = None
    fan_out = slime.settings.fans_out and not evaluation
    if fan_out:
        slime.check_fanout()
    record, contract, tokenizer = await _run(
        slime, runtime, sample, sampling_params, evaluation, checkpoint, keep_checkpoint=resumes
    )
    carried = record.carried_generated_tokens() if contract.mask_offpolicy else record.offpolicy_masked_tokens
    record = dataclasses.replace(
        record,
        regenerations=attempts,
        wall_time_s=time.perf_counter() - started,
        offpolicy_masked_tokens=carried,
        rollout_thread=threading.current_thread().name,
    )
    record = bound_staleness(
        record, slime.settings.staleness, before_continuation=contract.mask_offpolicy, training=not evaluation
    )
    samples, record = await _write(slime, sample, record, contract, tokenizer, fan_out=fan_out)
    save_checkpoint(sample, record)
    if not fan_out or record.termination is Termination.ABORTED:
        return sample
    rollout_id = getattr(sample, "rollout_id", None)
    for item in samples:
        item.rollout_id = rollout_id if rollout_id is not None else sample.index
    return EpisodeSamples(samples)


async def _run(
    slime: SlimeConfig,
    runtime: Runtime,
    sample: Any,
    sampling_params: Mapping[str, Any],
    evaluation: bool,
    checkpoint: EpisodeCheckpoint | None,
    *,
    keep_checkpoint: bool,
) -> tuple[EpisodeRecord, SampleContract, Any]:
    """The episode's record, the trainer's contract and the tokenizer (None when it could not be had); a
    FAILED record for anything but a configuration error or cancellation."""
    state, tokenizer, contract = None, None, SampleContract()
    try:
        state = slime_generate_state(slime)
        tokenizer = state.tokenizer if state is not None else await runtime.tokenizer()
        vision = await runtime.vision()
        contract = sample_contract(slime, sampling_params, evaluation, vision)
        spec = episode_spec(slime, sample, sampling_params, evaluation, contract)
        job = EpisodeJob(spec, resume=checkpoint, keep_checkpoint=keep_checkpoint)
        record = await runner_for(runtime).run(  # in this process, or on a rollout worker
            runtime,
            job,
            tokenizer=tokenizer,
            vision=vision,
            abort=None if state is None else runtime.abort_signal(state),
        )
    except (ConfigurationError, asyncio.CancelledError):
        raise
    except Exception as exc:  # a plugin bug must not kill slime's rollout step
        logger.exception("slime-strands: sample %s failed", getattr(sample, "index", "?"))
        record = EpisodeRecord(
            Termination.FAILED, evaluation=evaluation, error=f"{type(exc).__name__}: {exc}"
        )
    return record, contract, tokenizer


async def _write(
    slime: SlimeConfig,
    sample: Any,
    record: EpisodeRecord,
    contract: SampleContract,
    tokenizer: Any,
    *,
    fan_out: bool,
) -> tuple[list[Any], EpisodeRecord]:
    """The record written into ``sample`` (and, fanned out, into its segments' copies, scored), and the record
    as written (FAILED when the writer could not replay it); a failure doing so rewrites ``sample`` FAILED
    instead of reaching slime's rollout step."""
    try:
        if not fan_out:
            return [sample], write_sample(sample, record, contract, tokenizer)
        return await _scored_segments(slime, sample, record, contract, tokenizer)
    except (ConfigurationError, asyncio.CancelledError):
        raise
    except Exception as exc:
        logger.exception("slime-strands: writing sample %s failed", getattr(sample, "index", "?"))
        return [sample], _rewrite_failed(sample, record, contract, tokenizer, f"{type(exc).__name__}: {exc}")


async def _scored_segments(
    slime: SlimeConfig, sample: Any, record: EpisodeRecord, contract: SampleContract, tokenizer: Any
) -> tuple[list[Any], EpisodeRecord]:
    """The episode's samples and its record as written, each sample with the episode's reward (slime's reward
    function scores the last segment, which holds the final answer; one that raises fails the episode, not the
    rollout step)."""
    written = write_samples(sample, record, contract, tokenizer)
    samples = list(written.samples)
    if written.record.treatment.reward is not RewardRule.SCORE:
        return samples, written.record
    try:
        reward = await score_sample(slime, samples[-1])
    except (ConfigurationError, asyncio.CancelledError):
        raise
    except Exception as exc:  # the user's reward function: it fails this episode, not the rollout step
        logger.exception(
            "slime-strands: the reward function failed on sample %s", getattr(sample, "index", "?")
        )
        error = f"reward function: {type(exc).__name__}: {exc}"
        return [sample], _rewrite_failed(sample, record, contract, tokenizer, error)
    for item in samples:
        item.reward = copy.deepcopy(reward)
    return samples, written.record


def _rewrite_failed(
    sample: Any, record: EpisodeRecord, contract: SampleContract, tokenizer: Any, error: str
) -> EpisodeRecord:
    """``sample`` written again as a FAILED episode, whatever the episode's record said (its counters of
    attempts and time are kept); returns the FAILED record."""
    reset_for_generation(sample)
    failed = EpisodeRecord(
        Termination.FAILED,
        evaluation=record.evaluation,
        error=error,
        regenerations=record.regenerations,
        wall_time_s=record.wall_time_s,
    )
    return write_sample(sample, failed, contract, tokenizer)
