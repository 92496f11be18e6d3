"""MCP servers' tools in episodes (issue 42), with REAL MCP servers (``tests/mcp_servers``, the ``mcp`` package's
FastMCP) through slime's REAL ``generate_and_rm``.

A shared server is one process for every episode; an episode-scope server is one process (stdio) or one MCP
session (streamable HTTP) per episode, killed when the episode ends. The model (the stand-in's script) calls
the tools by their offered names (``<prefix>_<tool>``); what the tools answered is read from the episode's
record, and every sample is checked against what the SGLang stand-in served.

Needs slime's source (``slime_helpers.slime_source``); CI always has it.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from mcp_kit import ANSWER, call, children, held, http_mcp_server, stdio_server, tool_texts, wait_for
from slime_helpers import SLIME_LOOP_FLAGS, SLIME_PARAMS, make_args

from slime_strands._slime.config import SlimeConfig
from slime_strands.agent.record import EpisodeRecord
from slime_strands.errors import ConfigurationError
from slime_strands.testing import SGLangTestServer
from slime_strands.testing.invariants import assert_sample_matches_server

pytestmark = pytest.mark.timeout(300)


def mcp_args(server: SGLangTestServer, *servers: dict[str, Any], **strands: Any) -> Any:
    settings = {"max_tool_iters": None, "mcp_servers": list(servers), **strands}
    return make_args(server, **SLIME_LOOP_FLAGS, strands=settings)


async def batch(slime: Any, server: SGLangTestServer, args: Any, scripts: list[tuple[Any, ...]]) -> list[Any]:
    """One sample per script, all at once through slime's ``generate_and_rm``; each sample not FAILED is
    checked against what the server saw and answered for it."""
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


def record(sample: Any) -> EpisodeRecord:
    found = EpisodeRecord.of(sample)
    assert found is not None, sample.metadata
    return found


async def close(args: Any) -> None:
    await SlimeConfig.of(args).runtime.mcp.aclose()


async def test_a_shared_stdio_server_answers_every_episode_from_one_process(slime, tokenizer):
    """Eight episodes call the shared calculator: one server process for all, the model sees each answer, the
    schema rendered in the prompt is the server's."""
    with SGLangTestServer(tokenizer) as server:
        args = mcp_args(server, stdio_server("calc", "calc"))
        done = await batch(slime, server, args, [(call("calc_add", a=2, b=3), call("calc_pid"), ANSWER)] * 8)
        assert {s.status.name for s in done} == {"COMPLETED"}
        texts = [tool_texts(tokenizer, s) for s in done]
        assert {t[0] for t in texts} == {"5"}
        assert len({t[1] for t in texts}) == 1, "one shared process answered every episode"
        assert len(children()) == 1
        prompt = tokenizer.decode(done[0].tokens[: len(done[0].tokens) - done[0].response_length])
        assert '"name": "calc_add"' in prompt and "Add two integers." in prompt
        await close(args)
        assert wait_for(lambda: not children())
