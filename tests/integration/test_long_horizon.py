"""Long-horizon episodes (issue 9): context compaction and sub-agents as slime fan-out samples, through real HTTP,
the real Qwen3 tokenizer and a real Strands agent. Every segment is checked against the requests it sent and
the answers it got; slime's side (flattening, rollout ids, group normalisation, replay data) is re-derived
from slime's code where slime is not importable."""

from __future__ import annotations

import itertools
import uuid

import numpy as np
import pytest
from fanout_kit import (
    SUMMARY_MARK,
    ScriptedPolicy,
    add_call,
    assert_segments,
    forty_turns,
    requests_by_segment,
)
from rollout_tools import add, huge_output
from slime_helpers import (
    SLIME_PARAMS,
    TOP_P_PARAMS,
    Sample,
    as_array,
    make_args,
    slime_args,
    slime_group_norm,
)

from slime_strands import SGLangClient, metrics, reward, rollout
from slime_strands._slime.config import SlimeConfig
from slime_strands.agent.compaction import SUMMARY_HEADER
from slime_strands.agent.episode import EpisodeSpec, run_episode
from slime_strands.agent.record import EpisodeRecord, Termination
from slime_strands.errors import ConfigurationError
from slime_strands.reward_norm import post_process_rewards
from slime_strands.settings import PluginSettings
from slime_strands.testing import SGLangTestServer
from slime_strands.testing.invariants import assert_batch_convertible, assert_sample_invariants

pytestmark = pytest.mark.timeout(120)
S = Sample.Status

WINDOW = 1024  # the test server's context window: a 40-turn episode needs about three of them
LAYERS, TOPK = 2, 2


def settings(strategy: str = "none", **compaction) -> PluginSettings:
    data = {"tools": [], "system_prompt": "Add numbers with the add tool.", "max_tool_iters": None}
    if strategy != "none":
        data.update(context_management=strategy, compaction=compaction)
    return PluginSettings.from_mapping(data)


async def episode(
    server, tokenizer, config: PluginSettings, *, budget: int = 4096, context: int | None = None
):
    client = SGLangClient(server.base_url, retry_delay=0.01, max_retries=1)
    spec = EpisodeSpec(
        prompt="Add 1 to a number, 39 times, with the add tool.",
        sampling_params={"max_new_tokens": 256},
        max_response_tokens=budget,
        max_context_tokens=context,
    )
    return await run_episode(tokenizer, client, config, spec, tools=[add])


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=WINDOW) as srv:
        yield srv


# -- the 40-turn episode ----------------------------------------------------------------------------


async def test_forty_turns_do_not_fit_without_context_management(server, tokenizer):
    policy = ScriptedPolicy(server, tokenizer)
    policy.script(None, *forty_turns())
    record = await episode(server, tokenizer, settings())
    # The last turn either finds no room or is cut at the window's edge.
    assert record.termination in (Termination.CONTEXT_FULL, Termination.MAX_TOKENS)
    assert len(record.segments) == 1 and record.compactions == 0
    assert len(record.segments[0].trajectory) > 0.95 * WINDOW
    assert policy.left() > 10, "the window ends the episode long before its answer"
    assert_segments(server, [record.segments[0].trajectory])


@pytest.mark.parametrize("strategy", ["summarize", "sliding_window"])
async def test_forty_turn_episode_compacts_twice(server, tokenizer, strategy):
    policy = ScriptedPolicy(server, tokenizer)
    policy.script(None, *forty_turns())
    record = await episode(
        server, tokenizer, settings(strategy, **({"window_size": 6} if strategy == "sliding_window" else {}))
    )

    assert record.termination is Termination.END_TURN and policy.left() == 0
    assert [s.opened_by for s in record.segments] == ["prompt", strategy, strategy]
    assert [s.closed_by for s in record.segments] == ["compaction", "compaction", "end_turn"]
    assert [s.status for s in record.segments] == ["COMPLETED"] * 3
    assert record.compactions == 2 and all(s.kind == "main" for s in record.segments)
    trajectories = [s.trajectory for s in record.segments]
    assert sum(len(tm) for tm in trajectories) > 2 * WINDOW, "the episode holds more than two windows"
    assert all(len(tm) <= WINDOW - 6 for tm in trajectories), "each segment fits the window"
    summaries = len(policy.summaries)
    assert record.turns == 40 + summaries == sum(len(tm.turns) for tm in trajectories)
    assert summaries == (2 if strategy == "summarize" else 0)

    # Exact token-in/token-out on every segment: each request's input_ids is its segment so far, every
    # generated segment is the server's output_ids; every request is accounted for.
    assert_segments(server, trajectories)

    # Each new segment starts from the compacted conversation: the task first, re-rendered as its prompt
    # (masked: it is the prompt of its sample), and saves what the rewrite removed.
    first_prompt = tokenizer.decode(trajectories[0].token_ids[: trajectories[0].prompt_length])
    task_prefix = first_prompt.removesuffix("<|im_start|>assistant\n")
    for before, after, segment in zip(trajectories, trajectories[1:], record.segments[1:], strict=False):
        prompt = tokenizer.decode(after.token_ids[: after.prompt_length])
        assert prompt.startswith(task_prefix) and prompt.endswith("<|im_start|>assistant\n")
        assert after.loss_mask[: after.prompt_length] == [0] * after.prompt_length
        assert segment.tokens_saved == len(before) - after.prompt_length > 0
        if strategy == "summarize":
            # The summary is the closing segment's last, trained turn, and the new segment's (masked) context.
            last = before.spans[-1]
            assert last.kind == "generated" and tokenizer.decode(last.token_ids).startswith("Summary: ")
            assert set(before.loss_mask[last.start : last.end]) == {1}
            asked = tokenizer.decode(before.spans[-2].token_ids)
            assert SUMMARY_MARK in asked, "the summary request is an observation of the closing segment"
            summary = tokenizer.decode(last.token_ids[:-1])
            assert SUMMARY_HEADER in prompt and summary in prompt and '{"a": 0' not in prompt
        else:
            assert '"a": 0,' not in prompt, "the oldest tool calls are dropped"
            assert prompt.count('{"name": "add", "arguments"') == 3, "the newest calls, with their results"
    assert record.tokens_saved == sum(s.tokens_saved for s in record.segments)
    assert record.trajectory is trajectories[-1] and "\\boxed{40}" in record.response


HUGE_CALL = '<tool_call>\n{"name": "huge_output", "arguments": {"n": 40}}\n</tool_call>'


@pytest.mark.parametrize("strategy", ["none", "sliding_window", "summarize"])
async def test_a_tool_output_that_does_not_fit_opens_a_segment_that_holds_it(server, tokenizer, strategy):
    # A ~500-token tool output arrives in a half-full segment, below the trigger: without context management
    # it is shrunk to fit the room left; with context management a new segment holds it whole (summarize asks
    # for the summary before it: it is not in the closing segment, and follows the summary).
    policy = ScriptedPolicy(server, tokenizer)
    policy.script(
        None, *[add_call(i) for i in range(12)], HUGE_CALL, "It printed 40 lines.\nAnswer: \\boxed{40}"
    )
    # In this 1024-token window a new segment holds the output whole only with a small summary budget (it keeps
    # the summary's room free; the default, a sixteenth of the window, would have it shrunk to fit).
    knobs = {"window_size": 2} if strategy == "sliding_window" else {"summary_max_tokens": 32}
    config = settings(strategy, **(knobs if strategy != "none" else {}))
    record = await run_episode(
        tokenizer,
        SGLangClient(server.base_url, retry_delay=0.01, max_retries=1),
        config,
        EpisodeSpec(prompt="Add, then print 40 lines.", sampling_params={"max_new_tokens": 256}),
        tools=[add, huge_output],
    )
    assert policy.left() == 0
    assert_segments(server, [s.trajectory for s in record.segments])
    last = record.segments[-1].trajectory
    seen = tokenizer.decode(last.token_ids)
    if strategy == "none":  # squeezed in, the output leaves no room for the answer: cut by the window
        assert record.termination is Termination.CONTEXT_FULL
        assert record.compactions == 0 and record.tool_outputs_truncated == 1
        assert "line 39: " not in seen or "tool output truncated" in seen
    elif strategy == "sliding_window":
        assert record.termination is Termination.END_TURN
        assert record.compactions == 1 and record.tool_outputs_truncated == 0
        assert "line 0: " in seen and "line 39: " in seen and "truncated" not in seen
        assert record.segments[0].closed_by == "compaction"
        assert len(record.segments[0].trajectory) < 0.8 * WINDOW, "below the trigger"
    else:
        assert record.termination is Termination.END_TURN and len(policy.summaries) == 1
        assert record.compactions == 1 and record.tool_outputs_truncated == 0
        closing = tokenizer.decode(record.segments[0].trajectory.token_ids)
        assert SUMMARY_MARK in closing and "line 0: " not in closing and closing.endswith("<|im_end|>")
        assert closing.removesuffix("<|im_end|>").endswith(policy.summaries[0]), (
            "the summary is its last turn"
        )
        assert "line 0: " in seen and "line 39: " in seen and "truncated" not in seen
        assert seen.index(policy.summaries[0]) < seen.index(HUGE_CALL) < seen.index("line 0: ")


async def test_the_response_budget_share_compacts_too(tokenizer):
    with SGLangTestServer(tokenizer, context_length=32768) as server:
        policy = ScriptedPolicy(server, tokenizer)
        policy.script(None, *forty_turns())
        record = await episode(server, tokenizer, settings("summarize", trigger_share=0.5), budget=600)
        assert record.termination is Termination.END_TURN and record.compactions >= 2
        for segment in record.segments:
            assert segment.response_length <= 600
        assert_segments(server, [s.trajectory for s in record.segments])


async def test_after_max_compactions_the_episode_ends_as_without_them(server, tokenizer):
    policy = ScriptedPolicy(server, tokenizer)
    policy.script(None, *forty_turns())
    record = await episode(server, tokenizer, settings("sliding_window", max_compactions=1, window_size=6))
    assert record.termination in (Termination.CONTEXT_FULL, Termination.MAX_TOKENS)
    assert record.compactions == 1 and policy.left() > 0
    assert len(record.segments) == 2 and record.segments[-1].closed_by == record.termination.value
    assert record.segments[-1].status == "TRUNCATED"
    assert_segments(server, [s.trajectory for s in record.segments])


async def test_the_serialised_record_shows_the_segment_boundaries(server, tokenizer):
    policy = ScriptedPolicy(server, tokenizer)
    policy.script(None, *forty_turns())
    record = await episode(server, tokenizer, settings("summarize"))
    saved = EpisodeRecord.from_metadata(record.to_metadata())
    assert saved == record and [s.trajectory for s in saved.segments] == [None] * 3
    rows = record.to_metadata()["segments"]
    assert [(r["opened_by"], r["closed_by"]) for r in rows] == [
        ("prompt", "compaction"),
        ("summarize", "compaction"),
        ("summarize", "end_turn"),
    ]
    for row, segment in zip(rows, record.segments, strict=True):
        tm = segment.trajectory
        assert (row["prompt_length"], row["response_length"]) == (tm.prompt_length, tm.response_length)
        assert row["generated_tokens"] == sum(tm.loss_mask) and row["turns"] == len(tm.turns)


# -- through slime: list[Sample], rollout ids, group normalisation, replay data ----------------------


def slime_flatten(data: list) -> list:
    """slime's ``RolloutManager._get_rollout_data``: ``while isinstance(data[0], list)`` flattening."""
    while isinstance(data[0], list):
        data = list(itertools.chain.from_iterable(data))
    return data


def slime_validate_rollout_ids(node, depth: int = 0) -> None:
    """slime's ``validate_rollout_id_annotated``: a list of several samples below depth 2 (a fanned-out
    rollout) needs one shared, non-None rollout_id."""
    if isinstance(node, Sample):
        return
    assert isinstance(node, list)
    if node and isinstance(node[0], Sample):
        if depth >= 2 and len(node) > 1:
            ids = [s.rollout_id for s in node]
            assert None not in ids and len(set(ids)) == 1, ids
        return
    for item in node:
        slime_validate_rollout_ids(item, depth + 1)


def replay_segment(server: SGLangTestServer, sample, args):
    """The sample slime's own appender builds from the requests and answers of ONE segment."""
    prompt_len = len(sample.tokens) - sample.response_length
    expected = Sample(prompt=sample.prompt, tokens=list(sample.tokens[:prompt_len]))
    for request in server.generate_requests:
        if request.headers.get("x-smg-routing-key") != sample.session_id:
            continue
        sent, rid = request.body["input_ids"], request.body["rid"]
        if rid not in server.answers or sample.tokens[: len(sent)] != sent or len(sent) < prompt_len:
            continue
        ids, lps = server.answers[rid]
        between = sent[len(expected.tokens) :]
        if between:
            expected.append_response_tokens(args, tokens=between, trainable=False)
        # SGLang 0.5.23 does not echo the rows' start: tell slime's appender what was asked.
        meta = {
            "routed_experts_start_len": request.body.get("routed_experts_start_len", 0),
            **server.meta_infos[rid],
        }
        expected.append_response_tokens(args, tokens=ids, log_probs=lps, trainable=True, meta_info=meta)
    return expected


def compacting_args(server, strategy: str, **overrides):
    strands = {"tools": ["rollout_tools.add"], "max_tool_iters": None, "context_management": strategy}
    if (
        strategy == "summarize"
    ):  # the scripted summaries are ~20 tokens: keep the 1024-token window for the work
        strands["compaction"] = {"summary_max_tokens": 32}
    flags = dict(
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        n_samples_per_prompt=2,
        rollout_batch_size=2,
        custom_rm_path="slime_strands.reward.math_reward",
        custom_reward_post_process_path="slime_strands.reward_norm.post_process_rewards",
    )
    return make_args(server, strands={**strands, **overrides.pop("strands", {})}, **{**flags, **overrides})


async def test_fan_out_through_slimes_group_handling(tokenizer):
    with SGLangTestServer(tokenizer, context_length=WINDOW, routed_experts=(LAYERS, TOPK)) as server:
        policy = ScriptedPolicy(server, tokenizer)
        args = compacting_args(
            server,
            "summarize",
            rollout_top_p=0.9,
            use_rollout_routing_replay=True,
            num_layers=LAYERS,
            moe_router_topk=TOPK,
        )
        scripts = [  # per prompt, n_samples_per_prompt = 2 episodes: compacted twice, once, not at all
            [forty_turns(), [add_call(1), "Answer: \\boxed{7}"]],
            [[add_call(i) for i in range(24)] + ["Answer: \\boxed{40}"], ["Answer: \\boxed{40}"]],
        ]
        groups = []
        for g, group_scripts in enumerate(scripts):
            group = []
            for k, turns in enumerate(group_scripts):
                sample = Sample(
                    prompt="Add 1, 39 times.",
                    label="40",
                    index=2 * g + k,
                    group_index=g,
                    session_id=str(uuid.uuid4()),
                )
                policy.script(sample.session_id, *turns)
                out = await rollout.generate(args, sample, dict(TOP_P_PARAMS))
                assert isinstance(out, list) and out[-1] is sample, "training fans out: always a list"
                group.append(out)
            groups.append(group)

        # What slime does with the rollout's output: validate rollout ids, flatten by its first item.
        slime_validate_rollout_ids(groups)
        flat = slime_flatten(groups)
        assert [len(r) for g in groups for r in g] == [3, 1, 2, 1] and len(flat) == 7
        assert all(isinstance(s, Sample) for s in flat)
        assert [s.rollout_id for s in flat] == [0, 0, 0, 1, 2, 2, 3], "slime's default: the sample's index"
        # slime scores only samples whose reward is None: generate gave every segment the episode's reward,
        # so slime calls the reward function on an empty batch, which must answer an empty list.
        assert all(s.reward is not None for s in flat)
        assert await reward.math_reward(args, []) == []
        rewards = {s.rollout_id: s.reward for s in flat}
        # correct, wrong after one tool call (shaped: -1 + (1 - 2) * 0.05), correct, correct
        assert [rewards[i] for i in range(4)] == [1.0, pytest.approx(-1.05), 1.0, 1.0]
        for s in flat:
            assert s.reward == rewards[s.rollout_id], "the final reward on every segment, not divided"

        # Every segment is a full sample of its own: invariants, slime's trainer checks, slime's appender.
        assert_batch_convertible(flat, args)
        for s in flat:
            assert_sample_invariants(s)
            expected = replay_segment(server, s, args)
            assert s.tokens == expected.tokens and s.loss_mask == expected.loss_mask
            assert s.rollout_log_probs == expected.rollout_log_probs
            # real slime's appender keeps top-p data as int32 tensors, ours lists (its Sample takes both)
            for field in ("rollout_top_p_token_ids", "rollout_top_p_token_offsets"):
                assert as_array(getattr(s, field)).tolist() == as_array(getattr(expected, field)).tolist()
            assert np.array_equal(
                as_array(s.rollout_routed_experts), as_array(expected.rollout_routed_experts)
            )
            assert s.weight_versions == expected.weight_versions
            assert s.prefix_cache_info == expected.prefix_cache_info
        trajectories = {}
        for s in flat:
            tm_tokens = s.tokens
            trajectories.setdefault(s.session_id, []).append(tm_tokens)
        for s in flat:  # every answered request of a session is in exactly one of its segments
            mine = [x for x in flat if x.session_id == s.session_id]
            for request in server.generate_requests:
                if (
                    request.headers.get("x-smg-routing-key") == s.session_id
                    and request.body["rid"] in server.answers
                ):
                    sent = request.body["input_ids"]
                    assert (
                        sum(
                            x.tokens[: len(sent)] == sent and len(sent) >= len(x.tokens) - x.response_length
                            for x in mine
                        )
                        == 1
                    )

        # The summary is trained in the segment that wrote it and context (masked) in the next one.
        first = [s for s in flat if s.rollout_id == 0]
        records = [EpisodeRecord.of(s) for s in first]
        assert [r.segment for r in records] == [0, 1, 2] and records[-1].compactions == 2
        for before, after in itertools.pairwise(first):
            trained = tokenizer.decode(
                [
                    t
                    for t, m in zip(before.tokens[-before.response_length :], before.loss_mask, strict=True)
                    if m
                ]
            )
            assert policy.summaries[records.index(EpisodeRecord.of(before))] in trained
            prompt = tokenizer.decode(after.tokens[: len(after.tokens) - after.response_length])
            assert policy.summaries[records.index(EpisodeRecord.of(before))] in prompt

        # Group normalisation: each rollout counts once and every segment gets its rollout's advantage,
        # exactly what slime's default gives a batch of one sample per rollout.
        raw, advantages = post_process_rewards(args, flat)
        assert raw == [s.reward for s in flat]
        finals = [s for s in flat if EpisodeRecord.of(s).closes_episode]
        assert [s.rollout_id for s in finals] == [0, 1, 2, 3]
        _, per_rollout = slime_group_norm(args, finals)
        for s, advantage in zip(flat, advantages, strict=True):
            assert advantage == pytest.approx(per_rollout[s.rollout_id], abs=1e-6)
        # slime's default path on the fanned-out batch: 7 samples != 2 x 2, so ONE group of 7, and a
        # compacted episode weighs once per segment: not the per-prompt advantages. Hence the flag check.
        _, default = slime_group_norm(args, flat)
        assert default != pytest.approx(advantages, abs=1e-3)
        with pytest.raises(
            ConfigurationError, match=r"--custom-reward-post-process-path slime_strands\.reward_norm"
        ):
            SlimeConfig.of(
                slime_args(**{**vars(args), "custom_reward_post_process_path": None})
            ).check_fanout()

        # Metrics count episodes once (from their last segment), slime's statuses per sample.
        m = metrics.aggregate(flat)
        assert m["samples"] == 4.0 and m["segments_max"] == 3.0 and m["segments_mean"] == 7 / 4
        assert m["compactions_mean"] == 3 / 4 and m["compacted_rate"] == 0.5
        assert (
            m["tokens_saved_mean"] > 0 and m["tokens_saved_per_compaction"] == m["tokens_saved_mean"] * 4 / 3
        )
        assert m["status/completed"] == 1.0 and m["subagents_mean"] == 0.0


async def test_without_compaction_slimes_default_path_is_unchanged(tokenizer):
    # Fanning out with nothing compacted gives lists of one sample: slime's default normalisation is then
    # exactly what it was, and so is ours.
    with SGLangTestServer(tokenizer, context_length=8192) as server:
        args = compacting_args(server, "sliding_window")
        flat = []
        for i, answer in enumerate(["Answer: \\boxed{40}", "Answer: 3", "Answer: \\boxed{40}", "no idea"]):
            sample = Sample(
                prompt="Add.", label="40", index=i, group_index=i // 2, session_id=str(uuid.uuid4())
            )
            server.script(answer, key=sample.session_id)
            out = await rollout.generate(args, sample, dict(SLIME_PARAMS))
            assert isinstance(out, list) and len(out) == 1 and out[0].rollout_id == i
            assert EpisodeRecord.of(out[0]).segment is None
            flat += out
        raw, ours = post_process_rewards(args, flat)
        slime_raw, theirs = slime_group_norm(args, flat)
        assert raw == slime_raw and ours == pytest.approx(theirs, abs=1e-6)


async def test_eval_returns_the_last_segment_only(tokenizer):
    with SGLangTestServer(tokenizer, context_length=WINDOW) as server:
        policy = ScriptedPolicy(server, tokenizer)
        args = compacting_args(server, "summarize")
        sample = Sample(prompt="Add 1, 39 times.", label="40", index=0, session_id=str(uuid.uuid4()))
        policy.script(sample.session_id, *forty_turns())
        out = await rollout.generate(args, sample, dict(SLIME_PARAMS), evaluation=True)
        assert out is sample and out.reward is None, "one sample per attempt; slime scores it"
        record = EpisodeRecord.of(out)
        assert record.compactions == 2 and record.segment == 2 and record.evaluation
        assert "\\boxed{40}" in out.response and out.response_length == record.segments[-1].response_length
        assert await reward.accuracy(args, out) == 1.0


async def test_slime_flags_that_cannot_take_lists(server):
    args = compacting_args(server, "summarize", group_rm=True)
    with pytest.raises(ConfigurationError, match="--group-rm"):
        await rollout.generate(args, Sample(prompt="x", index=0), dict(SLIME_PARAMS))
    assert not server.generate_requests, "refused before any episode ran"


async def test_a_reward_function_that_raises_fails_the_episode_not_the_step(tokenizer, caplog):
    with SGLangTestServer(tokenizer, context_length=WINDOW) as server:
        policy = ScriptedPolicy(server, tokenizer)
        args = compacting_args(server, "summarize", custom_rm_path="rollout_tools.broken_reward")
        sample = Sample(prompt="Add 1, 39 times.", label="40", index=5, session_id=str(uuid.uuid4()))
        policy.script(sample.session_id, *forty_turns())
        out = await rollout.generate(args, sample, dict(SLIME_PARAMS))
    assert out == [sample] and sample.status == S.FAILED and sample.remove_sample and sample.reward == 0.0
    assert sample.rollout_id == 5 and sample.response_length == 1
    assert EpisodeRecord.of(sample).error == "reward function: RuntimeError: grader down"
    assert "the reward function failed" in caplog.text


# -- sub-agents ------------------------------------------------------------------------------------


CALL_HELPER = '<tool_call>\n{"name": "helper", "arguments": {"task": "Add 2 and 3."}}\n</tool_call>'
CALL_ADD = add_call(2, 3)


@pytest.mark.parametrize("collect", [True, False])
async def test_subagent_episode(tokenizer, collect):
    with SGLangTestServer(tokenizer, context_length=8192) as server:
        args = compacting_args(
            server,
            "none",
            strands={"tools": ["rollout_tools.add", "rollout_tools.helper"], "collect_subagents": collect},
        )
        sample = Sample(
            prompt="What is 2+3? Ask the helper.", label="5", index=3, session_id=str(uuid.uuid4())
        )
        # The main agent calls the helper; the helper calls add and answers; the main agent answers.
        server.script(CALL_HELPER, CALL_ADD, "The sum is 5.", "Answer: \\boxed{5}", key=sample.session_id)
        out = await rollout.generate(args, sample, dict(SLIME_PARAMS))
        requests = server.generate_requests
        assert len(requests) == 4 and all(
            r.headers["x-smg-routing-key"] == sample.session_id for r in requests
        )
        if not collect:
            assert isinstance(out, list) is False and out is sample, "no fan-out: one Sample, as before"
            record = EpisodeRecord.of(out)
            assert record.subagents == 0 and len(record.segments) == 1 and record.turns == 2
            return
        sub, main = out
        assert main is sample and sub.rollout_id == main.rollout_id == 3
        assert sub.reward == main.reward == 1.0
        records = [EpisodeRecord.of(s) for s in out]
        assert [r.segment for r in records] == [0, 1]
        assert [(s.kind, s.name, s.opened_by, s.closed_by) for s in records[-1].segments] == [
            ("subagent", "helper", "subagent", "end_turn"),
            ("main", "", "prompt", "end_turn"),
        ]
        assert records[-1].turns == 4 and records[-1].subagents == 1
        sub_prompt = tokenizer.decode(sub.tokens[: len(sub.tokens) - sub.response_length])
        assert (
            "You add numbers" in sub_prompt
            and "Add 2 and 3." in sub_prompt
            and "Ask the helper" not in sub_prompt
        )
        assert "The sum is 5." in sub.response and "\\boxed{5}" in main.response
        tool_result = tokenizer.decode(main.tokens)
        assert "<tool_response>\nThe sum is 5.\n</tool_response>" in tool_result, "the sub-agent's answer"
        for s in out:
            assert_sample_invariants(s)
            expected = replay_segment(server, s, args)
            assert (s.tokens, s.loss_mask, s.rollout_log_probs) == (
                expected.tokens,
                expected.loss_mask,
                expected.rollout_log_probs,
            )
        # Through the episode API: the invariants on each segment against its own requests.
        server.requests.clear()
        server.script(CALL_HELPER, CALL_ADD, "The sum is 5.", "Answer: \\boxed{5}")
        client = SGLangClient(server.base_url, retry_delay=0.01, max_retries=1)
        config = PluginSettings.from_mapping({"tools": [], "collect_subagents": True})
        from rollout_tools import helper

        record = await run_episode(
            tokenizer,
            client,
            config,
            EpisodeSpec(prompt="What is 2+3?", sampling_params={"max_new_tokens": 256}),
            tools=[add, helper],
        )
        trajectories = [s.trajectory for s in record.segments]
        assert len(trajectories) == 2 and [len(r) for r in requests_by_segment(server, trajectories)] == [
            2,
            2,
        ]
        assert_segments(server, trajectories)


async def test_a_subagent_inside_a_compacted_episode(server, tokenizer):
    from rollout_tools import helper

    policy = ScriptedPolicy(server, tokenizer)
    policy.script(
        None, CALL_HELPER, CALL_ADD, "The sum is 5.", *[add_call(i) for i in range(24)], "Answer: 5"
    )
    config = PluginSettings.from_mapping(
        {"tools": [], "max_tool_iters": None, "context_management": "summarize", "collect_subagents": True}
    )
    record = await run_episode(
        tokenizer,
        SGLangClient(server.base_url, retry_delay=0.01, max_retries=1),
        config,
        EpisodeSpec(prompt="What is 2+3? Ask the helper, then add.", sampling_params={"max_new_tokens": 256}),
        tools=[add, helper],
    )
    assert record.termination is Termination.END_TURN and policy.left() == 0
    # The sub-agent closed first (inside the main agent's first segment), then each compaction, then the end.
    compactions = len(policy.summaries)
    assert compactions >= 1 and record.compactions == compactions
    assert [(s.kind, s.opened_by, s.closed_by) for s in record.segments] == [
        ("subagent", "subagent", "end_turn"),
        ("main", "prompt", "compaction"),
        *[("main", "summarize", "compaction")] * (compactions - 1),
        ("main", "summarize", "end_turn"),
    ]
    assert record.turns == 2 + 26 + compactions and record.subagents == 1
    assert_segments(server, [s.trajectory for s in record.segments])


async def test_a_compacted_episode_is_one_trajectory_row_with_a_segment_per_window(server, tokenizer):
    """`slime-strands eval` writes what generate trains on: one token segment per context window, each the
    segment's exact trajectory, with what the episode record says of it (shown by `inspect`)."""
    from slime_strands.cli.eval.data import EvalPrompt
    from slime_strands.cli.eval.rows import episode_row
    from slime_strands.trajectories.file import TrajectoryRow

    policy = ScriptedPolicy(server, tokenizer)
    policy.script(None, *forty_turns())
    record = await episode(server, tokenizer, settings("sliding_window", window_size=6))
    prompt = EvalPrompt(0, 1, [{"role": "user", "content": "Add 1 to a number."}], "40", "long")
    row = episode_row(prompt, 0, record, 1.0, tokenizer="qwen3", tools=None, chat_template_kwargs={})
    row = TrajectoryRow.from_json(row.to_json())  # what the file holds
    assert len(row.segments) == len(record.segments) == 3
    for saved, segment in zip(row.segments, record.segments, strict=True):
        tm = segment.trajectory
        assert (saved.token_ids, saved.loss_mask, saved.logprobs) == (tm.token_ids, tm.loss_mask, tm.logprobs)
        assert saved.info["opened_by"] == segment.opened_by and saved.info["closed_by"] == segment.closed_by
    assert [s.info["closed_by"] for s in row.segments] == ["compaction", "compaction", "end_turn"]
