"""GRPO group normalisation over ROLLOUTS, FAILED ones left out of their group (slime's reward post-process hook).

    --custom-reward-post-process-path slime_strands.reward_norm.post_process_rewards

slime's default (``RolloutManager._post_process_rewards`` in ``slime/ray/rollout.py``) subtracts each group's
mean reward (and divides by its std for grpo / gspo / cispo). This function is slime's default with two
changes:

* It normalises rollouts, not samples. A rollout whose history was compacted (or whose sub-agents were
  collected) is several samples sharing one ``rollout_id`` and one reward; counted per sample, a long
  episode would weigh K times in its group's mean and std, and slime's positional grouping (rows of
  ``n_samples_per_prompt`` only when the batch holds exactly ``rollout_batch_size x n_samples_per_prompt``
  samples, else one row) would put the whole batch in one group. Here each rollout counts once (its samples'
  mean reward: they are equal when slime-strands wrote them), slime's positional rule applies to the
  rollouts, and every sample of a rollout gets the rollout's advantage. Samples without a ``rollout_id`` are
  rollouts of their own.
* ``remove_sample`` only zeroes a sample's loss: a FAILED rollout's fixed reward would still enter its group's
  mean and std and shift every sibling's advantage. In a group with FAILED rollouts the statistics come from
  the others only, and the FAILED ones get 0.0 (their loss is masked anyway). A group left with fewer than
  two rollouts has nothing to compare against: its advantages are 0.0.

Batches of one sample per rollout without a FAILED one get exactly slime's numbers (float32, unbiased std,
``+ 1e-6``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._slime.advantage import CENTERED_ESTIMATORS, STD_SCALED_ESTIMATORS

__all__ = ["CENTERED_ESTIMATORS", "post_process_rewards"]


def post_process_rewards(args: Any, samples: Sequence[Any]) -> tuple[list[Any], list[float]]:
    """``(raw_rewards, rewards)`` as slime's hook returns them: one entry per sample, normalised per rollout
    group, FAILED rollouts out of the group statistics."""
    raw = [sample.get_reward_value(args) for sample in samples]
    if not (args.advantage_estimator in CENTERED_ESTIMATORS and args.rewards_normalization):
        return raw, raw
    rollouts = _rollouts(samples)
    rewards = np.asarray(
        [np.mean(np.asarray([raw[i] for i in r], dtype=np.float32)) for r in rollouts], np.float32
    )
    failed = np.asarray([all(_is_failed(samples[i]) for i in r) for r in rollouts], dtype=bool)
    size = args.n_samples_per_prompt
    # slime's grouping, over rollouts: n_samples_per_prompt per group when the batch is full, else one group.
    width = size if len(rollouts) == size * args.rollout_batch_size else len(rollouts)
    scale = args.advantage_estimator in STD_SCALED_ESTIMATORS and args.grpo_std_normalization
    advantages = np.zeros_like(rewards)
    for start in range(0, len(rollouts), max(width, 1)):
        group, dead = rewards[start : start + width], failed[start : start + width]
        advantages[start : start + width] = _normalise(group, dead, scale)
    out = [0.0] * len(samples)
    for rollout, advantage in zip(rollouts, advantages, strict=True):
        for i in rollout:
            out[i] = float(advantage)
    return raw, out


def _rollouts(samples: Sequence[Any]) -> list[list[int]]:
    """Positions of each rollout's samples (one ``rollout_id``), rollouts in order of first appearance."""
    by_id: dict[Any, list[int]] = {}
    for i, sample in enumerate(samples):
        rollout_id = getattr(sample, "rollout_id", None)
        by_id.setdefault(("id", rollout_id) if rollout_id is not None else ("position", i), []).append(i)
    return list(by_id.values())


def _normalise(group: np.ndarray, dead: np.ndarray, scale: bool) -> np.ndarray:
    if dead.any():
        alive = group[~dead]
        result = np.zeros_like(group)
        if len(alive) >= 2:
            result[~dead] = _centre(alive, scale)
        return result
    return _centre(group, scale)


def _centre(values: np.ndarray, scale: bool) -> np.ndarray:
    centred = values - values.mean(dtype=np.float32)
    if not scale:
        return centred
    std = centred.std(ddof=1, dtype=np.float32) if len(values) > 1 else np.float32("nan")
    return (centred / (std + np.float32(1e-6))).astype(np.float32)


def _is_failed(sample: Any) -> bool:
    status = getattr(sample, "status", None)
    return getattr(status, "name", None) == "FAILED"
