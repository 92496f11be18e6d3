"""The plugin under slime's REAL fully-async rollout (``slime.rollout.fully_async_rollout``): a background thread
with its own event loop pulls groups from the data buffer and runs slime's ``generate_and_rm_group`` on them,
ABORTED groups go back to the buffer, each rollout step takes finished groups off its queue; and between steps
slime's eval runs through slime's normal path (``generate_rollout(evaluation=True)``) on slime's MAIN loop (its
``async_utils`` thread) in the same process.

Three steps, the server's weight version bumped at each update; at each update the abort slime's weight update
sends (its flag, then ``/abort_request`` for all) cuts the group held in flight, and the next step continues it
at the new version. Checked: nothing raises or hangs, every group is trained exactly once, every continued
episode is token-exact against what the server served, and the staleness metrics are what the saved samples'
versions say.
"""

from __future__ import annotations

import importlib
import json
import threading
import time
import urllib.request
import uuid
from typing import Any

import pytest
from partial_kit import LAYERS, TOPK, ContinuingPolicy
from partial_tools import HOLD, call
from test_partial_rollout_slime import slime_args
from test_staleness import version_mask

from slime_strands import metrics
from slime_strands.agent.record import EpisodeRecord
from slime_strands.testing import SGLangTestServer
from slime_strands.testing.invariants import (
    assert_batch_convertible,
    assert_sample_invariants,
    assert_sample_matches_server,
)

pytestmark = pytest.mark.timeout(300)
ANSWER = "The sum is 5.\nAnswer: \\boxed{5}"
ADD, SLOW = call("add", a=2, b=3), call("slow_add", a=2, b=3)
TURNS = (ADD, ADD, ANSWER)
WAIT_S = 120.0


@pytest.fixture(autouse=True)
def _tools():
    HOLD.update(on=False, started=0, finished=0)
    yield
    HOLD["on"] = False


class DataBuffer:
    """slime's data buffer as the fully-async worker uses it (``get_samples`` / ``add_samples`` from the worker's
    thread): aborted groups first, then new ones; closed while slime pauses for a weight update."""

    def __init__(self, sample_cls: Any) -> None:
        self.sample_cls = sample_cls
        self.lock = threading.Lock()
        self.returned: list[list[Any]] = []
        self.fresh: list[list[Any]] = []
        self.handed: list[str] = []
        self.groups = 0
        self.open = True

    def new_group(self) -> list[Any]:
        with self.lock:
            group = [
                self.sample_cls(
                    prompt="What is 2+3?", label="5", group_index=self.groups, index=2 * self.groups + i,
                    session_id=str(uuid.uuid4()),
                )
                for i in range(2)
            ]  # fmt: skip
            self.groups += 1
            self.fresh.append(group)
        return group

    def get_samples(self, n: int) -> list[list[Any]]:
        with self.lock:
            if not self.open:
                return []
            taken, self.returned = self.returned[:n], self.returned[n:]
            more, self.fresh = self.fresh[: n - len(taken)], self.fresh[n - len(taken) :]
            out = taken + more
            self.handed += [s.session_id for g in out for s in g]
            return out

    def add_samples(self, groups: list[list[Any]]) -> None:
        with self.lock:
            self.returned += groups

    def waiting(self) -> list[list[Any]]:
        with self.lock:
            return list(self.returned)


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def abort_all(server: SGLangTestServer) -> None:
    """``/abort_request`` for every request in flight, as slime's weight update's engine pause aborts them."""
    request = urllib.request.Request(
        f"{server.base_url}/abort_request", data=json.dumps({"abort_all": True}).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    urllib.request.urlopen(request, timeout=30).read()


def weight_update(
    server: SGLangTestServer,
    worker: Any,
    buffer: DataBuffer,
    held: list[Any],
    version: str,
    policy: ContinuingPolicy,
    in_flight: Any,
) -> None:
    """What slime's weight update does to the rollout in flight: the abort flag, ``/abort_request`` for all (the
    held group comes back ABORTED to the buffer), then the new weights' version, generation open again."""
    buffer.open = False
    wait_for(in_flight, "the held group in flight")
    worker.state.aborted = True
    abort_all(server)
    ids = {s.session_id for s in held}
    wait_for(
        lambda: any({s.session_id for s in g} == ids for g in buffer.waiting()), "the aborted group back"
    )
    policy.weight_version = version
    HOLD["on"] = False
    worker.state.aborted = False
    buffer.open = True


def first_groups(buffer: DataBuffer, policy: ContinuingPolicy) -> tuple[list[Any], list[Any]]:
    """Step 0's two groups: A runs to its answer, B is held in its second turn (for an abort to cut)."""
    a, b = buffer.new_group(), buffer.new_group()
    for s in [*a, *b]:
        policy.script(s.session_id, *TURNS)
    for s in b:
        policy.hold(s.session_id, 2, "running")
    return a, b


def evaluate(slime: Any, args: Any, policy: ContinuingPolicy, rollout_id: int) -> list[Any]:
    """slime's eval, its normal path: ``generate_rollout(evaluation=True)`` on slime's main loop."""
    policy.script(None, *TURNS)
    output = slime.generate_rollout(args, rollout_id, None, evaluation=True)
    return output.data["eval"]["samples"]


def test_three_steps_of_slimes_fully_async_rollout_with_aborts_and_eval_between(slime, tokenizer, tmp_path):
    fully_async = importlib.import_module("slime.rollout.fully_async_rollout")
    from slime.utils.eval_config import EvalDatasetConfig

    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text(json.dumps({"prompt": "What is 2+3?", "label": "5"}) + "\n")
    with SGLangTestServer(tokenizer, routed_experts=(LAYERS, TOPK)) as server:
        policy = ContinuingPolicy(server, tokenizer)
        policy.weight_version = "1"
        args = slime_args(server, batch=1)
        eval_cfg = EvalDatasetConfig(
            name="eval", path=str(eval_file), input_key="prompt", label_key="label", n_samples_per_eval_prompt=1,
            temperature=1.0, top_p=1.0, top_k=-1, max_response_len=1024,
        )  # fmt: skip
        args.eval_datasets = [eval_cfg]
        args.eval_max_prompt_len = None
        args.multimodal_keys = None
        buffer = DataBuffer(slime.Sample)
        trained: list[list[Any]] = []
        evals: list[Any] = []
        continued: list[list[Any]] = []
        try:
            # step 0 at version 1: A finishes, B is cut by the update in its second turn
            a, b = first_groups(buffer, policy)
            trained += fully_async.generate_rollout_fully_async(args, 0, buffer)
            worker = fully_async._global_worker
            parked_b = lambda: all(policy.parked(s.session_id) for s in b)  # noqa: E731
            weight_update(server, worker, buffer, b, "2", policy, parked_b)
            continued.append((b, ("1", "2")))
            evals += evaluate(slime, args, policy, 0)
            # step 1 at version 2: B continued, C fresh; D: one member finishes, the other is in its tool
            # (between turns) when the next update cuts it, and the group goes back whole
            args.rollout_batch_size = 2
            c, d = buffer.new_group(), buffer.new_group()
            for s in [*c, d[0]]:
                policy.script(s.session_id, *TURNS)
            policy.script(d[1].session_id, SLOW, ADD, ANSWER)
            HOLD["on"] = True
            trained += fully_async.generate_rollout_fully_async(args, 1, buffer)
            in_tool = lambda: HOLD["started"] == 1 and d[0].reward is not None  # noqa: E731
            weight_update(server, worker, buffer, d, "3", policy, in_tool)
            assert [s.status.name for s in d] == ["COMPLETED", "ABORTED"]
            continued.append(([d[1]], ("2", "3")))
            evals += evaluate(slime, args, policy, 1)
            # step 2 at version 3: D continued (its finished member as it was), E fresh
            e = buffer.new_group()
            for s in e:
                policy.script(s.session_id, *TURNS)
            trained += fully_async.generate_rollout_fully_async(args, 2, buffer)
            assert HOLD["finished"] == 1, "the tool the update cut ran again, once"
            assert worker.queue_size() == 0 and not buffer.waiting()
        finally:
            fully_async._stop_global_worker()

        keys = sorted(s.session_id for g in trained for s in g)
        expected = sorted(s.session_id for g in (a, b, c, d, e) for s in g)
        assert keys == expected, "a group lost or trained twice"
        samples = [s for g in trained for s in g]
        assert_batch_convertible(samples, args)
        for sample in samples:
            assert sample.status.name == "COMPLETED" and sample.reward == 1.0, sample.status
            assert_sample_invariants(sample)
            assert_sample_matches_server(sample, server, routing_key=sample.session_id)
        assert {v for v, _, _ in version_mask(server, d[0])} == {"2"}
        for group, versions in continued:
            for sample in group:
                assert {v for v, _, _ in version_mask(server, sample)} == set(versions)
                record = EpisodeRecord.of(sample)
                assert (record.version_earliest_trained, record.version_latest_trained) == versions
        spans = [
            int(max(v for v, _, _ in version_mask(server, s)))
            - int(min(v for v, _, _ in version_mask(server, s)))
            for s in samples
        ]
        m = metrics.aggregate(samples)
        assert m["staleness/mean"] == pytest.approx(sum(spans) / len(spans)) and m["staleness/max"] == 1
        assert m["staleness/multi_version_frac"] == pytest.approx(sum(x > 0 for x in spans) / len(spans))
        assert len(evals) == 2
        for sample in evals:
            assert sample.status.name == "COMPLETED" and sample.reward == 1.0
            assert_sample_invariants(sample)
        # which loop ran each: training on the fully-async worker's thread, eval on slime's main loop's
        assert {EpisodeRecord.of(s).rollout_thread for s in samples} == {"fully-async-rollout"}
        eval_threads = {EpisodeRecord.of(s).rollout_thread for s in evals}
        assert len(eval_threads) == 1 and eval_threads.isdisjoint({None, "fully-async-rollout"}), eval_threads


def test_an_abort_without_slimes_flag_hands_the_group_back_with_no_server_abort_retries(slime, tokenizer):
    """What slime's weight update does under its fully-async rollout: its engines' pause aborts every request in
    flight WITHOUT ``GenerateState.aborted``. With ``server_abort_retries: 0`` the cut episode ends ABORTED, slime's
    worker hands its group back to the buffer whole, and the next step continues it token-exact at the new version
    (with the default the turn would be sent again in place: the smoke's first run of async_workers)."""
    fully_async = importlib.import_module("slime.rollout.fully_async_rollout")
    with SGLangTestServer(tokenizer, routed_experts=(LAYERS, TOPK)) as server:
        policy = ContinuingPolicy(server, tokenizer)
        policy.weight_version = "1"
        args = slime_args(server, batch=1, server_abort_retries=0)
        buffer = DataBuffer(slime.Sample)
        trained: list[list[Any]] = []
        try:
            a, b = first_groups(buffer, policy)
            trained += fully_async.generate_rollout_fully_async(args, 0, buffer)
            worker = fully_async._global_worker
            buffer.open = False
            wait_for(lambda: all(policy.parked(s.session_id) for s in b), "the held group in flight")
            assert not worker.state.aborted  # no flag: only the server's abort
            abort_all(server)
            ids = {s.session_id for s in b}
            wait_for(lambda: any({s.session_id for s in g} == ids for g in buffer.waiting()), "B back")
            assert all(s.status.name == "ABORTED" for s in b)
            policy.weight_version = "2"
            buffer.open = True
            trained += fully_async.generate_rollout_fully_async(args, 1, buffer)
        finally:
            fully_async._stop_global_worker()
        assert sorted(s.session_id for g in trained for s in g) == sorted(s.session_id for s in [*a, *b])
        for sample in (s for g in trained for s in g):
            assert sample.status.name == "COMPLETED" and sample.reward == 1.0, sample.status
            assert_sample_invariants(sample)
            assert_sample_matches_server(sample, server, routing_key=sample.session_id)
        for sample in b:
            record = EpisodeRecord.of(sample)
            assert record.continuations == 1 and record.turns_saved >= 1, record
            assert {v for v, _, _ in version_mask(server, sample)} == {"1", "2"}
