"""Fan-out pieces without a server: the settings, the segment record, writing one sample per segment, the
per-rollout reward normalisation against slime's own, the slime flags that cannot take lists, the sub-agent
tool helper, and why a fanned-out batch is lists throughout (slime's flattening)."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
from slime_helpers import Sample, group_norm_args, slime_args, slime_group_norm

from slime_strands import metrics, reward
from slime_strands._slime.adapter import score_sample
from slime_strands._slime.config import SlimeConfig
from slime_strands._slime.sample_writer import SampleContract, reset_for_generation, write_samples
from slime_strands.agent.record import EpisodeRecord, MalformedRecordError, SegmentRecord, Termination
from slime_strands.agent.subagents import subagent_tool
from slime_strands.errors import ConfigurationError
from slime_strands.provider.token_manager import TokenManager, TurnInfo
from slime_strands.reward_norm import post_process_rewards
from slime_strands.settings import CompactionSettings, PluginSettings, SettingsError

S = Sample.Status

# -- settings --------------------------------------------------------------------------------------


def test_context_management_is_off_by_default():
    settings = PluginSettings()
    assert settings.context_management == "none" and not settings.collect_subagents
    assert settings.compaction == CompactionSettings() and not settings.fans_out
    assert PluginSettings.from_mapping({"collect_subagents": True}).fans_out
    summarize = PluginSettings.from_mapping(
        {"context_management": "summarize", "compaction": {"trigger_share": 1}}
    )
    assert summarize.fans_out and summarize.compaction.trigger_share == 1.0


def test_summarize_takes_a_summary_budget_and_the_window_it_falls_back_to():
    assert CompactionSettings().summary_max_tokens is None, "by default sized from the window"
    settings = PluginSettings.from_mapping(
        {"context_management": "summarize", "compaction": {"summary_max_tokens": 256, "window_size": 4}}
    )
    assert settings.compaction.summary_max_tokens == 256 and settings.compaction.window_size == 4


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"context_management": "compact"}, "context_management: unknown value 'compact'; choose one of"),
        (
            {"context_management": "summarize", "compaction": {"trigger_share": 0}},
            "trigger_share must be in (0, 1]",
        ),
        (
            {"context_management": "summarize", "compaction": {"trigger_share": 1.5}},
            "trigger_share must be in (0, 1]",
        ),
        (
            {"context_management": "summarize", "compaction": {"summary_ratio": 0.0}},
            "summary_ratio must be in (0, 1]",
        ),
        (
            {"context_management": "summarize", "compaction": {"max_compactions": 0}},
            "max_compactions must be >= 1",
        ),
        (
            {"context_management": "sliding_window", "compaction": {"window_size": 0}},
            "window_size must be >= 1",
        ),
        (
            {"context_management": "summarize", "compaction": {"summary_prompt": " "}},
            "summary_prompt must not be empty",
        ),
        (
            {"compaction": {"trigger_share": 0.5}},
            "compaction.trigger_share is set but context_management is 'none'",
        ),
        (
            {"context_management": "sliding_window", "compaction": {"summary_max_tokens": 256}},
            "compaction.summary_max_tokens only applies to context_management: summarize",
        ),
        (
            {"context_management": "summarize", "compaction": {"summary_max_tokens": 0}},
            "compaction.summary_max_tokens must be >= 1 or null, got 0",
        ),
        (
            {"context_management": "summarize", "compaction": {"summary_max_tokens": True}},
            "compaction.summary_max_tokens: expected int, got a boolean",
        ),
        (
            {"context_management": "sliding_window", "compaction": {"summary_ratio": 0.5}},
            "compaction.summary_ratio only applies to context_management: summarize",
        ),
        (
            {"context_management": "summarize", "compaction": {"trigger": 0.5}},
            "unknown setting(s) compaction.trigger",
        ),
        ({"collect_subagents": "yes"}, "collect_subagents: expected bool"),
    ],
)
def test_invalid_context_management_names_the_problem(data, message):
    with pytest.raises(SettingsError) as info:
        PluginSettings.from_mapping(data)
    assert message in str(info.value)


# -- the record --------------------------------------------------------------------------------------


def segment(kind="main", opened_by="prompt", closed_by="compaction", **fields) -> SegmentRecord:
    values = dict(status="COMPLETED", prompt_length=10, response_length=20, generated_tokens=12, turns=3)
    values.update(fields)
    return SegmentRecord(kind=kind, opened_by=opened_by, closed_by=closed_by, **values)


def fanned_record(**fields) -> EpisodeRecord:
    segments = [
        segment(),
        segment("subagent", "subagent", "end_turn", name="helper"),
        segment(opened_by="summarize", closed_by="end_turn", tokens_saved=300, final_turn_chars=7),
    ]
    return EpisodeRecord(Termination.END_TURN, segments=segments, **fields)


def test_segments_round_trip_and_sum_up():
    record = fanned_record(turns=9)
    data = record.to_metadata()
    assert data["segments"][2] == {
        "kind": "main",
        "opened_by": "summarize",
        "closed_by": "end_turn",
        "status": "COMPLETED",
        "prompt_length": 10,
        "response_length": 20,
        "generated_tokens": 12,
        "turns": 3,
        "tokens_saved": 300,
        "name": "",
        "final_turn_chars": 7,
        "carried_tokens": 0,
    }
    assert EpisodeRecord.from_metadata(data) == record
    assert (record.compactions, record.tokens_saved, record.subagents) == (1, 300, 1)
    views = [record.for_segment(i) for i in range(3)]
    assert [v.segment for v in views] == [0, 1, 2] and [v.closes_episode for v in views] == [
        False,
        False,
        True,
    ]
    assert views[2].final_turn_chars == 7 and record.closes_episode, "a record of the whole episode closes it"
    assert EpisodeRecord.from_metadata(views[1].to_metadata()) == views[1]


@pytest.mark.parametrize(
    "change",
    [
        {"segments": "one"},
        {"segments": [{"kind": "main"}]},
        {"segments": [{**segment().to_dict(), "kind": "helper"}]},
        {"segments": [{**segment().to_dict(), "opened_by": "magic"}]},
        {"segments": [{**segment().to_dict(), "closed_by": "done"}]},
        {"segments": [{**segment().to_dict(), "turns": "3"}]},
        {"segments": [{**segment().to_dict(), "extra": 1}]},
        {"segment": 3},
        {"segment": True},
    ],
)
def test_a_malformed_segment_makes_the_record_malformed(change):
    data = {**fanned_record().to_metadata(), **change}
    with pytest.raises(MalformedRecordError):
        EpisodeRecord.from_metadata(data)
    assert EpisodeRecord.in_metadata({"strands": data}) is None


# -- one sample per segment --------------------------------------------------------------------------


def trajectory(prompt: list[int], *turns: tuple[list[int], list[int]], top_p: bool = True) -> TokenManager:
    """A trajectory of generated turns (each after its observation) whose meta_info carries top-p spans."""
    tm = TokenManager()
    tm.add_prompt(prompt)
    for observation, generated in turns:
        if observation:
            tm.add_observation(observation)
        meta = {
            "finish_reason": {"type": "stop"},
            "weight_version": "3",
            "prompt_tokens": 5,
            "cached_tokens": 2,
        }
        if top_p:
            meta |= {
                "top_p_token_ids": list(generated),
                "top_p_token_offsets": list(range(len(generated) + 1)),
            }
        tm.add_generation(generated, [-0.5] * len(generated), TurnInfo("stop", meta_info=meta))
    return tm


def episode_of(*trajectories: TokenManager) -> EpisodeRecord:
    segments = [
        segment(
            opened_by="prompt" if i == 0 else "sliding_window",
            closed_by="compaction" if i < len(trajectories) - 1 else "end_turn",
            prompt_length=tm.prompt_length,
            response_length=tm.response_length,
            generated_tokens=tm.generated_length,
            turns=len(tm.turns),
            trajectory=tm,
            response=f"response {i}",
        )
        for i, tm in enumerate(trajectories)
    ]
    return EpisodeRecord(
        Termination.END_TURN,
        tool_iters=2,
        tool_time_s=1.5,
        segments=segments,
        trajectory=trajectories[-1],
        response="response last",
    )


def blank_sample() -> Sample:
    sample = Sample(prompt="p", index=4, group_index=1, metadata={"keep": 1})
    reset_for_generation(sample)
    return sample


def test_each_segment_becomes_a_sample_of_its_own(tokenizer):
    first = trajectory([1, 2, 3], ([], [10, 11]), ([20], [12, 13, 14]))
    second = trajectory([1, 2, 9], ([], [15]))
    sample = blank_sample()
    record = episode_of(first, second)
    written = write_samples(sample, record, SampleContract(top_p=True), tokenizer)
    out = written.samples
    assert written.record == record.for_segment(1), "what the last sample holds"
    assert len(out) == 2 and out[-1] is sample and out[0] is not sample
    a, b = out
    assert a.tokens == first.token_ids and a.response_length == 6 and a.loss_mask == [1, 1, 0, 1, 1, 1]
    assert a.rollout_log_probs == [-0.5, -0.5, 0.0, -0.5, -0.5, -0.5]
    assert a.rollout_top_p_token_offsets == [0, 1, 2, 2, 3, 4, 5] and a.rollout_top_p_token_ids == [
        10,
        11,
        12,
        13,
        14,
    ]
    assert b.tokens == [1, 2, 9, 15] and b.loss_mask == [1] and b.rollout_top_p_token_ids == [15]
    assert a.weight_versions == ["3", "3"] and b.weight_versions == ["3"]
    assert a.prefix_cache_info.total_prompt_tokens == 10 and b.prefix_cache_info.total_prompt_tokens == 5
    assert (a.response, b.response) == ("response 0", "response 1")
    assert a.status == b.status == S.COMPLETED and a.reward is None and not a.remove_sample
    assert (a.non_generation_time, b.non_generation_time) == (0.0, 1.5), "tool time counted once"
    assert a.tool_iters == b.tool_iters == 2 and a.metadata["keep"] == b.metadata["keep"] == 1
    records = [EpisodeRecord.of(s) for s in out]
    assert [r.segment for r in records] == [0, 1] and [r.closes_episode for r in records] == [False, True]


def test_bad_replay_data_in_one_segment_fails_the_whole_episode(tokenizer, caplog):
    first = trajectory([1, 2, 3], ([], [10, 11]), top_p=False)  # no top-p spans although the run replays them
    second = trajectory([1, 2, 9], ([], [15]))
    sample = blank_sample()
    record = episode_of(second, first)
    written = write_samples(sample, record, SampleContract(top_p=True), tokenizer)
    assert (
        written.samples == (sample,)
        and sample.status == S.FAILED
        and sample.remove_sample
        and sample.reward == 0.0
    )
    assert sample.loss_mask == [0] and sample.rollout_top_p_token_offsets == [0, 0]
    assert "top-p replay is on" in EpisodeRecord.of(sample).error and "FAILED" in caplog.text
    assert written.record == EpisodeRecord.of(sample) and written.record.termination is Termination.FAILED
    assert record.termination is Termination.END_TURN and record.error is None, "the caller's record is kept"
    assert sample.metadata["keep"] == 1


def test_an_episode_slime_does_not_train_on_stays_one_sample(tokenizer):
    record = episode_of(trajectory([1, 2], ([], [5])), trajectory([1, 3], ([], [6])))
    record = dataclasses.replace(record, termination=Termination.ABORTED)
    sample = blank_sample()
    assert write_samples(sample, record, SampleContract(), tokenizer).samples == (sample,)
    assert sample.status == S.ABORTED and sample.tokens == [1, 3, 6] and EpisodeRecord.of(sample).segment == 1


# -- group normalisation per rollout ----------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    "overrides", [{}, {"advantage_estimator": "reinforce_plus_plus_baseline"}, {"rollout_batch_size": 2}]
)
def test_each_rollout_counts_once_and_its_samples_share_its_advantage(seed, overrides):
    rng = random.Random(seed)
    a = group_norm_args(**overrides)
    finals, flat = [], []
    for index in range(12):  # 3 prompts x 4 rollouts, each 1 to 3 samples sharing rollout_id = index
        value = rng.choice([1.0, -1.0, -0.9, -0.6])
        siblings = [
            Sample(index=index, rollout_id=index, reward=value, status=S.COMPLETED)
            for _ in range(rng.randint(1, 3))
        ]
        finals.append(siblings[-1])
        flat += siblings
    raw, ours = post_process_rewards(a, flat)
    assert raw == [s.reward for s in flat]
    _, per_rollout = slime_group_norm(a, finals)  # slime's own numbers on one sample per rollout
    for s, advantage in zip(flat, ours, strict=True):
        assert advantage == pytest.approx(per_rollout[s.rollout_id], abs=1e-5)
    if len(flat) != 12 and a.rollout_batch_size == 3:
        _, default = slime_group_norm(a, flat)  # slime's default sees one group of len(flat)
        assert default != pytest.approx(ours, abs=1e-3)


def test_failed_rollouts_leave_a_fanned_out_group_alone():
    flat = [
        Sample(rollout_id=0, reward=1.0, status=S.COMPLETED),
        Sample(rollout_id=0, reward=1.0, status=S.COMPLETED),
        Sample(rollout_id=1, reward=0.0, status=S.FAILED),
        Sample(rollout_id=2, reward=-1.0, status=S.TRUNCATED),
        Sample(rollout_id=3, reward=-1.0, status=S.COMPLETED),
    ]
    _, ours = post_process_rewards(group_norm_args(n_samples_per_prompt=4, rollout_batch_size=1), flat)
    alive = [flat[1], flat[3], flat[4]]
    _, expected = slime_group_norm(group_norm_args(n_samples_per_prompt=3, rollout_batch_size=1), alive)
    assert ours[2] == 0.0
    assert [ours[0], ours[1], ours[3], ours[4]] == pytest.approx([expected[0], *expected], abs=1e-5)


# -- slime's side ------------------------------------------------------------------------------------


def slime_flatten(data):
    """slime's ``_get_rollout_data``: flatten while the FIRST item is a list."""
    while isinstance(data[0], list):
        data = list(itertools.chain.from_iterable(data))
    return data


def test_slime_cannot_flatten_a_batch_mixing_samples_and_lists():
    # Why fan-out returns a list even for an episode of one segment.
    single, pair = Sample(index=0), [Sample(index=1), Sample(index=1)]
    with pytest.raises(TypeError):
        slime_flatten([[[Sample(index=2)], single]])  # a list first: the Sample is iterated
    leftover = slime_flatten([[single, pair]])  # a Sample first: the list stays in the batch
    assert any(isinstance(item, list) for item in leftover)
    assert all(isinstance(s, Sample) for s in slime_flatten([[[single], pair]]))


def check_fanout(**overrides):
    flags = dict(
        advantage_estimator="grpo", rewards_normalization=True, partial_rollout=False, group_rm=False
    )
    SlimeConfig.of(slime_args(**{**flags, **overrides})).check_fanout()


def test_slime_flags_that_cannot_take_lists():
    check_fanout(custom_reward_post_process_path="slime_strands.reward_norm.post_process_rewards")
    check_fanout(advantage_estimator="ppo")  # nothing normalised per group
    check_fanout(rewards_normalization=False)
    norm = {"custom_reward_post_process_path": "slime_strands.reward_norm.post_process_rewards"}
    check_fanout(partial_rollout=True, mask_offpolicy_in_partial_rollout=True, **norm)
    with pytest.raises(ConfigurationError) as info:
        check_fanout(partial_rollout=True, group_rm=True)
    text = str(info.value)
    assert "--group-rm" in text and "--partial-rollout" not in text, (
        "partial rollout takes fanned-out episodes"
    )
    assert "--custom-reward-post-process-path slime_strands.reward_norm.post_process_rewards" in text


async def test_the_episode_is_scored_with_slimes_reward_function():
    sample = Sample(
        response="Answer: \\boxed{5}", label="5", metadata={"strands": fanned_record().to_metadata()}
    )
    a = SlimeConfig.of(slime_args(custom_rm_path="slime_strands.reward.math_reward", strands=None))
    assert await score_sample(a, sample) == 1.0
    sample.custom_rm_path = "slime_strands.reward.accuracy"  # the sample's own wins, as in slime
    assert await score_sample(a, sample) == 1.0
    with pytest.raises(ConfigurationError, match="set --custom-rm-path"):
        await score_sample(SlimeConfig.of(slime_args(custom_rm_path=None)), Sample())
    with pytest.raises(ConfigurationError, match="cannot be imported"):
        await score_sample(SlimeConfig.of(slime_args(custom_rm_path="no_such_module.reward")), Sample())


async def test_reward_functions_answer_slimes_batch_mode():
    a = slime_args(strands=None)
    samples = [Sample(response="Answer: 5", label="5"), Sample(response="Answer: 4", label="5")]
    assert await reward.math_reward(a, []) == [] and await reward.accuracy(a, []) == []
    assert await reward.math_reward(a, samples) == [1.0, -1.0]
    assert await reward.accuracy(a, samples) == [1.0, 0.0]


def test_metrics_count_an_episode_once():
    record = fanned_record(turns=9)
    siblings = [
        Sample(status=S.COMPLETED, metadata={"strands": record.for_segment(i).to_metadata()})
        for i in range(3)
    ]
    single = Sample(
        status=S.TRUNCATED, metadata={"strands": EpisodeRecord(Termination.MAX_TOKENS, turns=2).to_metadata()}
    )
    m = metrics.aggregate([*siblings, single])
    assert m["samples"] == 2.0 and m["turns_mean"] == 5.5
    assert m["segments_mean"] == 2.0 and m["segments_max"] == 3.0
    assert m["compactions_mean"] == 0.5 and m["compacted_rate"] == 0.5 and m["subagents_mean"] == 0.5
    assert m["tokens_saved_mean"] == 150.0 and m["tokens_saved_per_compaction"] == 300.0
    assert m["status/completed"] == 0.75, "statuses count every sample, as slime's trainer sees them"


# -- the sub-agent tool helper ----------------------------------------------------------------------


def test_subagent_tool_is_a_strands_tool_taking_a_task():
    tool = subagent_tool("checker", "Check an answer.", system_prompt="You check.")
    spec = tool.tool_spec
    assert spec["name"] == "checker" and spec["description"] == "Check an answer."
    assert list(spec["inputSchema"]["json"]["properties"]) == ["task"]
    with pytest.raises(ConfigurationError, match="not a valid tool name"):
        subagent_tool("check answer", "x")
    with pytest.raises(ConfigurationError, match="the description tells the model when to call it"):
        subagent_tool("checker", " ")
