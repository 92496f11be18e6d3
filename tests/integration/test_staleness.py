"""Staleness across a weight update, through slime's REAL rollout loop (``generate_rollout_async``: it aborts the
episodes still running, the next step hands them back through ``generate_and_rm``): the server answers with
weight version 1 before the update and 2 after it, so a continued episode holds tokens of two versions.

Checked against what the server said (each answer's ``weight_version``): the versions measured on the record,
the loss mask under ``strands.staleness`` (mask: never a token older than the bound trained, never a newer one
hidden; drop: the episode FAILED, left out of its group), the ``rollout/strands/staleness/*`` metrics, and the
refusal of a bound that contradicts ``--mask-offpolicy-in-partial-rollout``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from partial_kit import LAYERS, TOPK, ContinuingPolicy, wait_until
from partial_tools import HOLD, call
from test_partial_rollout_slime import Prompts, slime_args, step

from slime_strands import metrics
from slime_strands._slime.config import SlimeConfig
from slime_strands._slime.staleness import version_number
from slime_strands.agent.record import EpisodeRecord
from slime_strands.errors import ConfigurationError
from slime_strands.testing import SGLangTestServer
from slime_strands.testing.invariants import assert_batch_convertible, assert_sample_invariants

pytestmark = pytest.mark.timeout(180)
ANSWER = "The sum is 5.\nAnswer: \\boxed{5}"
ADD = call("add", a=2, b=3)
TURNS = (ADD, ADD, ANSWER)


@pytest.fixture(autouse=True)
def _tools():
    HOLD.update(on=False, started=0, finished=0)
    yield
    HOLD["on"] = False


def version_mask(server: SGLangTestServer, sample: Any) -> list[tuple[str, int, int]]:
    """Per generated answer of the sample (in order): its version, its start in the response, its length, as
    the server served them."""
    prompt = len(sample.tokens) - sample.response_length
    out, position = [], 0
    rids = [
        r.body["rid"]
        for r in server.generate_requests
        if r.headers.get("x-smg-routing-key") == sample.session_id
    ]
    for rid in rids:
        ids = server.answers.get(rid, ([], []))[0]
        if not ids:
            continue
        start = _find(sample.tokens, list(ids), prompt + position) - prompt
        out.append((server.meta_infos[rid]["weight_version"], start, len(ids)))
        position = start + len(ids)
    return out


def _find(haystack: list[int], needle: list[int], start: int) -> int:
    for i in range(start, len(haystack) - len(needle) + 1):
        if haystack[i : i + len(needle)] == needle:
            return i
    raise AssertionError("an answer the server sent is not in the sample's tokens")


async def two_versions(
    slime: Any, tokenizer: Any, server: SGLangTestServer, *, mask: bool = False, **strands: Any
) -> tuple[Any, ...]:
    """Step 0 at version 1 (the slow group aborted mid-generation in its second turn), step 1 at version 2
    (the slow group continued); returns (args, step 1's samples, the continued samples)."""
    policy = ContinuingPolicy(server, tokenizer)
    policy.weight_version = "1"
    args = slime_args(server, mask=mask, batch=1, **strands)
    prompts = Prompts(slime)
    fast, slow = prompts.new_group(), prompts.new_group()
    gate = threading.Event()
    for sample in fast:
        policy.script(sample.session_id, *TURNS)
        policy.gate(sample.session_id, 3, gate)
    for sample in slow:
        policy.script(sample.session_id, *TURNS)
        policy.hold(sample.session_id, 2, "running")
    task = asyncio.create_task(step(slime, args, 0, prompts))
    await wait_until(lambda: all(policy.parked(s.session_id) for s in [*fast, *slow]))
    gate.set()
    await task
    assert [[s.status.name for s in g] for g in prompts.buffer] == [["ABORTED"] * 2]
    policy.weight_version = "2"  # slime updates the weights, then the next step continues the slow group
    prompts.new_group()  # a fresh group at the new version
    for sample in prompts.fresh[-1]:
        policy.script(sample.session_id, *TURNS)
    done = await step(slime, args, 1, prompts)
    samples = [s for g in done for s in g]
    return args, samples, slow


def check_mask(
    server: SGLangTestServer, sample: Any, oldest_trained: int | None, *, before_seam: bool = False
):
    """Every generated token of a version at least ``oldest_trained`` is trained, every older one is not."""
    for version, start, length in version_mask(server, sample):
        trained = oldest_trained is None or version_number(version) >= oldest_trained
        expected = [int(trained)] * length
        assert sample.loss_mask[start : start + length] == expected, (version, start, length)


async def test_a_continued_episode_holds_two_versions_and_the_metrics_say_so(slime, tokenizer):
    with SGLangTestServer(tokenizer, routed_experts=(LAYERS, TOPK)) as server:
        args, samples, slow = await two_versions(slime, tokenizer, server)
        assert_batch_convertible(samples, args)
        for sample in samples:
            assert_sample_invariants(sample)
            check_mask(server, sample, None)
        for sample in slow:
            record = EpisodeRecord.of(sample)
            served = {v for v, _, _ in version_mask(server, sample)}
            assert (
                served == {"1", "2"}
                and sample.weight_versions[0] == "1"
                and sample.weight_versions[-1] == "2"
            )
            assert (
                record.version_earliest_trained,
                record.version_latest_trained,
                record.version_newest,
            ) == (
                "1",
                "2",
                "2",
            )
            assert (record.versions_trained, record.staleness, record.stale_masked_tokens) == (2, 1, 0)
        assert all(s in samples for s in slow), "the continued group made the step's batch"
        # the metrics from what the server said each answer's version was (an oracle apart from the records)
        spans = [
            int(max(v for v, _, _ in version_mask(server, s)))
            - int(min(v for v, _, _ in version_mask(server, s)))
            for s in samples
        ]
        m = metrics.aggregate(samples)
        assert (
            m["staleness/mean"] == pytest.approx(sum(spans) / len(spans))
            and m["staleness/max"] == max(spans) == 1
        )
        assert m["staleness/multi_version_frac"] == pytest.approx(sum(x > 0 for x in spans) / len(spans))


@pytest.mark.parametrize("flag", [False, True], ids=["bound", "bound_and_slimes_flag"])
async def test_max_versions_0_masks_the_older_version_as_slimes_flag_does(slime, tokenizer, flag):
    with SGLangTestServer(tokenizer, routed_experts=(LAYERS, TOPK)) as server:
        args, samples, slow = await two_versions(
            slime, tokenizer, server, mask=flag, staleness={"max_versions": 0, "on_exceed": "mask"}
        )
        assert_batch_convertible(samples, args)
        masked = 0
        for sample in samples:
            assert_sample_invariants(sample, masked_before=_old_prefix(server, sample))
            check_mask(server, sample, 2)
            assert not sample.remove_sample, "every sample keeps trained tokens of version 2"
        for sample in slow:
            record = EpisodeRecord.of(sample)
            old = sum(n for v, _, n in version_mask(server, sample) if v == "1")
            assert old > 0 and record.stale_masked_tokens == old
            assert (record.version_earliest_trained, record.versions_trained, record.staleness) == ("2", 1, 0)
            masked += old
        m = metrics.aggregate(samples)
        assert (m["staleness/masked_tokens"], m["staleness/max"], m["staleness/multi_version_frac"]) == (
            float(masked),
            0.0,
            0.0,
        )


def _old_prefix(server: SGLangTestServer, sample: Any) -> int:
    """Response positions up to the end of the sample's last version-1 answer (all of them before the update)."""
    return max((start + n for v, start, n in version_mask(server, sample) if v == "1"), default=0)


async def test_max_versions_1_trains_both_versions(slime, tokenizer):
    with SGLangTestServer(tokenizer, routed_experts=(LAYERS, TOPK)) as server:
        _args, samples, slow = await two_versions(slime, tokenizer, server, staleness={"max_versions": 1})
        for sample in samples:
            check_mask(server, sample, 1)
        assert all(EpisodeRecord.of(s).stale_masked_tokens == 0 for s in samples)
        assert all(EpisodeRecord.of(s).staleness == 1 for s in slow)


async def test_drop_fails_the_episodes_that_outlive_the_bound_and_leaves_them_out_of_the_group(
    slime, tokenizer
):
    with SGLangTestServer(tokenizer, routed_experts=(LAYERS, TOPK)) as server:
        args, samples, slow = await two_versions(
            slime, tokenizer, server, staleness={"max_versions": 0, "on_exceed": "drop"}
        )
        assert_batch_convertible(samples, args)
        for sample in slow:
            record = EpisodeRecord.of(sample)
            assert sample.status.name == "FAILED" and sample.remove_sample and record.stale_dropped
            assert sample.reward == 0.0 and "staleness" in record.error
        m = metrics.aggregate(samples)
        assert m["staleness/dropped_episodes"] == 2.0 and m["staleness/masked_tokens"] == 0.0
        assert "staleness/mean" not in m, "the dropped episodes are not measured as trained"


@pytest.mark.parametrize(
    "bound", [{"max_versions": 1}, {"max_versions": 0, "on_exceed": "drop"}], ids=["K1", "drop"]
)
def test_a_bound_that_contradicts_slimes_flag_is_refused(bound):
    from slime_helpers import slime_args as plain_args

    args = plain_args(
        partial_rollout=True, mask_offpolicy_in_partial_rollout=True, strands={"staleness": bound}
    )
    with pytest.raises(ConfigurationError, match="mask-offpolicy-in-partial-rollout"):
        SlimeConfig.of(args)
    agreeing = plain_args(
        partial_rollout=True,
        mask_offpolicy_in_partial_rollout=True,
        strands={"staleness": {"max_versions": 0}},
    )
    assert SlimeConfig.of(agreeing).settings.staleness.masks
