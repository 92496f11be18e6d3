"""Partial rollout through slime's REAL rollout loop: ``generate_rollout_async`` over-samples, aborts the
episodes still running once it has enough groups (``abort()``: its flag, then ``/abort_request`` to every
worker the router lists, then it collects the partial groups, marking ``start_rollout_id``), and the next
step hands them back through ``generate_and_rm`` (which masks off-policy tokens its own way first).

Needs slime's source (slime is not on PyPI): ``$SLIME_STRANDS_SLIME_SOURCE``, or the snapshot in ../shared/slime
beside the clone (``slime_helpers.slime_source``). The episodes are the ones of test_partial_rollout.py: each continued sample must equal the same
episode run straight through, token for token.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest
from fanout_kit import SUMMARY_MARK, add_call
from partial_kit import (
    LAYERS,
    TOPK,
    ContinuingPolicy,
    assert_same_episode,
    partial_args,
    wait_until,
)
from partial_tools import HOLD, call

from slime_strands._slime.partial_rollout import CHECKPOINT_KEY, EpisodeSamples
from slime_strands.agent.record import EpisodeRecord
from slime_strands.testing import SGLangTestServer
from slime_strands.testing.invariants import (
    assert_batch_convertible,
    assert_sample_invariants,
    assert_sample_matches_server,
)

pytestmark = pytest.mark.timeout(180)
ANSWER = "The sum is 5.\nAnswer: \\boxed{5}"
ADD, SLOW = call("add", a=2, b=3), call("slow_add", a=2, b=3)
FAST = (ADD, ADD, ANSWER)


@pytest.fixture(autouse=True)
def _tools():
    HOLD.update(on=False, started=0, finished=0)
    yield
    HOLD["on"] = False


def slime_args(server: SGLangTestServer, *, mask: bool = False, batch: int = 2, **strands: Any) -> Any:
    """slime's args for two samples a prompt, ``batch`` groups a step, twice that many in flight."""
    tools = ("rollout_tools.add", "partial_tools.slow_add", *strands.pop("tools", []))
    return partial_args(
        server,
        mask=mask,
        tools=tools,
        n_samples_per_prompt=2,
        rollout_batch_size=batch,
        over_sampling_batch_size=2 * batch,
        sglang_server_concurrency=16,
        strands=strands,
    )


class Prompts:
    """slime's data source: the buffer first (what ``abort()`` collected), then new groups."""

    def __init__(self, slime: Any) -> None:
        self.sample_cls = slime.Sample
        self.buffer: list[list[Any]] = []
        self.fresh: list[list[Any]] = []
        self.groups = 0

    def new_group(self, label: str = "5") -> list[Any]:
        group = [
            self.sample_cls(
                prompt="What is 2+3?", label=label, group_index=self.groups, index=2 * self.groups + i,
                session_id=str(uuid.uuid4()),
            )
            for i in range(2)
        ]  # fmt: skip
        self.groups += 1
        self.fresh.append(group)
        return group

    def __call__(self, n: int) -> list[list[Any]]:
        taken, self.buffer = self.buffer[:n], self.buffer[n:]
        more, self.fresh = self.fresh[: n - len(taken)], self.fresh[n - len(taken) :]
        return taken + more


async def step(slime: Any, args: Any, rollout_id: int, prompts: Prompts) -> list[list[Any]]:
    """One slime rollout step (its own loop, abort included); the partial groups go back to the buffer."""
    from slime.utils import http_utils

    http_utils._http_client = None  # slime's client, made for this test's event loop
    http_utils.init_http_client(args)
    try:
        out, aborted = await slime.generate_rollout_async(args, rollout_id, prompts)
    finally:
        await http_utils._http_client.aclose()
        http_utils._http_client = None
    slime.GenerateState(args).reset()
    prompts.buffer += aborted
    return out.samples


async def straight(slime: Any, args: Any, policy: ContinuingPolicy, turns: tuple[str, ...], label: str = "5"):
    """The same episode straight through slime's ``generate_and_rm`` (nothing aborts it)."""
    sample = slime.Sample(prompt="What is 2+3?", label=label, index=0, session_id=str(uuid.uuid4()))
    policy.script(sample.session_id, *turns)
    return await slime.generate_and_rm(args, sample, dict(TOP_P))


TOP_P = {
    "temperature": 1.0, "top_p": 0.9, "top_k": -1, "max_new_tokens": 2048, "stop": None, "stop_token_ids": None,
    "skip_special_tokens": False, "no_stop_trim": True, "spaces_between_special_tokens": False,
    "custom_params": {"return_top_p_token_ids": True},
}  # fmt: skip


def requests_of(server: SGLangTestServer, sample: Any) -> list[Any]:
    return [r for r in server.generate_requests if r.headers.get("x-smg-routing-key") == sample.session_id]


# -- the batch: over-sampled, aborted at several places, continued ------------------------------------------


@pytest.mark.parametrize("mask", [False, True], ids=["trained", "masked"])
async def test_slimes_abort_and_the_next_step_continue_every_episode(slime, tokenizer, mask):
    with SGLangTestServer(tokenizer, routed_experts=(LAYERS, TOPK)) as server:
        policy = ContinuingPolicy(server, tokenizer)
        args = slime_args(server, mask=mask)
        prompts = Prompts(slime)
        fast = [prompts.new_group(), prompts.new_group()]
        slow = [prompts.new_group(), prompts.new_group()]
        gate = threading.Event()  # the fast groups finish only once every slow episode is where it is cut
        for group in fast:
            for sample in group:
                policy.script(sample.session_id, *FAST)
                policy.gate(sample.session_id, 3, gate)
        scripts = {  # where slime's abort finds each slow episode
            "mid_generation": ((ADD, ADD, ANSWER), 2, "running"),
            "first_turn": ((ADD, ADD, ANSWER), 1, "running"),
            "queued": ((ADD, ADD, ANSWER), 3, "queued"),
            "tool_run": ((SLOW, ADD, ANSWER), None, None),
        }
        cut = dict(zip(scripts, [s for g in slow for s in g], strict=True))
        for where, sample in cut.items():
            turns, turn, mode = scripts[where]
            policy.script(sample.session_id, *turns)
            if turn is not None:
                policy.hold(sample.session_id, turn, mode)
        HOLD["on"] = True

        task = asyncio.create_task(step(slime, args, 0, prompts))
        parked = [s for g in fast for s in g] + [s for w, s in cut.items() if w != "tool_run"]
        await wait_until(lambda: all(policy.parked(s.session_id) for s in parked) and HOLD["started"] == 1)
        gate.set()
        done = await task
        assert sorted(s.index for g in done for s in g) == [0, 1, 2, 3], "the fast groups make the batch"
        assert [[s.status.name for s in g] for g in prompts.buffer] == [["ABORTED"] * 2] * 2
        seams = {}
        for where, sample in cut.items():
            assert sample.metadata["start_rollout_id"] == 0, "slime's abort() marked it"
            assert CHECKPOINT_KEY in sample.metadata and sample.reward is None
            seams[where] = list(sample.tokens)
        asked = {where: len(requests_of(server, s)) for where, s in cut.items()}

        HOLD["on"] = False
        done = await step(slime, args, 1, prompts)
        assert sorted(s.index for g in done for s in g) == [4, 5, 6, 7] and not prompts.buffer
        assert_batch_convertible([s for g in done for s in g], args)
        for where, sample in cut.items():
            assert sample.status.name == "COMPLETED" and CHECKPOINT_KEY not in sample.metadata
            first = requests_of(server, sample)[asked[where]].body["input_ids"]
            assert first[: len(seams[where])] == seams[where], (
                "the next request starts with the saved trajectory"
            )
            if where in ("mid_generation", "first_turn", "queued"):
                assert first == seams[where], "the cut turn is continued, not restarted"
            masked = len(seams[where]) - (len(sample.tokens) - sample.response_length) if mask else 0
            assert_sample_matches_server(sample, server, routing_key=sample.session_id, masked_before=masked)
            expected = await straight(slime, args, policy, scripts[where][0])
            assert_same_episode(sample, expected, masked_before=masked)
            assert EpisodeRecord.of(sample).continuations == 1 and sample.reward == expected.reward == 1.0
        assert (HOLD["started"], HOLD["finished"]) == (3, 2), "the killed call ran again (and once straight)"


async def test_a_sample_continued_twice_and_on_a_restarted_server(slime, tokenizer):
    """Step 1 cuts an episode; step 2 continues it and slime aborts it again; the server restarts with new
    weights; step 3 continues it there."""
    with SGLangTestServer(tokenizer, routed_experts=(LAYERS, TOPK), weight_version="0") as server:
        policy = ContinuingPolicy(server, tokenizer)
        args = slime_args(server, mask=True, batch=1)
        prompts = Prompts(slime)
        turns = (ADD, ADD, ADD, ADD, ANSWER)
        gate1, gate2 = threading.Event(), threading.Event()
        first, second = prompts.new_group(), prompts.new_group()
        slow = first[0]
        for sample in first:
            policy.script(sample.session_id, *turns)
        policy.hold(slow.session_id, 2, "running")
        policy.hold(first[1].session_id, 2, "running")
        for sample in second:
            policy.script(sample.session_id, *FAST)
            policy.gate(sample.session_id, 3, gate1)
        task = asyncio.create_task(step(slime, args, 0, prompts))
        await wait_until(lambda: all(policy.parked(s.session_id) for s in [*first, *second]))
        gate1.set()
        await task
        assert slow.status.name == "ABORTED"

        third = prompts.new_group()  # step 2: the recycled group and a new one; slime aborts the first again
        for sample in third:
            policy.script(sample.session_id, *FAST)
            policy.gate(sample.session_id, 3, gate2)
        policy.hold(slow.session_id, 4, "running")
        task = asyncio.create_task(step(slime, args, 1, prompts))
        await wait_until(lambda: all(policy.parked(s.session_id) for s in [slow, *third]))
        gate2.set()
        await task
        assert slow.status.name == "ABORTED" and slow.metadata["start_rollout_id"] == 0
        assert EpisodeRecord.of(slow).continuations == 1
        seam = len(slow.tokens)

    with SGLangTestServer(tokenizer, routed_experts=(LAYERS, TOPK), weight_version="1") as restarted:
        policy.move_to(restarted)
        # behind slime's router the worker keeps its address; here the restarted server has a new one, so
        # slime's GenerateState (which holds the args) is made again for it
        slime.GenerateState.clear_instances()
        args = slime_args(restarted, mask=True, batch=1)
        done = await step(slime, args, 2, prompts)
        assert [s.index for g in done for s in g] == [0, 1]
        rec = EpisodeRecord.of(slow)
        assert slow.status.name == "COMPLETED", rec.error
        assert rec.continuations == 2 and rec.turns_saved == 2 + 4
        assert slow.weight_versions[-2:] == ["1", "1"] and set(slow.weight_versions[:-2]) == {"0"}
        (resent, *_) = requests_of(restarted, slow)
        assert resent.body["input_ids"] == slow.tokens[:seam], (
            "the cut turn goes on from the saved trajectory"
        )
        masked = seam - (len(slow.tokens) - slow.response_length)
        assert_sample_invariants(slow, masked_before=masked)
        expected = await straight(slime, args, policy, turns)
    assert_same_episode(slow, expected, masked_before=masked)


async def test_fanned_out_episodes_under_slimes_partial_rollout(slime, tokenizer):
    """Compacting episodes (``list[Sample]`` each): a finished one in a group slime aborts is read as one
    Sample by slime's abort() and re-entry; the aborted one continues across its segments."""
    window = 1024
    sixteen = tuple([add_call(i) for i in range(15)] + ["All 15 additions are done.\nAnswer: \\boxed{16}"])
    with SGLangTestServer(tokenizer, context_length=window, routed_experts=(LAYERS, TOPK)) as server:
        policy = ContinuingPolicy(server, tokenizer, summary_mark=SUMMARY_MARK)
        args = slime_args(server, mask=True, batch=1, context_management="summarize")
        reference = await straight(slime, args, policy, sixteen, label="16")
        summaries = policy.summary_turns[reference[-1].session_id]
        summary_turn, last_turn = summaries[0], len(sixteen) + len(summaries)
        prompts = Prompts(slime)
        mixed, fast = prompts.new_group("16"), prompts.new_group("16")
        gate = threading.Event()
        for sample in [*mixed, *fast]:
            policy.script(sample.session_id, *sixteen)
        policy.hold(mixed[1].session_id, summary_turn + 1, "running")  # right after its compaction
        for sample in fast:
            policy.gate(sample.session_id, last_turn, gate)
        task = asyncio.create_task(step(slime, args, 0, prompts))
        finished = mixed[0]  # generate scores a fanned-out episode itself, last
        await wait_until(
            lambda: (
                all(policy.parked(s.session_id) for s in [mixed[1], *fast]) and finished.reward is not None
            )
        )
        gate.set()
        await task
        (group,) = prompts.buffer
        assert isinstance(group[0], EpisodeSamples) and group[0].status.name == "COMPLETED"
        assert group[1].status.name == "ABORTED" and group[1].metadata["start_rollout_id"] == 0
        assert group[0].metadata["start_rollout_id"] == 0, "slime's abort() read the finished episode as one"

        done = await step(slime, args, 1, prompts)
        (group,) = done
        assert all(isinstance(item, EpisodeSamples) for item in group)
        assert all(s.loss_mask == [0] * s.response_length for s in group[0]), "slime masked the older episode"
        continued = group[1]
        rec = EpisodeRecord.of(continued[-1])
        assert rec.continuations == 1 and len(continued) == len(reference)
        for sample, expected, segment in zip(continued, reference, rec.segments, strict=True):
            prompt_len = len(sample.tokens) - sample.response_length
            masked = max(0, min(sample.response_length, segment.carried_tokens - prompt_len))
            assert_same_episode(sample, expected, masked_before=masked)


async def test_a_failed_fanned_out_episode_slime_hands_back_starts_again(slime, tokenizer):
    """A fanned-out episode that FAILED is ``EpisodeSamples``; when slime's abort() puts its group back, the
    next step's ``generate_and_rm`` hands that list to ``generate``, which runs the episode again from its
    prompt (its original Sample, the list's last) instead of crashing slime's step."""
    from slime_strands.testing import Fault

    with SGLangTestServer(tokenizer, routed_experts=(LAYERS, TOPK)) as server:
        args = slime_args(server, batch=1, context_management="summarize")
        sample = slime.Sample(prompt="What is 2+3?", label="5", index=0, session_id=str(uuid.uuid4()))
        server.script(Fault(status=400, body={"error": {"message": "bad request"}}), key=sample.session_id)
        failed = await slime.generate_and_rm(args, sample, dict(TOP_P))
        assert isinstance(failed, EpisodeSamples) and failed.status.name == "FAILED"

        server.script(ADD, ANSWER, key=sample.session_id)  # the group is back: the episode runs again
        again = await slime.generate_and_rm(args, failed, dict(TOP_P))
        assert isinstance(again, EpisodeSamples) and [s.status.name for s in again] == ["COMPLETED"]
        assert again[-1] is sample and again.reward == 1.0
        assert EpisodeRecord.of(sample).regenerations == 1
        assert_sample_matches_server(sample, server, routing_key=sample.session_id)
        assert_batch_convertible(list(again), args)
