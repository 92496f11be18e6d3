"""The reward post-process against slime's own default group normalisation (slime's code when importable, else
its steps in torch float32): identical without FAILED samples; FAILED samples out of their group's statistics."""

from __future__ import annotations

import random

import pytest
from slime_helpers import Sample, group_norm_args, slime_group_norm

from slime_strands.reward_norm import post_process_rewards

S = Sample.Status


def batch(rewards, failed=()):
    return [
        Sample(index=i, reward=r, status=S.FAILED if i in failed else S.COMPLETED)
        for i, r in enumerate(rewards)
    ]


REWARDS = [1.0, -1.0, -0.75, 1.0, 0.0, 0.0, 0.0, 0.0, -1.0, -0.8, -0.6, 1.0]


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"grpo_std_normalization": False},
        {"advantage_estimator": "gspo"},
        {"advantage_estimator": "reinforce_plus_plus_baseline"},
        {"advantage_estimator": "ppo"},
        {"rewards_normalization": False},
        {"rollout_batch_size": 2},  # the batch is not n x batch_size: slime makes it one group
    ],
)
def test_without_failures_it_is_slimes_default(overrides):
    a = group_norm_args(**overrides)
    samples = batch(REWARDS)
    raw, ours = post_process_rewards(a, samples)
    slime_raw, theirs = slime_group_norm(a, samples)
    assert raw == slime_raw == REWARDS
    assert ours == pytest.approx(theirs, abs=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_failed_samples_leave_their_siblings_advantages_alone(seed):
    rng = random.Random(seed)
    rewards = [rng.choice([1.0, -1.0, -0.9, -0.6]) for _ in range(12)]
    failed = {rng.randrange(4), 4 + rng.randrange(4), 8 + rng.randrange(4)}
    for i in failed:
        rewards[i] = 0.0  # what generate gives a FAILED sample
    samples = batch(rewards, failed)
    _, ours = post_process_rewards(group_norm_args(), samples)
    for group in range(3):
        members = range(4 * group, 4 * group + 4)
        alive = [i for i in members if i not in failed]
        _, expected = slime_group_norm(
            group_norm_args(n_samples_per_prompt=3, rollout_batch_size=1), [samples[i] for i in alive]
        )
        assert [ours[i] for i in alive] == pytest.approx(expected, abs=1e-5)
        assert all(ours[i] == 0.0 for i in members if i in failed)


def test_the_bias_it_removes_is_real():
    samples = batch([1.0, 1.0, -1.0, 0.0], failed={3})
    samples_full = batch([1.0, 1.0, -1.0, 0.0])
    a = group_norm_args(rollout_batch_size=1)
    _, ours = post_process_rewards(a, samples)
    _, slime_default = slime_group_norm(a, samples_full)
    assert ours[:3] != pytest.approx(slime_default[:3], abs=1e-3)


def test_a_group_left_with_one_sample_has_nothing_to_compare():
    _, ours = post_process_rewards(
        group_norm_args(rollout_batch_size=1), batch([1.0, 0.0, 0.0, 0.0], failed={1, 2, 3})
    )
    assert ours == [0.0, 0.0, 0.0, 0.0]


def test_dict_rewards_with_a_reward_key():
    a = group_norm_args(rollout_batch_size=1, reward_key="score")
    samples = batch([{"score": 1.0}, {"score": -1.0}, {"score": 1.0}, {"score": 0.0}], failed={3})
    raw, ours = post_process_rewards(a, samples)
    assert raw == [1.0, -1.0, 1.0, 0.0]
    _, expected = slime_group_norm(
        group_norm_args(n_samples_per_prompt=3, rollout_batch_size=1), batch([1.0, -1.0, 1.0])
    )
    assert ours[:3] == pytest.approx(expected, abs=1e-5) and ours[3] == 0.0
