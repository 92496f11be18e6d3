"""MCP tools over streamable HTTP (a server someone else runs: shared, or a session of its own per episode) and
under slime's partial rollout (an aborted episode's server stops at the abort; its continuation gets a fresh
one), with the REAL MCP servers of ``tests/mcp_servers``."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from mcp_kit import ANSWER, call, children, http_mcp_server, stdio_server, tool_texts, wait_for
from partial_kit import LAYERS, TOPK, ContinuingPolicy, partial_args, wait_until
from slime_helpers import (
    SLIME_LOOP_FLAGS,
    SLIME_PARAMS,
    TOP_P_PARAMS,
    install_generate_state,
    make_args,
    new_sample,
)

from slime_strands import rollout
from slime_strands._slime.config import SlimeConfig
from slime_strands.agent.record import EpisodeRecord
from slime_strands.provider.client import SGLangClient
from slime_strands.testing import SGLangTestServer
from slime_strands.testing.invariants import assert_sample_matches_server

pytestmark = pytest.mark.timeout(300)


async def test_http_servers_shared_and_one_session_per_episode(slime, tokenizer):
    """16 episodes at once: a shared calculator over HTTP (one session), and a notebook over HTTP where each
    episode opens its own MCP session (its own session id, so its own notebook): each reads back only its own
    line, and the sessions it opened are closed (the server keeps no notebook for a closed session: a later
    episode starts empty)."""
    with (
        http_mcp_server("calc") as calc_url,
        http_mcp_server("notebook") as notes_url,
        SGLangTestServer(tokenizer) as server,
    ):
        servers = [
            {"name": "calc", "transport": "streamable_http", "url": calc_url},
            {"name": "notebook", "transport": "streamable_http", "url": notes_url, "scope": "episode"},
        ]
        args = make_args(server, **SLIME_LOOP_FLAGS, strands={"max_tool_iters": None, "mcp_servers": servers})
        notes = [f"note-{i}-{uuid.uuid4().hex[:6]}" for i in range(16)]
        samples = []
        for text in notes:
            sample = slime.Sample(prompt="What is 2+3?", label="5", index=0, session_id=str(uuid.uuid4()))
            server.script(
                call("notebook_write", text=text),
                call("notebook_read"),
                call("calc_add", a=2, b=3),
                ANSWER,
                key=sample.session_id,
            )
            samples.append(sample)
        done = await asyncio.gather(*(slime.generate_and_rm(args, s, dict(SLIME_PARAMS)) for s in samples))
        for sample, text in zip(done, notes, strict=True):
            assert sample.status.name == "COMPLETED"
            assert_sample_matches_server(sample, server, routing_key=sample.session_id)
            assert tool_texts(tokenizer, sample) == ["1 lines", text, "5"]
        await SlimeConfig.of(args).runtime.mcp.aclose()


async def test_an_aborted_episodes_server_stops_and_its_continuation_gets_a_fresh_one(tokenizer, monkeypatch):
    """slime aborts an episode while the model writes its third turn: the episode's notebook server is stopped
    at the abort (no process left while the sample waits in slime's buffer). The continuation starts a fresh
    server: its calls work, and a stateful tool's state is gone (the notebook is empty, another process)."""
    with SGLangTestServer(tokenizer, context_length=8192, routed_experts=(LAYERS, TOPK)) as server:
        state = install_generate_state(monkeypatch, tokenizer)
        policy = ContinuingPolicy(server, tokenizer)
        notebook = stdio_server("notebook", "notebook", scope="episode")
        args = partial_args(
            server, mask=False, tools=["rollout_tools.add"], strands={"mcp_servers": [notebook]}
        )
        turns = (
            call("notebook_pid"),
            call("notebook_write", text="before the abort"),
            call("notebook_read"),
            call("notebook_pid"),
            ANSWER,
        )
        sample = new_sample()
        policy.script(sample.session_id, *turns)
        policy.hold(sample.session_id, 3, "running")
        task = asyncio.create_task(rollout.generate(args, sample, dict(TOP_P_PARAMS)))
        await wait_until(lambda: policy.parked(sample.session_id) or task.done())
        assert len(children()) == 1
        state.aborted = True
        await SGLangClient(server.base_url).abort()
        out = await task
        state.aborted = False
        assert out.status.name == "ABORTED"
        assert wait_for(lambda: not children()), "the aborted episode's server stopped at the abort"

        out = await rollout.generate(args, out, dict(TOP_P_PARAMS))
        assert out.status.name == "COMPLETED"
        record = EpisodeRecord.of(out)
        assert record is not None and record.continuations == 1
        first_pid, wrote, read, second_pid = tool_texts(tokenizer, out)
        assert wrote == "1 lines" and read == "(empty)", (
            "the fresh server holds none of the first one's state"
        )
        assert first_pid.isdigit() and second_pid.isdigit() and first_pid != second_pid
        assert wait_for(lambda: not children())
