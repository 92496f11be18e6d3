"""Partial rollout (issue 27): an episode slime aborts continues where it stopped at the next step, token for
token, through ``rollout.generate`` with slime's abort flag, real HTTP, the real Qwen3 tokenizer and a real
Strands agent. Every continued sample is compared with the same episode run straight through (the scripted
policy answers both the same), and checked against every request and answer of its session.

slime's real rollout loop (``generate_rollout_async`` / ``abort()``) drives the same episodes in
test_partial_rollout_slime.py.
"""

from __future__ import annotations

import asyncio
import copy
import json
import pickle
import types
from typing import Any

import partial_tools
import pytest
from fanout_kit import SUMMARY_MARK, add_call
from partial_kit import LAYERS, TOPK, ContinuingPolicy, assert_same_episode, partial_args, wait_until
from partial_tools import HOLD, call
from slime_helpers import (
    TOP_P_PARAMS,
    Sample,
    install_generate_state,
    new_sample,
    record,
    session_requests,
)

from slime_strands import SGLangClient, SGLangModel, metrics, rollout
from slime_strands._slime.partial_rollout import CHECKPOINT_KEY, EpisodeSamples
from slime_strands.agent.checkpoint import EpisodeCheckpoint
from slime_strands.agent.record import Termination
from slime_strands.provider.checkpoint import ModelCheckpoint, PendingTurn
from slime_strands.provider.model_stats import ModelStats, TurnCut
from slime_strands.provider.token_manager import TokenManager, TurnInfo
from slime_strands.testing import SGLangTestServer, Turn
from slime_strands.testing.invariants import assert_batch_convertible, assert_sample_matches_server

pytestmark = pytest.mark.timeout(120)
S = Sample.Status
ANSWER = "The sum is 5.\nAnswer: \\boxed{5}"
SLOW = call("slow_add", a=2, b=3)
ADD = call("add_then_abort", a=2, b=3)
CALL_HELPER = call("helper", task="Add 2 and 3.")


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=8192, routed_experts=(LAYERS, TOPK)) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _tools():
    HOLD.update(on=False, started=0, finished=0)
    yield
    HOLD["on"] = False
    partial_tools.FLAG["state"] = None


def args_for(server, *, mask=False, tools=("partial_tools.slow_add", "partial_tools.add_then_abort")):
    return partial_args(server, mask=mask, tools=tools)


async def aborted_run(server, args, sample, state, *, until):
    """generate() until ``until()`` holds, then slime's abort: the flag, then every worker's requests."""
    task = asyncio.create_task(rollout.generate(args, sample, dict(TOP_P_PARAMS)))
    await wait_until(lambda: until() or task.done())
    state.aborted = True
    await SGLangClient(server.base_url).abort()
    out = await task
    state.aborted = False  # the next rollout step
    return out


def through_the_buffer(sample):
    """What slime's buffer and a Ray hop leave of a sample: a pickled copy whose checkpoint is plain JSON."""
    assert json.loads(json.dumps(sample.metadata[CHECKPOINT_KEY])) == sample.metadata[CHECKPOINT_KEY]
    return pickle.loads(pickle.dumps(sample))


async def reference(server, policy, args, turns):
    """The same episode straight through: no hold, no abort."""
    sample = new_sample()
    policy.script(sample.session_id, *turns)
    out = await rollout.generate(args, sample, dict(TOP_P_PARAMS))
    assert out.status == S.COMPLETED
    return out


# -- one abort, every place it can land ------------------------------------------------------------------

CASES = {
    # where: (turns, hold (turn, mode) or None, tool held, what to wait for)
    "mid_generation": ((SLOW, SLOW, ANSWER), (2, "running"), False),
    "queued_before_a_token": ((SLOW, SLOW, ANSWER), (2, "queued"), False),
    "during_a_tool_run": ((SLOW, SLOW, ANSWER), None, True),
    "after_a_turn_before_its_tools": ((SLOW, SLOW, ANSWER), (2, "then_abort"), False),
    "a_tool_ending_as_slime_aborts": ((ADD, SLOW, ANSWER), None, False),
}


@pytest.mark.parametrize("mask", [False, True], ids=["trained", "masked"])
@pytest.mark.parametrize("where", CASES)
async def test_a_continued_episode_is_the_uninterrupted_one(server, tokenizer, monkeypatch, where, mask):
    turns, hold, tool_held = CASES[where]
    state = install_generate_state(monkeypatch, tokenizer)
    partial_tools.FLAG["state"] = state
    policy = ContinuingPolicy(server, tokenizer)
    policy.on_hold = lambda: setattr(state, "aborted", True)
    args = args_for(server, mask=mask)
    sample = new_sample()
    policy.script(sample.session_id, *turns)
    if hold is not None:
        policy.hold(sample.session_id, *hold)
    HOLD["on"] = tool_held

    out = await aborted_run(
        server,
        args,
        sample,
        state,
        until=lambda: (
            policy.parked(sample.session_id)
            if hold and hold[1] in ("running", "queued")
            else HOLD["started"] > 0
            if tool_held
            else False
        ),
    )
    assert out is sample and out.status == S.ABORTED and out.reward is None
    assert record(out).termination is Termination.ABORTED and out.response, "slime marks it start_rollout_id"
    saved = EpisodeCheckpoint.from_data(out.metadata[CHECKPOINT_KEY])
    cut_at = list(out.tokens)
    assert saved.trajectory.rebuild().token_ids == cut_at, "the aborted sample holds the saved trajectory"
    asked = len(session_requests(server, sample))

    HOLD["on"], partial_tools.FLAG["state"] = False, None  # the next step: nothing aborts it
    sample = through_the_buffer(out)
    out = await rollout.generate(args, sample, dict(TOP_P_PARAMS))
    assert out.status == S.COMPLETED and CHECKPOINT_KEY not in out.metadata
    first = session_requests(server, sample)[asked].body["input_ids"]
    if where in ("mid_generation", "queued_before_a_token"):
        assert first == cut_at, "the next request continues the cut turn from the saved trajectory"
    else:
        assert first[: len(cut_at)] == cut_at and len(first) > len(cut_at), "saved trajectory + tool results"
    if where == "during_a_tool_run":
        assert (HOLD["started"], HOLD["finished"]) == (3, 2), "the killed call ran again, then the next one"
    if where == "a_tool_ending_as_slime_aborts":
        assert HOLD["started"] == 3, "its result may be the abort's doing: the call ran again, then slow_add"

    seam = len(cut_at) - (len(out.tokens) - out.response_length)
    assert_sample_matches_server(
        out, server, routing_key=sample.session_id, masked_before=seam if mask else 0
    )
    assert_batch_convertible([out], args)
    expected = await reference(server, policy, args, turns)
    assert_same_episode(out, expected, masked_before=seam if mask else 0)
    rec = record(out)
    assert rec.continuations == 1 and rec.turns_saved == saved.turns > 0 and rec.regenerations == 1
    masked = sum(expected.loss_mask[:seam])
    assert rec.offpolicy_masked_tokens == (masked if mask else 0)
    assert record(out).segments[-1].carried_tokens == len(cut_at)
    logged = metrics.aggregate([out, expected])
    assert logged["continued_episodes"] == 1.0 and logged["turns_saved"] == saved.turns


async def test_a_grammar_constrained_turn_cut_mid_generation_is_asked_again(server, tokenizer, monkeypatch):
    """Under a grammar (here ``regex``) SGLang constrains each request's output from its first token, so a
    turn cut mid-generation cannot be continued inside its partial output (the real server writes the whole
    constrained text again after it: tests/real_sglang). Its partial output is not kept: the checkpoint ends
    on the turn's input, and the next request asks the turn again with its whole budget."""
    state = install_generate_state(monkeypatch, tokenizer)
    policy = ContinuingPolicy(server, tokenizer)
    args = partial_args(
        server,
        mask=True,
        tools=("partial_tools.slow_add",),
        strands={"sampling_params": {"regex": "(.|\\n)*"}},
    )
    turns = (SLOW, SLOW, ANSWER)
    sample = new_sample()
    policy.script(sample.session_id, *turns)
    policy.hold(sample.session_id, 2, "running")
    out = await aborted_run(server, args, sample, state, until=lambda: policy.parked(sample.session_id))
    (*_, cut) = session_requests(server, sample)
    assert server.answers[cut.body["rid"]][0], "the server answered the abort with a partial output"
    saved = EpisodeCheckpoint.from_data(out.metadata[CHECKPOINT_KEY])
    assert saved.trajectory.rebuild().token_ids == list(out.tokens) == cut.body["input_ids"], (
        "the sample and its checkpoint end on the cut turn's input"
    )
    done = await rollout.generate(args, through_the_buffer(out), dict(TOP_P_PARAMS))
    again = session_requests(server, done)[2]
    assert again.body["input_ids"] == cut.body["input_ids"] and again.body["sampling_params"]["regex"]
    assert again.body["sampling_params"]["max_new_tokens"] == cut.body["sampling_params"]["max_new_tokens"]
    seam = len(cut.body["input_ids"]) - (len(done.tokens) - done.response_length)
    assert_sample_matches_server(done, server, routing_key=done.session_id, masked_before=seam)
    assert_same_episode(done, await reference(server, policy, args, turns), masked_before=seam)


async def test_a_sample_continued_twice(server, tokenizer, monkeypatch):
    state = install_generate_state(monkeypatch, tokenizer)
    policy = ContinuingPolicy(server, tokenizer)
    args = args_for(server, mask=True)
    turns = (SLOW, SLOW, SLOW, ANSWER)
    sample = new_sample()
    policy.script(sample.session_id, *turns)
    policy.hold(sample.session_id, 2, "running")
    policy.hold(sample.session_id, 4, "running")
    out = await aborted_run(server, args, sample, state, until=lambda: policy.parked(sample.session_id))
    assert out.status == S.ABORTED
    out = await aborted_run(
        server, args, through_the_buffer(out), state, until=lambda: policy.parked(sample.session_id)
    )
    assert out.status == S.ABORTED and record(out).continuations == 1
    second_cut = len(out.tokens)
    out = await rollout.generate(args, through_the_buffer(out), dict(TOP_P_PARAMS))
    assert out.status == S.COMPLETED
    rec = record(out)
    assert rec.continuations == 2 and rec.turns_saved == 2 + 4, "2 turns saved, then 4 (3 done + the cut one)"
    seam = second_cut - (len(out.tokens) - out.response_length)
    assert_sample_matches_server(out, server, routing_key=out.session_id, masked_before=seam)
    assert_same_episode(out, await reference(server, policy, args, turns), masked_before=seam)
    assert metrics.aggregate([out])["continued_more_than_once"] == 1.0


async def test_a_sample_aborted_again_before_it_goes_on_stays_as_it_was(server, tokenizer, monkeypatch):
    """slime hands a recycled sample back while its abort flag is already up (a step that ends at once): the
    episode does not go on, and the sample keeps the cut trajectory and the same checkpoint (no continuation
    counted); the next step continues it as if that step had not been."""
    state = install_generate_state(monkeypatch, tokenizer)
    policy = ContinuingPolicy(server, tokenizer)
    args = args_for(server, mask=True)
    turns = (SLOW, SLOW, ANSWER)
    sample = new_sample()
    policy.script(sample.session_id, *turns)
    policy.hold(sample.session_id, 2, "running")
    out = await aborted_run(server, args, sample, state, until=lambda: policy.parked(sample.session_id))
    saved, cut_at, asked = out.metadata[CHECKPOINT_KEY], list(out.tokens), len(server.generate_requests)

    state.aborted = True
    again = await rollout.generate(args, through_the_buffer(out), dict(TOP_P_PARAMS))
    state.aborted = False
    assert again.status == S.ABORTED and len(server.generate_requests) == asked, "nothing was sent"
    assert list(again.tokens) == cut_at and again.response_length == out.response_length
    assert again.rollout_log_probs == out.rollout_log_probs and again.loss_mask == out.loss_mask
    assert again.metadata[CHECKPOINT_KEY] == saved, "the same checkpoint, counts included"
    assert record(again).continuations == 0 and record(again).turns_saved == 0

    done = await rollout.generate(args, through_the_buffer(again), dict(TOP_P_PARAMS))
    assert done.status == S.COMPLETED and record(done).continuations == 1
    seam = len(cut_at) - (len(done.tokens) - done.response_length)
    assert_sample_matches_server(done, server, routing_key=done.session_id, masked_before=seam)
    assert_same_episode(done, await reference(server, policy, args, turns), masked_before=seam)


async def test_the_abort_flag_alone_aborts_the_turn_in_flight_by_its_exact_id(server, tokenizer, monkeypatch):
    """Nobody aborts the server (a router that kept a request slime sent late, or a caller's own flag): the
    flag alone aborts the episode's request in flight by its exact id, so the turn ends at once with the
    tokens written so far (kept and continued), and another trajectory's request on the server runs on."""
    state = install_generate_state(monkeypatch, tokenizer)
    policy = ContinuingPolicy(server, tokenizer)
    args = args_for(server)
    turns = (SLOW, SLOW, ANSWER)
    sample = new_sample()
    policy.script(sample.session_id, *turns)
    policy.hold(sample.session_id, 2, "running")
    policy.script("other", "Another trajectory's turn, still being written.")
    policy.hold("other", 1, "running")
    client = SGLangClient(server.base_url)
    other = asyncio.create_task(client.generate([1, 2, 3], {"max_new_tokens": 64}, routing_key="other"))
    episode = asyncio.create_task(rollout.generate(args, sample, dict(TOP_P_PARAMS)))
    await wait_until(lambda: policy.parked(sample.session_id) and policy.parked("other"))
    (held,) = [r.body["rid"] for r in session_requests(server, sample)][-1:]
    state.aborted = True
    out = await episode
    state.aborted = False
    assert out.status == S.ABORTED and server.aborted_rids == [held], "its own request, by its exact id"
    assert not other.done() and len(server.in_flight) == 1
    assert server.meta_infos[held]["finish_reason"]["type"] == "abort" and server.answers[held][0]
    cut_at = list(out.tokens)
    assert cut_at[-len(server.answers[held][0]) :] == server.answers[held][0], "the partial output is kept"
    await client.abort()
    assert (await other).finish_reason == "abort"
    await client.aclose()

    asked = len(session_requests(server, sample))
    done = await rollout.generate(args, through_the_buffer(out), dict(TOP_P_PARAMS))
    assert done.status == S.COMPLETED
    assert session_requests(server, sample)[asked].body["input_ids"] == cut_at, "the cut turn is continued"
    assert_sample_matches_server(done, server, routing_key=done.session_id)
    assert_same_episode(done, await reference(server, policy, args, turns))


async def test_a_sample_continued_on_a_restarted_server(tokenizer, monkeypatch):
    """The server restarts between the steps with new weights: the continuation is sent to the new server,
    whose answers carry the new weight version; everything else is as if nothing had happened."""
    state = install_generate_state(monkeypatch, tokenizer)
    with SGLangTestServer(tokenizer, routed_experts=(LAYERS, TOPK), weight_version="0") as old:
        policy = ContinuingPolicy(old, tokenizer)
        sample = new_sample()
        policy.script(sample.session_id, SLOW, SLOW, ANSWER)
        policy.hold(sample.session_id, 2, "running")
        out = await aborted_run(
            old, args_for(old), sample, state, until=lambda: policy.parked(sample.session_id)
        )
        old_requests = session_requests(old, sample)
    assert out.status == S.ABORTED
    with SGLangTestServer(tokenizer, routed_experts=(LAYERS, TOPK), weight_version="1") as new:
        policy.move_to(new)
        args = args_for(new)
        out = await rollout.generate(args, through_the_buffer(out), dict(TOP_P_PARAMS))
        assert out.status == S.COMPLETED
        assert session_requests(new, sample)[0].body["input_ids"] == list(
            out.tokens[: len(session_requests(new, sample)[0].body["input_ids"])]
        )
        assert out.weight_versions == ["0", "0", "1", "1"], (
            "turn 1, the cut part of turn 2, then the new policy"
        )
        assert len(old_requests) == 2
        expected = await reference(new, policy, args, (SLOW, SLOW, ANSWER))
    assert_same_episode(out, expected)


# -- fan-out: compaction and sub-agents --------------------------------------------------------------------

WINDOW = 1024  # a 16-turn episode compacts about once
SIXTEEN = tuple([add_call(i) for i in range(15)] + ["All 15 additions are done.\nAnswer: \\boxed{16}"])


def fanout_args(server, **strands):
    return partial_args(
        server, mask=True, tools=("rollout_tools.add", "rollout_tools.helper"), strands=strands
    )


def segment_requests(server, key, sample):
    """The requests of ``key`` whose input is a prefix of ``sample``'s tokens holding its prompt."""
    prompt_len = len(sample.tokens) - sample.response_length
    return [
        r
        for r in session_requests(server, types.SimpleNamespace(session_id=key))
        if len(r.body["input_ids"]) >= prompt_len
        and sample.tokens[: len(r.body["input_ids"])] == r.body["input_ids"]
    ]


def assert_same_segments(server, continued, reference, key):
    """Segment by segment, the continued episode's samples are the reference's; tokens written before the
    seam (closed segments whole, the cut one up to the cut) are masked, and each checks against its requests."""
    assert isinstance(continued, EpisodeSamples) and len(continued) == len(reference) > 1
    rec = record(continued[-1])
    for sample, expected, segment in zip(continued, reference, rec.segments, strict=True):
        prompt_len = len(sample.tokens) - sample.response_length
        masked = max(0, min(sample.response_length, segment.carried_tokens - prompt_len))
        assert_same_episode(sample, expected, masked_before=masked)
        assert_sample_matches_server(
            sample, server, masked_before=masked, requests=segment_requests(server, key, sample)
        )
        assert sample.rollout_id == continued[-1].rollout_id and sample.reward == expected.reward == 1.0, (
            "every segment gets the episode's reward"
        )
    assert_batch_convertible(list(continued), fanout_args(server))
    return rec


HUGE = call("huge_output", n=40)  # ~500 tokens: in a half-full segment it does not fit, and compacts
OVERFLOWING = (*(add_call(i) for i in range(12)), HUGE, "It printed 40 lines.\nAnswer: \\boxed{40}")


@pytest.mark.parametrize(
    ("where", "offset", "mode", "turns", "trigger", "overflowed"),
    [
        # the segment reaches trigger_share: the summary is asked after the newest tool result
        ("the summary turn", 0, "running", SIXTEEN, 0.6, False),
        # the next turn would not leave the summary's room: it compacts first (asked before the result)
        ("the summary turn", 0, "running", SIXTEEN, 0.8, True),
        ("the summary turn", 0, "running", OVERFLOWING, 0.8, True),  # asked when a tool output did not fit
        ("the first turn after the compaction", 1, "running", SIXTEEN, 0.6, None),
        ("before the first call after the compaction", 0, "then_abort", SIXTEEN, 0.6, None),
    ],
    ids=["summary", "summary-compacting-first", "summary-after-an-overflow", "after", "before-the-next-call"],
)
async def test_a_compacting_episode_continues_across_its_segments(
    tokenizer, monkeypatch, where, offset, mode, turns, trigger, overflowed
):
    state = install_generate_state(monkeypatch, tokenizer)
    label = turns[-1].rsplit("{", 1)[1].rstrip("}")
    with SGLangTestServer(tokenizer, context_length=WINDOW, routed_experts=(LAYERS, TOPK)) as server:
        policy = ContinuingPolicy(server, tokenizer, summary_mark=SUMMARY_MARK)
        policy.on_hold = lambda: setattr(state, "aborted", True)
        args = fanout_args(server, context_management="summarize", compaction={"trigger_share": trigger})
        if turns is OVERFLOWING:  # a short prompt: the segment is half full when the big output comes
            args.strands.update(
                system_prompt="Add.", tools=["rollout_tools.add", "rollout_tools.huge_output"]
            )
        ref = new_sample(index=0)
        ref.label = label
        policy.script(ref.session_id, *turns)
        expected = await rollout.generate(args, ref, dict(TOP_P_PARAMS))
        summary_turn = policy.summary_turns[ref.session_id][0]

        sample = new_sample(index=1)
        sample.label = label
        policy.script(sample.session_id, *turns)
        policy.hold(sample.session_id, summary_turn + offset, mode)
        out = await aborted_run(server, args, sample, state, until=lambda: policy.parked(sample.session_id))
        assert out is sample and out.status == S.ABORTED, "an aborted fanned-out episode is one Sample"
        saved = EpisodeCheckpoint.from_data(out.metadata[CHECKPOINT_KEY])
        assert saved.compaction_pending is overflowed, "a cut compaction is pending, with its overflowed flag"
        assert len(saved.closed) == (0 if where == "the summary turn" else 1)

        continued = await rollout.generate(args, through_the_buffer(out), dict(TOP_P_PARAMS))
        rec = assert_same_segments(server, continued, expected, sample.session_id)
    assert rec.continuations == 1 and rec.compactions == record(expected[-1]).compactions
    carried = [s.carried_tokens for s in rec.segments]
    if where == "the summary turn":
        assert 0 < carried[0] < len(continued[0].tokens) and carried[1:] == [0] * (len(carried) - 1)
    else:  # the closed segment was written before the seam, whole; the open one up to the cut
        assert carried[0] == len(continued[0].tokens)
        assert (carried[1] > 0) == (where == "the first turn after the compaction")


async def test_a_cut_turn_that_crosses_the_trigger_is_continued_before_any_compaction(tokenizer, monkeypatch):
    """The abort cuts turn 8 mid-generation, and its input with the partial output fills the segment past
    ``trigger_share``: the uninterrupted episode compacts only after that turn, so the continuation must first
    finish the turn (the trajectory it continues) and compact before the next one, as the reference did."""
    state = install_generate_state(monkeypatch, tokenizer)
    cut = 8
    with SGLangTestServer(tokenizer, context_length=WINDOW, routed_experts=(LAYERS, TOPK)) as server:
        policy = ContinuingPolicy(server, tokenizer)
        policy.on_hold = lambda: setattr(state, "aborted", True)
        probe = new_sample(index=0)  # where turn 8 starts and how long it is, without compacting
        policy.script(probe.session_id, *SIXTEEN)
        await rollout.generate(args := fanout_args(server), probe, dict(TOP_P_PARAMS))
        turn = session_requests(server, probe)[cut - 1]
        written = len(server.answers[turn.body["rid"]][0]) - 1  # the policy's tokens, without the end token
        at_cut = len(turn.body["input_ids"]) + written // 2  # the stand-in pauses half way
        trigger = at_cut / WINDOW
        args = fanout_args(server, context_management="sliding_window", compaction={"trigger_share": trigger})

        ref = new_sample(index=1)
        ref.label = "16"
        policy.script(ref.session_id, *SIXTEEN)
        expected = await rollout.generate(args, ref, dict(TOP_P_PARAMS))
        assert len(expected) > 1 and len(expected[0].tokens) > at_cut, "it compacts first after turn 8"

        sample = new_sample(index=2)
        sample.label = "16"
        policy.script(sample.session_id, *SIXTEEN)
        policy.hold(sample.session_id, cut, "running")
        out = await aborted_run(server, args, sample, state, until=lambda: policy.parked(sample.session_id))
        assert out.status == S.ABORTED and len(out.tokens) == at_cut, "cut half way through turn 8"
        continued = await rollout.generate(args, through_the_buffer(out), dict(TOP_P_PARAMS))
        rec = assert_same_segments(server, continued, expected, sample.session_id)
    assert rec.continuations == 1 and rec.compactions == record(expected[-1]).compactions


async def test_a_subagent_running_at_the_abort_runs_again(tokenizer, monkeypatch):
    """The helper's sub-agent is generating when slime aborts: its tool call is killed (the sub-agent with
    it) and runs again when the episode continues; the collected sub-agent segment is the uninterrupted one."""
    state = install_generate_state(monkeypatch, tokenizer)
    helper_turns = (CALL_HELPER, add_call(2, 3), "The sum is 5.", ANSWER)
    with SGLangTestServer(tokenizer, routed_experts=(LAYERS, TOPK)) as server:
        policy = ContinuingPolicy(server, tokenizer)
        args = fanout_args(server, collect_subagents=True)
        ref = new_sample(index=0)
        policy.script(ref.session_id, *helper_turns)
        expected = await rollout.generate(args, ref, dict(TOP_P_PARAMS))
        assert [record(s).segments[i].kind for i, s in enumerate(expected)] == ["subagent", "main"]

        sample = new_sample(index=1)
        policy.script(sample.session_id, *helper_turns)
        policy.hold(sample.session_id, 3, "running")  # the sub-agent's second turn
        out = await aborted_run(server, args, sample, state, until=lambda: policy.parked(sample.session_id))
        assert out.status == S.ABORTED
        saved = EpisodeCheckpoint.from_data(out.metadata[CHECKPOINT_KEY])
        assert saved.closed == () and saved.messages[-1]["role"] == "assistant", "the helper call runs again"
        policy.script(sample.session_id, *helper_turns[1:])  # the sub-agent runs again from its start
        continued = await rollout.generate(args, through_the_buffer(out), dict(TOP_P_PARAMS))
        rec = assert_same_segments(server, continued, expected, sample.session_id)
    assert rec.subagents == 1 and rec.tool_calls == 1


# -- the sandbox, and a turn the abort left no room -----------------------------------------------------


async def test_a_sandbox_run_in_flight_at_the_abort_is_killed_and_runs_again(server, tokenizer, monkeypatch):
    """The model's code is running in the sandbox when slime aborts: the run is killed (without that the
    held run would sleep 600 s and the test time out), and the call runs again when the episode continues."""
    state = install_generate_state(monkeypatch, tokenizer)
    policy = ContinuingPolicy(server, tokenizer)
    args = args_for(server, tools=["partial_tools.python"])
    code = call("python", code="print(2 + 3)")
    sample = new_sample()
    policy.script(sample.session_id, code, ANSWER)
    HOLD["on"] = True
    out = await aborted_run(server, args, sample, state, until=lambda: HOLD["started"] > 0)
    assert out.status == S.ABORTED and (HOLD["started"], HOLD["finished"]) == (1, 0)
    saved = EpisodeCheckpoint.from_data(out.metadata[CHECKPOINT_KEY])
    assert saved.tools.tool_iters == 0 and saved.messages[-1]["role"] == "assistant", "the call runs again"
    HOLD["on"] = False
    out = await rollout.generate(args, through_the_buffer(out), dict(TOP_P_PARAMS))
    assert out.status == S.COMPLETED and (HOLD["started"], HOLD["finished"]) == (2, 1)
    assert "<tool_response>\n5\n" in out.response
    assert_sample_matches_server(out, server, routing_key=sample.session_id)
    assert_same_episode(out, await reference(server, policy, args, (code, ANSWER)))


def restore_cut_turn(model: SGLangModel, tokenizer: Any, pending: PendingTurn) -> TokenManager:
    """Put ``model`` back on a one-turn episode whose turn the abort cut after 4 tokens (``pending``: what the
    turn was sent with); the restored trajectory."""
    tm = TokenManager()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    tm.add_prompt(tokenizer.encode(prompt, add_special_tokens=False))
    tm.add_generation([9707, 11, 1879, 0], [-0.1] * 4, TurnInfo("abort"))
    model.restore_state(tm, ModelCheckpoint(1, pending, (), {}, {}, ModelStats(turns=1)))
    return tm


async def test_a_cut_turn_with_no_room_left_ends_there(server, tokenizer):
    """The abort cut a turn just as it reached its ``max_new_tokens``: continuing it asks the server for
    nothing more; the turn ends ``length``, as it would have without the abort."""
    model = SGLangModel(tokenizer=tokenizer, base_url=server.base_url, params={"max_new_tokens": 4})
    tm = restore_cut_turn(model, tokenizer, PendingTurn(1, False, 4, TurnCut.MAX_TOKENS))
    events = [e async for e in model.stream([{"role": "user", "content": [{"text": "hi"}]}])]
    assert not server.generate_requests, "no request: the turn had its tokens"
    assert any(e.get("messageStop", {}).get("stopReason") == "max_tokens" for e in events)
    assert model.stats.turns == 1 and model.token_manager is tm


async def test_a_cut_turn_asks_for_the_rest_of_the_budget_it_was_sent_with(server, tokenizer):
    """The continuation of a turn cut after 4 tokens asks for what the cut left of the ``max_new_tokens`` the
    turn was SENT with (saved with it), not for a budget made again under the rules of the coming turn (a
    compaction's reserve, the per-turn cap): the same turn, the same length."""
    model = SGLangModel(tokenizer=tokenizer, base_url=server.base_url, params={"max_new_tokens": 100})
    model.update_config(reserved_tokens=50)  # a summary's reserve the cut turn was not sent under
    tm = restore_cut_turn(model, tokenizer, PendingTurn(1, False, 10, TurnCut.CONTEXT_FULL))
    server.script(Turn(" ".join(["word"] * 20), finish="length"))  # writes on past the 6 tokens left
    [e async for e in model.stream([{"role": "user", "content": [{"text": "hi"}]}])]
    (request,) = server.generate_requests
    assert request.body["sampling_params"]["max_new_tokens"] == 10 - 4
    assert request.body["input_ids"] == tm.token_ids[: len(request.body["input_ids"])]
    assert model.stats.last_cut is TurnCut.CONTEXT_FULL, "cut where the turn's own bound cut it"
    assert len(model.token_manager.spans[-1]) == 6 and model.stats.turns == 1


# -- checkpoints that cannot be continued: the sample starts again from its prompt ---------------------------


async def cut_sample(server, tokenizer, state, args):
    """An episode slime aborted mid-generation of its second turn (ABORTED, its checkpoint on it), and the
    policy that answers its session (the restarted episode asks turn 2 again from its start, then turn 3)."""
    policy = ContinuingPolicy(server, tokenizer)
    sample = new_sample()
    policy.script(sample.session_id, SLOW, SLOW, ANSWER)
    policy.hold(sample.session_id, 2, "running")
    out = await aborted_run(server, args, sample, state, until=lambda: policy.parked(sample.session_id))
    assert out.status == S.ABORTED and CHECKPOINT_KEY in out.metadata
    return through_the_buffer(out)


async def restarts_from_the_prompt(server, args, sample, caplog):
    """``sample`` (its checkpoint cannot be continued) runs again from its prompt, with a warning."""
    asked = len(session_requests(server, sample))
    out = await rollout.generate(args, sample, dict(TOP_P_PARAMS))
    rec = record(out)
    assert out.status == S.COMPLETED and CHECKPOINT_KEY not in out.metadata, rec.error
    assert rec.continuations == 0 and "starts again" in caplog.text
    first = session_requests(server, out)[asked].body["input_ids"]
    assert first == out.tokens[: len(out.tokens) - out.response_length], "the prompt alone"
    assert_sample_matches_server(
        out, server, routing_key=out.session_id, requests=session_requests(server, out)[asked:]
    )


async def test_a_checkpoint_that_does_not_restore_while_slime_aborts_again_leaves_none(
    server, tokenizer, monkeypatch, caplog
):
    """The checkpoint does not restore and slime's flag is already up: the sample stays ABORTED with no
    checkpoint (not one of a conversation that never began), and the next step starts it from its prompt."""
    state = install_generate_state(monkeypatch, tokenizer)
    args = args_for(server)
    sample = await cut_sample(server, tokenizer, state, args)
    sample.metadata[CHECKPOINT_KEY]["compaction_pending"] = True  # reads back; the episode compacts nothing

    state.aborted = True
    again = await rollout.generate(args, sample, dict(TOP_P_PARAMS))
    state.aborted = False
    assert again.status == S.ABORTED and CHECKPOINT_KEY not in again.metadata
    await restarts_from_the_prompt(server, args, again, caplog)


def closed_segment(data, **labels):
    """A closed segment of the checkpoint's own trajectory, labelled as a compaction closes one but for
    ``labels``."""
    segment = {"kind": "main", "opened_by": "prompt", "closed_by": "compaction", "status": "COMPLETED"}
    return {**segment, "name": "", "trajectory": copy.deepcopy(data["trajectory"]), **labels}


CONTRADICTIONS = {
    "opened_by": lambda d: d.update(opened_by="nonsense"),
    "pending_messages": lambda d: d["model"]["pending"].update(
        messages=d["model"]["pending"]["messages"] + 1
    ),
    "no_pending_turn": lambda d: d["model"].update(pending=None),  # the trajectory ends on its prompt
    "segment_kind": lambda d: d["closed"].append(closed_segment(d, kind="tool")),
    "segment_closed_by": lambda d: d["closed"].append(closed_segment(d, closed_by="boredom")),
    "segment_status": lambda d: d["closed"].append(closed_segment(d, status="DONE")),
}


@pytest.mark.parametrize("contradiction", CONTRADICTIONS)
async def test_a_checkpoint_that_contradicts_itself_starts_the_episode_again(
    server, tokenizer, monkeypatch, caplog, contradiction
):
    """A checkpoint that reads back but is no state an aborted episode leaves is refused when restored (the
    checks its capture makes), and the sample starts again from its prompt instead of ending FAILED."""
    state = install_generate_state(monkeypatch, tokenizer)
    args = args_for(server)
    sample = await cut_sample(server, tokenizer, state, args)
    CONTRADICTIONS[contradiction](sample.metadata[CHECKPOINT_KEY])
    EpisodeCheckpoint.from_data(sample.metadata[CHECKPOINT_KEY])  # it reads back
    await restarts_from_the_prompt(server, args, sample, caplog)


@pytest.mark.parametrize("setting", ["resume_aborted_false", "no_partial_rollout", "evaluation"])
async def test_an_aborted_sample_that_will_not_be_continued_carries_no_checkpoint(
    server, tokenizer, monkeypatch, setting
):
    """Only an episode that can be continued (slime's --partial-rollout, ``resume_aborted``, training) keeps a
    checkpoint: otherwise its sample starts from its prompt anyway, and a checkpoint (kilobytes, megabytes
    with routed experts) would only ride in slime's buffer."""
    state = install_generate_state(monkeypatch, tokenizer)
    strands = {"resume_aborted": False} if setting == "resume_aborted_false" else {}
    args = partial_args(server, mask=False, tools=("partial_tools.slow_add",), strands=strands)
    args.partial_rollout = setting != "no_partial_rollout"
    policy = ContinuingPolicy(server, tokenizer)
    sample = new_sample()
    policy.script(sample.session_id, SLOW, SLOW, ANSWER)
    policy.hold(sample.session_id, 2, "running")
    task = asyncio.create_task(
        rollout.generate(args, sample, dict(TOP_P_PARAMS), evaluation=setting == "evaluation")
    )
    await wait_until(lambda: policy.parked(sample.session_id) or task.done())
    state.aborted = True
    await SGLangClient(server.base_url).abort()
    out = await task
    assert out.status == S.ABORTED and record(out).turns == 2
    assert CHECKPOINT_KEY not in out.metadata


async def test_a_continuation_cancelled_keeps_the_checkpoint(server, tokenizer, monkeypatch):
    """A continuation cancelled before it ends (the caller's cancellation propagates) leaves the sample as it
    was handed in: ABORTED, with its checkpoint, so a later step still continues it."""
    state = install_generate_state(monkeypatch, tokenizer)
    args = args_for(server)
    sample = await cut_sample(server, tokenizer, state, args)
    saved, cut_at = copy.deepcopy(sample.metadata[CHECKPOINT_KEY]), list(sample.tokens)
    policy = server.responder
    policy.hold(sample.session_id, 3, "running")
    policy.scripts[sample.session_id].append(ANSWER)  # the policy's answer after the cancelled request
    task = asyncio.create_task(rollout.generate(args, sample, dict(TOP_P_PARAMS)))
    await wait_until(lambda: policy.parked(sample.session_id))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await SGLangClient(server.base_url).abort()  # the held request
    assert sample.status == S.ABORTED and sample.metadata[CHECKPOINT_KEY] == saved

    asked = len(session_requests(server, sample))
    out = await rollout.generate(args, sample, dict(TOP_P_PARAMS))
    assert out.status == S.COMPLETED and record(out).continuations == 1
    assert session_requests(server, out)[asked].body["input_ids"] == cut_at, "continued from the checkpoint"
