"""Issue 24, defect 1: a client timeout while the request waits in SGLang's queue (its KV pool full).

The client gives up on a queued request and sends it again; SGLang aborts the request of a client that hung up,
and its scheduler matches abort ids by PREFIX (``rid.startswith``): a retry whose id extends the original's
(``{rid}-retry1``) dies with it, the client blamed the server ("aborted on its own") and, after
``server_abort_retries``, FAILED the sample. Every attempt must carry an id unrelated by prefix to every other.

The KV pool (--max-total-tokens 4096) is filled by four long requests sent straight to the server (not through
the proxy): SGLang reserves a fixed-length request's whole length, so nothing else is admitted until they end
(over a thousand decode steps) or are aborted by their exact ids, which the tests do when they choose.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import AsyncIterator

import aiohttp
import pytest

from real_sglang.real_helpers import (
    GREEDY,
    check_record,
    literal,
    rid_prefix_pairs,
    run,
    server_loads,
    settings,
)
from real_sglang.recording_proxy import Exchange
from slime_strands.agent.record import Termination

pytestmark = [pytest.mark.real_sglang, pytest.mark.timeout(600)]

BLOCKERS, BLOCKER_INPUT, BLOCKER_OUTPUT = 4, 16, 1000
"""4 x (16 + 1,000) = 4,064 of the pool's 4,096 tokens, reserved whole (ignore_eos): every other request waits."""
TIMEOUT_S = 3.0
"""The client's request timeout (the turn itself, a few tokens, takes well under it once admitted)."""
SHORT_ANSWER = "\\boxed{5}"
BUSY_EPISODES, BUSY_TIMEOUT_S = 24, 2.0
"""Issue 32.2's busy server: more episodes than the pool runs at once, and a timeout shorter than their wait."""
WAIT_S = 180.0


class KVPool:
    """Four long requests that hold SGLang's KV pool until :meth:`release` aborts them by their exact ids."""

    def __init__(self, base_url: str, session: aiohttp.ClientSession) -> None:
        self.base_url = base_url
        self.session = session
        self.rids = [f"tier-blocker-{uuid.uuid4().hex}" for _ in range(BLOCKERS)]
        self.tasks: list[asyncio.Task[dict]] = []

    async def fill(self) -> None:
        for i, rid in enumerate(self.rids):
            rng = random.Random(i)
            body = {
                "input_ids": [rng.randrange(1000, 150000) for _ in range(BLOCKER_INPUT)],
                "rid": rid,
                "sampling_params": {"max_new_tokens": BLOCKER_OUTPUT, "ignore_eos": True, "temperature": 0.0},
            }
            self.tasks.append(asyncio.create_task(self._post("/generate", body)))
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while (loads := await asyncio.to_thread(server_loads, self.base_url)).running < BLOCKERS:
            assert asyncio.get_running_loop().time() < deadline, f"the pool never filled: {loads}"
            await asyncio.sleep(0.2)  # polling the server's load report, bounded above

    async def release(self) -> None:
        for rid in self.rids:  # exact ids: SGLang matches prefixes, and these share none with anything else
            await self._post("/abort_request", {"rid": rid})
        await asyncio.gather(*self.tasks)
        self.rids = []

    async def _post(self, path: str, body: dict) -> dict:
        async with self.session.post(self.base_url + path, json=body) as response:
            assert response.status == 200, await response.text()
            return await response.json() if path == "/generate" else {}


@contextlib.asynccontextmanager
async def filled_kv_pool(base_url: str) -> AsyncIterator[KVPool]:
    async with aiohttp.ClientSession() as session:
        pool = KVPool(base_url, session)
        try:
            await pool.fill()
            yield pool
        finally:
            if pool.rids:
                await pool.release()


async def wait_for(proxy, predicate, what: str) -> list[Exchange]:
    await asyncio.to_thread(proxy.wait_for, predicate, WAIT_S, what)
    return proxy.exchanges


async def test_a_queued_turn_that_times_out_is_sent_again_under_an_unrelated_id(
    proxy, tokenizer, sglang_server
):
    """Defect 1: the turn waits past the client's timeout, is sent again, and ends as if nothing happened."""
    plugin = settings(request_timeout_s=TIMEOUT_S, retry_delay_s=0.05, max_retries=60)
    params = {**GREEDY, "regex": literal(SHORT_ANSWER), "max_new_tokens": 64}
    async with filled_kv_pool(sglang_server.base_url) as pool:
        episode = asyncio.create_task(run(proxy, tokenizer, params, plugin=plugin))
        await wait_for(proxy, lambda ex: sum(e.path == "/generate" for e in ex) >= 2, "the turn sent again")
        await pool.release()
        record = await episode

    attempts = proxy.generations("episode")
    assert attempts[0].disconnected, "precondition: the first attempt waited past the client's timeout"
    assert all(e.body["input_ids"] == attempts[0].body["input_ids"] for e in attempts), "one turn, sent again"
    ids = [e.rid for e in attempts]
    assert len(set(ids)) == len(ids) and not rid_prefix_pairs(ids), (
        f"request ids related by prefix (SGLang's abort of one kills the others): {rid_prefix_pairs(ids)}"
    )
    aborted = [(e.rid, e.answer["meta_info"]["finish_reason"]) for e in attempts if e.finish_type == "abort"]
    assert not aborted, f"attempts aborted by the server: {aborted}"
    assert record.termination is Termination.END_TURN, record.error
    answered = check_record(record, proxy)
    assert [e.rid for e in answered] == [attempts[-1].rid]
    assert record.response.endswith(SHORT_ANSWER + "<|im_end|>"), record.response


async def test_a_busy_server_is_said_busy_once_not_dead(proxy, tokenizer, sglang_server, caplog):
    """Issue 32.2: many episodes at once and a timeout shorter than the queue's wait. The KV pool is held full
    until two requests have timed out (how long a free pool's queue takes depends on the machine: on a fast one
    nothing waited past the timeout, and the precondition failed in CI); then it is released and the episodes
    run a few at a time, the waiting ones timing out, aborted and sent again while the server answers the
    others. The log says so once, with what to change (the first wave times out before any answer: it then says
    none was answered), counts them once they stop, and never says the server stopped answering or answers
    again; every episode ends well."""
    caplog.set_level(logging.INFO, logger="slime_strands.provider.client")
    plugin = settings(request_timeout_s=BUSY_TIMEOUT_S, retry_delay_s=0.05, max_retries=60)
    params = {**GREEDY, "regex": literal(SHORT_ANSWER), "max_new_tokens": 400}
    async with filled_kv_pool(sglang_server.base_url) as pool:
        episodes = asyncio.gather(
            *(run(proxy, tokenizer, params, plugin=plugin, key=f"busy-{i}") for i in range(BUSY_EPISODES))
        )
        await wait_for(
            proxy,
            lambda ex: sum(e.path == "/generate" and e.disconnected for e in ex) >= 2,
            "two requests timed out",
        )
        await pool.release()
        records = await episodes
    assert [r.termination for r in records] == [Termination.END_TURN] * BUSY_EPISODES, [
        r.error for r in records
    ]
    timed_out = [e for e in proxy.exchanges if e.path == "/generate" and e.disconnected]
    assert len(timed_out) > 1, "precondition: requests waited past the client's timeout"
    for i, record in enumerate(records):
        check_record(record, proxy, key=f"busy-{i}")
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    warned = [text for level, text in lines if level == "WARNING"]
    assert len(warned) == 1, warned
    assert warned[0].startswith(f"requests to SGLang at {proxy.base_url} time out at {BUSY_TIMEOUT_S:g} s ")
    assert "Raise the request timeout" in warned[0] and "lower the concurrency" in warned[0]
    assert not any("stopped answering" in text or "answers again" in text for _, text in lines)
