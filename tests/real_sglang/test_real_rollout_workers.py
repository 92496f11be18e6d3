"""Rollout workers against the REAL SGLang server: the same greedy episodes (tools on, grammar-constrained turns and
free ones) through slime-strands' ``generate``, once in this process and once on two Ray rollout workers, give
field-for-field identical Samples, each checked against what the server saw and answered.

Greedy and one request at a time (the episodes run one after the other), the random-weight model is
deterministic; the server's prefix cache is flushed before each run, so both runs meet the same cache."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from ray_kit import local_ray
from slime_helpers import SLIME_PARAMS, Sample, comparable, install_generate_state, make_args, new_sample

from real_sglang.real_helpers import ANSWER, CALL_ADD, CONTEXT_LENGTH, TEST_TOOLS, call, literal, one_of
from real_sglang.server_setup import wait_idle
from slime_strands import rollout, workers
from slime_strands.agent.record import EpisodeRecord
from slime_strands.provider.client import SGLANG_CONTEXT_MARGIN
from slime_strands.testing.invariants import assert_sample_matches_server

pytestmark = [pytest.mark.real_sglang, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
PARAMS = {**SLIME_PARAMS, "temperature": 0.0, "max_new_tokens": 512}  # greedy, within the window
ECHO = call("echo", text="hi")
EPISODES: list[tuple[str | None, int | None]] = [  # (grammar of every turn, max_new_tokens)
    (literal(ANSWER), None),  # the answer at once
    (literal(CALL_ADD), None),  # the add tool twice, then the tool limit
    (literal(ECHO), None),  # the echo tool twice, then the tool limit
    (one_of(CALL_ADD, ANSWER), None),  # the model's own pick at each turn
    (None, 48),  # free text until the turn's budget
]


@pytest.fixture(scope="module")
def ray_session():
    with local_ray(2, env_vars={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}):
        yield


@pytest.fixture
async def pools_closed():
    yield
    for pool in workers.pools():
        await pool.aclose()
    workers._POOLS.clear()


def _flush_cache(base_url: str) -> None:
    wait_idle(base_url)
    request = urllib.request.Request(f"{base_url}/flush_cache", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200


async def _run(proxy: Any, sglang_server: Any, count: int) -> list[Any]:
    strands = {"tools": list(TEST_TOOLS), "max_tool_iters": 2, "retry_delay_s": 0.05, "max_retries": 3}
    if count:
        strands["rollout_workers"] = {"count": count}
    args = make_args(proxy, strands=strands, rollout_max_response_len=512, eval_max_response_len=512)
    _flush_cache(sglang_server.base_url)
    out = []
    for i, (regex, max_new_tokens) in enumerate(EPISODES):
        params = {**PARAMS, **({"regex": regex} if regex else {})}
        if max_new_tokens:
            params["max_new_tokens"] = max_new_tokens
        sample = new_sample("What is 2 + 3?", index=i)
        assert await rollout.generate(args, sample, params) is sample
        out.append(sample)
    return out


def _check_against_server(sample: Any, proxy: Any) -> None:
    """The trajectory invariants against the server's records; no refused request, none at the window's edge."""
    assert_sample_matches_server(sample, proxy, routing_key=sample.session_id)
    exchanges = proxy.generations(sample.session_id)
    assert exchanges and all(e.status == 200 for e in exchanges), [(e.status, e.answer) for e in exchanges]
    for e in exchanges:
        assert len(e.body["input_ids"]) < CONTEXT_LENGTH - SGLANG_CONTEXT_MARGIN
        assert len(e.body["input_ids"]) + int(e.body["sampling_params"]["max_new_tokens"]) <= CONTEXT_LENGTH


async def test_samples_are_identical_in_process_and_on_rollout_workers(
    proxy, sglang_server, tokenizer, monkeypatch, ray_session, pools_closed
):
    install_generate_state(monkeypatch, tokenizer)
    here = await _run(proxy, sglang_server, 0)
    assert not workers.pools()
    there = await _run(proxy, sglang_server, 2)
    (pool,) = workers.pools()
    state = pool.state()
    assert sum(state.episodes) == len(EPISODES) and len({w.pid for w in state.workers}) == 2
    assert os.getpid() not in {w.pid for w in state.workers}  # the second run's episodes ran elsewhere
    for a, b in zip(here, there, strict=True):
        for sample in (a, b):
            _check_against_server(sample, proxy)
        assert comparable(a) == comparable(b), (a.metadata, b.metadata)
    records = [EpisodeRecord.of(s) for s in here]
    ends = [(s.status, r.termination.value, r.tool_calls) for s, r in zip(here, records, strict=True) if r]
    assert ends[:3] == [
        (Sample.Status.COMPLETED, "end_turn", 0),
        (Sample.Status.TRUNCATED, "tool_limit", 2),
        (Sample.Status.TRUNCATED, "tool_limit", 2),
    ], ends
    assert len(ends) == len(EPISODES)
    assert here[1].response.count("<tool_response>\n5\n</tool_response>") == 2, here[1].response
    assert here[2].response.count("<tool_response>\nhi\n</tool_response>") == 2, here[2].response
