"""The partial-rollout checkpoint as data: exact round trips through JSON and pickle, strict reading, its size;
the shape a fanned-out episode takes in slime's groups; slime's abort flag as a shared awaitable."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import pickle
import random
from collections import Counter

import pytest

from slime_strands._slime.partial_rollout import (
    CHECKPOINT_KEY,
    EpisodeSamples,
    save_checkpoint,
    take_checkpoint,
)
from slime_strands.agent.checkpoint import EpisodeCheckpoint, SegmentCheckpoint, ToolCounters
from slime_strands.agent.record import EpisodeRecord, Termination
from slime_strands.provider.abort_signal import AbortSignal
from slime_strands.provider.checkpoint import (
    MalformedCheckpointError,
    ModelCheckpoint,
    PendingTurn,
    TrajectoryCheckpoint,
)
from slime_strands.provider.model_stats import ModelStats, TurnCut
from slime_strands.provider.token_manager import TokenManager, TurnInfo
from slime_strands.testing.slime_types import Sample


def trajectory(turns: int = 3, seed: int = 0, tokens_per_turn: int = 40) -> TokenManager:
    rng = random.Random(seed)
    tm = TokenManager()
    tm.add_prompt([rng.randrange(151_000) for _ in range(50)])
    for turn in range(turns):
        if turn:
            tm.add_observation([rng.randrange(151_000) for _ in range(20)])
        ids = [rng.randrange(151_000) for _ in range(tokens_per_turn)]
        logprobs = [-rng.random() * 10 for _ in ids]  # arbitrary doubles: they must come back bit for bit
        meta = {"finish_reason": {"type": "stop"}, "weight_version": str(turn), "top_p_token_ids": "AAAA"}
        tm.add_generation(ids, logprobs, TurnInfo("stop", 70, 10, str(turn), f"rid-{turn}", meta))
    return tm


def checkpoint(tm: TokenManager | None = None, **fields) -> EpisodeCheckpoint:
    tm = tm or trajectory()
    values = dict(
        system_prompt="You add.",
        messages=(
            {"role": "user", "content": [{"text": "What is 2+3?"}]},
            {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "add", "input": {"a": 2}}}]},
            {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "status": "success", "content": [{"text": "5"}]}}]},
        ),
        trajectory=TrajectoryCheckpoint.of(tm),
        opened_by="summarize",
        closed=(SegmentCheckpoint("main", "prompt", "compaction", "COMPLETED", "", TrajectoryCheckpoint.of(trajectory(seed=1))),),
        model=ModelCheckpoint(
            messages_seen=2,
            pending=PendingTurn(messages=3, starts_in_reasoning=True, max_new_tokens=64, bound=TurnCut.CONTEXT_FULL),
            last_tool_ids=("t1",),
            call_errors={"t2": ("bad_json", "not JSON", "<tool_call>{", None)},
            template_ids={"t1": "functions.add:0"},
            counters=ModelStats(turns=3, generation_time_s=0.5, parse_errors=Counter({"bad_json": 1}), last_cut=TurnCut.MAX_TOKENS),
        ),
        tools=ToolCounters(tool_iters=1, tool_calls=1, tool_errors=0, tool_time_s=0.25),
        subagents=(ModelStats(turns=2),),
        compaction_pending=False,
        continuations=1,
        turns_saved=4,
    )  # fmt: skip
    values.update(fields)
    return EpisodeCheckpoint(**values)


def test_a_checkpoint_comes_back_exactly_through_json_and_pickle():
    tm = trajectory()
    saved = checkpoint(tm)
    data = saved.to_data()
    back = EpisodeCheckpoint.from_data(json.loads(json.dumps(data)))
    assert back == saved
    assert EpisodeCheckpoint.from_data(pickle.loads(pickle.dumps(data))) == saved
    rebuilt = back.trajectory.rebuild()
    assert rebuilt.token_ids == tm.token_ids and rebuilt.loss_mask == tm.loss_mask
    assert rebuilt.logprobs == tm.logprobs, "logprobs are exact (float64)"
    assert [(s.kind, s.start, s.token_ids, s.info) for s in rebuilt.spans] == [
        (s.kind, s.start, s.token_ids, s.info) for s in tm.spans
    ]
    assert [s.info.meta_info for s in rebuilt.spans if s.info] == [
        s.info.meta_info for s in tm.spans if s.info
    ]
    assert back.turns == 3 + 3 and back.trajectory.turn_count == 3


def test_a_turn_cut_and_continued_counts_once():
    tm = trajectory(turns=1)
    tm.add_generation([5, 6], [-0.1, -0.2], TurnInfo("stop"))  # the rest of the last turn, after an abort
    assert tm.turn_count == 1 == TrajectoryCheckpoint.of(tm).turn_count


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(version=0), "checkpoint version 0"),
        (lambda d: d.update(extra=1), "unknown key(s) ['extra']"),
        (lambda d: d.pop("messages"), "'messages' missing"),
        (lambda d: d.update(messages=[]), "no messages"),
        (lambda d: d["messages"].append({"role": "system", "content": []}), "role user or assistant"),
        (lambda d: d["messages"][0]["content"].append({"image": {"bytes": b"\x89PNG"}}), "bytes is not plain data"),
        (lambda d: d["trajectory"].update(token_ids="not base64!"), "not base64"),
        (lambda d: d["trajectory"]["lengths"].append(3), "one positive length per span"),
        (lambda d: d["trajectory"].update(kinds=["prompt", "tool", "generated", *d["trajectory"]["kinds"][3:]]), "unknown kind"),
        (lambda d: d["trajectory"]["turns"].pop(), "do not match the generated spans"),
        (lambda d: d["model"]["counters"].update(turns=True), "counters.turns must be an integer"),
        (lambda d: d["model"]["call_errors"].update(t3=["bad_json"]), "(kind, message, raw, name) expected"),
        (lambda d: d["tools"].update(tool_iters=-1), "negative"),
        (lambda d: d["tools"].update(tool_secs=1.0), "checkpoint.tools: unknown key(s) ['tool_secs']"),
    ],
)  # fmt: skip
def test_anything_else_is_refused_with_the_reason(change, message):
    data = copy.deepcopy(checkpoint().to_data())
    change(data)
    with pytest.raises(MalformedCheckpointError) as info:
        EpisodeCheckpoint.from_data(data).trajectory.rebuild()
    assert message in str(info.value)


def test_its_size_is_a_few_bytes_a_token():
    tm = trajectory(turns=50, tokens_per_turn=100)  # 50 + 49 * 20 + 50 * 100 = 6,030 tokens, 5,000 generated
    size = len(json.dumps(checkpoint(tm, closed=()).to_data()))
    ids, logprobs = len(tm), 5000
    assert size < ids * 4 * 4 / 3 + logprobs * 8 * 4 / 3 + 50 * 300 + 4000, size  # + per-turn meta, messages
    assert base64.b64decode(TrajectoryCheckpoint.of(tm).token_ids).__len__() == 4 * ids


# -- on the sample -------------------------------------------------------------------------------------------


def test_the_checkpoint_lives_on_an_aborted_sample_and_only_there():
    sample = Sample(prompt="p", status=Sample.Status.ABORTED, metadata={"start_rollout_id": 3})
    saved = checkpoint()
    save_checkpoint(sample, EpisodeRecord(Termination.ABORTED, checkpoint=saved))
    assert sample.metadata[CHECKPOINT_KEY] == saved.to_data() and sample.metadata["start_rollout_id"] == 3
    assert take_checkpoint(pickle.loads(pickle.dumps(sample))) == saved
    assert take_checkpoint(sample) == saved and CHECKPOINT_KEY not in sample.metadata, "taken off the sample"
    done = Sample(prompt="p", status=Sample.Status.COMPLETED, metadata={CHECKPOINT_KEY: saved.to_data()})
    assert take_checkpoint(done) is None and CHECKPOINT_KEY not in done.metadata
    save_checkpoint(done, EpisodeRecord(Termination.ABORTED, checkpoint=saved))
    assert CHECKPOINT_KEY not in done.metadata, "only an ABORTED sample keeps one"


def test_an_unreadable_checkpoint_restarts_the_episode(caplog):
    sample = Sample(prompt="p", status=Sample.Status.ABORTED, metadata={CHECKPOINT_KEY: {"version": 1}})
    assert take_checkpoint(sample) is None and CHECKPOINT_KEY not in sample.metadata
    assert "carries an unreadable checkpoint" in caplog.text and "it starts again" in caplog.text


def test_a_fanned_out_episode_answers_as_its_last_sample():
    first, last = Sample(prompt="p", response="a", response_length=2), Sample(prompt="p", response="b")
    last.response_length, last.reward, last.metadata = 3, 1.0, {"strands": {}}
    last.status = Sample.Status.COMPLETED
    samples = EpisodeSamples([first, last])
    assert isinstance(samples, list) and list(samples) == [first, last]
    assert (samples.response, samples.reward, samples.response_length) == ("b", 1.0, 3)
    assert samples.status is Sample.Status.COMPLETED and samples.metadata is last.metadata
    samples.metadata["start_rollout_id"] = 0  # what slime's abort() does
    assert last.metadata["start_rollout_id"] == 0
    samples.session_id = "s"
    assert first.session_id == last.session_id == "s"
    samples.loss_mask = [0] * samples.response_length  # slime masking an older policy's samples
    assert first.loss_mask == [0, 0] and last.loss_mask == [0, 0, 0]
    for copied in (pickle.loads(pickle.dumps(samples)), copy.deepcopy(samples)):
        assert isinstance(copied, EpisodeSamples) and copied.response == "b" and len(copied) == 2
    with pytest.raises(AttributeError):
        _ = EpisodeSamples().response


async def test_one_poller_serves_every_waiter():
    calls = {"n": 0}

    def flag() -> bool:
        calls["n"] += 1
        return calls["n"] > 105

    signal = AbortSignal(flag, interval_s=0.001)
    await asyncio.wait_for(asyncio.gather(*(signal.wait() for _ in range(100))), timeout=30)
    await asyncio.sleep(
        0.05
    )  # 50 of the poller's intervals: once it has answered every waiter it checks no more
    assert calls["n"] == 106, "100 checks as the waiters came, then one poller's: not one poller per waiter"
    assert signal()
