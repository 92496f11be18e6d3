"""The context window as evidence (issue 32.1), through slime's REAL ``generate_and_rm``.

A limit a 400 names is weighed against the requests the server has served. One anomalous answer (SGLang's own
scheduler text, naming a limit just under that request's input, as a router in front of engines with different
KV pools or a stale proxy gives it) ends only that request's sample: the window stays, every other sample keeps
its budget, and one WARNING names the server, the limit and the input it contradicts. A real smaller limit (a
KV pool smaller than the context) and a cold start (a server that reports no window) change the window, once, at
WARNING, and the rollout metrics carry the window in use.

Needs slime's source (slime is not on PyPI): ``$SLIME_STRANDS_SLIME_SOURCE``, or the snapshot in ../shared/slime
beside the clone (``slime_helpers.slime_source``); CI always has it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from typing import Any

import pytest
from slime_helpers import CALL_ADD, SLIME_LOOP_FLAGS, SLIME_PARAMS, make_args, session_requests

from slime_strands import metrics
from slime_strands._slime.config import SlimeConfig
from slime_strands.agent.record import EpisodeRecord, Termination
from slime_strands.provider.client import SGLANG_CONTEXT_MARGIN, SGLangClient
from slime_strands.testing import Fault, SGLangTestServer, Turn
from slime_strands.testing.invariants import assert_sample_matches_server

pytestmark = pytest.mark.timeout(180)

ANSWER = "The sum is 5.\nAnswer: \\boxed{5}"
BIG = '<tool_call>\n{"name": "huge_output", "arguments": {"n": 150}}\n</tool_call>'
LOGGER = "slime_strands.provider.client"


def slime_args(server: SGLangTestServer) -> Any:
    """slime's args for its rollout loop's ``generate_and_rm`` with this plugin and its reward."""
    return make_args(server, **SLIME_LOOP_FLAGS, strands={"max_tool_iters": None})


async def batch(slime: Any, server: SGLangTestServer, args: Any, scripts: list[tuple[str, ...]]) -> list[Any]:
    """One sample per script, all at once through slime's ``generate_and_rm``; every sample that is not FAILED
    is checked against what the server saw and answered for it."""
    samples = []
    for turns in scripts:
        sample = slime.Sample(prompt="What is 2+3?", label="5", index=0, session_id=str(uuid.uuid4()))
        server.script(*turns, key=sample.session_id)
        samples.append(sample)
    done = await asyncio.gather(*(slime.generate_and_rm(args, s, dict(SLIME_PARAMS)) for s in samples))
    for sample in done:
        if sample.status.name != "FAILED":
            assert_sample_matches_server(sample, server, routing_key=sample.session_id)
    return done


def termination(sample: Any) -> Termination:
    record = EpisodeRecord.of(sample)
    assert record is not None, sample.metadata
    return record.termination


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


def scheduler_refusal(input_tokens: int, bound: int) -> Fault:
    """SGLang 0.5.23 scheduler's refusal, word for word (sglang-0.5.23-answers/error_scheduler_max_input_len)."""
    message = (
        f"Input length ({input_tokens} tokens) exceeds the maximum allowed length ({bound} tokens). Use a "
        "shorter input or enable --allow-auto-truncate."
    )
    return Fault(status=400, body={"error": {"message": message}})


def anomaly_for(body: dict[str, Any], headers: dict[str, str]) -> Turn | Fault:
    """The odd answer: a limit just under this very request's input."""
    length = len(body["input_ids"])
    return scheduler_refusal(length, length - 1)


def client_of(args: Any) -> SGLangClient:
    return SlimeConfig.of(args).runtime.client


# -- an anomaly ---------------------------------------------------------------------------------------------


async def test_an_anomalous_refusal_ends_only_its_sample(slime, tokenizer, caplog):
    """Eight episodes are served; in the next batch one request is refused naming a limit below inputs the server
    served: that sample ends context_full, the window stays, every other sample (of this batch and the next) is
    sized as before and completes, and one WARNING says what happened."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    with SGLangTestServer(tokenizer, context_length=32768) as server:
        args, url = slime_args(server), server.base_url
        first = await batch(slime, server, args, [(CALL_ADD, ANSWER)] * 8)
        assert {s.status.name for s in first} == {"COMPLETED"}
        served = max(len(r.body["input_ids"]) for r in server.generate_requests)
        caplog.clear()

        server.responder = anomaly_for  # the odd sample's second turn: no script, so the responder answers
        second = await batch(
            slime, server, args, [(CALL_ADD, ANSWER)] * 3 + [(CALL_ADD,)] + [(CALL_ADD, ANSWER)] * 4
        )
        odd = second[3]
        assert termination(odd) is Termination.CONTEXT_FULL and odd.status.name == "TRUNCATED"
        (refused,) = [r for r in session_requests(server, odd) if r.body["rid"] not in server.meta_infos]
        length = len(refused.body["input_ids"])
        assert length <= served, "the named limit is below an input the server served"
        assert [s.status.name for i, s in enumerate(second) if i != 3] == ["COMPLETED"] * 7
        assert await client_of(args).context_length() == 32768, "the window did not move"

        third = await batch(slime, server, args, [(CALL_ADD, ANSWER)] * 8)
        assert {s.status.name for s in third} == {"COMPLETED"}
        budgets = {
            tuple(r.body["sampling_params"]["max_new_tokens"] for r in session_requests(server, sample))
            for sample in [*first, *second, *third]
            if sample is not odd
        }
        assert len(budgets) == 1, f"every other sample sized as before the odd answer: {budgets}"
        assert len(session_requests(server, odd)) == 2, "the refused turn is not sent again"

    (line,) = warnings(caplog)
    assert line.startswith(f"SGLang at {url} named a context window of {length + 5} tokens")
    assert f"a request of {served} input tokens" in line and "the window stays 32768 tokens" in line
    assert metrics.server_metrics(args) == {"context_window": 32768.0}


async def test_an_anomaly_before_anything_was_served_is_undone_by_the_next_answer(slime, tokenizer, caplog):
    """The odd answer comes first, before any request was served, so nothing contradicts it yet and the window
    shrinks; the requests in flight meanwhile (sized for the window before) are served, which contradicts it: the
    window is back before any other sample sizes a turn by it."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    count = 6
    with SGLangTestServer(tokenizer, context_length=32768) as server:
        args, url = slime_args(server), server.base_url
        client = client_of(args)
        samples = [
            slime.Sample(prompt="What is 2+3?", label="5", index=0, session_id=str(uuid.uuid4()))
            for _ in range(count)
        ]
        odd = samples[-1]
        turns: dict[str | None, int] = {}
        shrunk = threading.Event()

        def responder(body: dict[str, Any], headers: dict[str, str]) -> Turn | Fault:
            key = headers.get("x-smg-routing-key")
            turns[key] = turns.get(key, 0) + 1
            if turns[key] > 1:
                return Turn(ANSWER)
            deadline = time.monotonic() + 60
            while len(server.generate_requests) < count and time.monotonic() < deadline:
                time.sleep(0.01)  # every first turn is in flight before the odd answer
            if key == odd.session_id:
                return anomaly_for(body, headers)
            # The others are served once the odd answer shrank the window. The first of them served restores it,
            # so the one that sees it shrunk releases the rest (each polling the window alone could miss it).
            while not shrunk.wait(0.01) and time.monotonic() < deadline:
                if client.window.tokens != 32768:
                    shrunk.set()
            assert shrunk.is_set(), "the odd answer never shrank the window"
            return Turn(CALL_ADD)

        server.responder = responder
        done = await asyncio.gather(*(slime.generate_and_rm(args, s, dict(SLIME_PARAMS)) for s in samples))
        assert (
            odd.status.name == "FAILED" and EpisodeRecord.of(odd).error == "no token generated (context_full)"
        )
        assert [s.status.name for s in done[:-1]] == ["COMPLETED"] * (count - 1)
        budgets = set()
        for sample in done[:-1]:
            assert_sample_matches_server(sample, server, routing_key=sample.session_id)
            budgets.add(
                tuple(r.body["sampling_params"]["max_new_tokens"] for r in session_requests(server, sample))
            )
        ((first, _),) = budgets
        assert first == SLIME_PARAMS["max_new_tokens"], "every sample sized alike, none by the odd limit"
        assert client.window.tokens == 32768
    prompt = len(session_requests(server, odd)[0].body["input_ids"])
    shrunk, back = warnings(caplog)
    assert shrunk == (
        f"SGLang at {url}: context window 32768 tokens -> {prompt + 5} tokens: a refusal of {prompt} input "
        "tokens named it; nothing the server served contradicts it"
    )
    assert back.startswith(f"SGLang at {url}: context window {prompt + 5} tokens -> 32768 tokens: ")
    assert back.endswith(f"contradicts the limit of {prompt + 5} tokens a refusal named: an anomaly")


# -- real changes -------------------------------------------------------------------------------------------


def fits(request: Any, window: int) -> bool:
    body = request.body
    return (
        len(body["input_ids"]) + body["sampling_params"]["max_new_tokens"] <= window - SGLANG_CONTEXT_MARGIN
    )


async def test_a_kv_pool_smaller_than_the_context_is_learned_once_and_every_later_sample_fits(
    slime, tokenizer, caplog
):
    """/v1/models says 4096; the KV pool holds 1024, so SGLang's scheduler refuses inputs of 1018 tokens or more.
    The first sample whose input outgrows it is refused, which nothing served contradicts: the window becomes
    1024 (one WARNING, old -> new), and every request after it fits."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with SGLangTestServer(tokenizer, context_length=4096, kv_capacity=1024) as server:
        args, url = slime_args(server), server.base_url
        (short,) = await batch(slime, server, args, [(CALL_ADD, ANSWER)])
        assert short.status.name == "COMPLETED"
        assert metrics.server_metrics(args) == {"context_window": 4096.0}, "the window in use, in the metrics"
        (long,) = await batch(slime, server, args, [(BIG, ANSWER)])
        assert termination(long) is Termination.CONTEXT_FULL
        refused = [r for r in server.generate_requests if r.body["rid"] not in server.meta_infos]
        assert len(refused) == 1 and len(refused[0].body["input_ids"]) >= server.max_req_input_len
        assert client_of(args).window.tokens == 1024
        assert metrics.server_metrics(args) == {"context_window": 1024.0}
        sent = len(server.generate_requests)

        later = await batch(slime, server, args, [(CALL_ADD, ANSWER)] * 3 + [(BIG, ANSWER)] * 3)
        assert [s.status.name for s in later[:3]] == ["COMPLETED"] * 3
        assert all(s.status.name != "FAILED" for s in later), [EpisodeRecord.of(s).error for s in later]
        assert all(fits(r, 1024) for r in server.generate_requests[sent:]), (
            "every later request fits the pool"
        )
        assert all(r.body["rid"] in server.meta_infos for r in server.generate_requests[sent:]), (
            "none refused"
        )
    (change,) = warnings(caplog)
    assert change.startswith(f"SGLang at {url}: context window 4096 tokens -> 1024 tokens: a refusal of")


async def test_a_cold_start_learns_the_window_from_the_first_refusal_once(slime, tokenizer, caplog):
    """A server that reports no window: the first turns, sized for none, are refused with SGLang's text naming it;
    the window is learned once (one WARNING, unknown -> 1024) and the turns are sent again, clamped."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    recipe = {**SLIME_PARAMS, "max_new_tokens": 40960}
    with SGLangTestServer(tokenizer, context_length=1024, report_window=False) as server:
        args, url = slime_args(server), server.base_url
        samples = [
            slime.Sample(prompt="What is 2+3?", label="5", index=0, session_id=str(uuid.uuid4()))
            for _ in range(4)
        ]
        for sample in samples:
            server.script(CALL_ADD, ANSWER, key=sample.session_id)
        done = await asyncio.gather(*(slime.generate_and_rm(args, s, dict(recipe)) for s in samples))
        assert [s.status.name for s in done] == ["COMPLETED"] * 4
        assert client_of(args).window.tokens == 1024
        assert metrics.server_metrics(args) == {"context_window": 1024.0}
    (learned,) = warnings(caplog)
    assert learned.startswith(f"SGLang at {url}: context window unknown -> 1024 tokens: a refusal of")
    assert learned.endswith("named it; the server reports none")
