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
import threading
import uuid
from typing import Any

import pytest
from mcp_kit import (
    ANSWER,
    call,
    children,
    connections_to,
    held,
    http_mcp_server,
    http_server,
    stdio_server,
    tool_texts,
    wait_for,
)
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


def note(i: int) -> str:
    return f"note-{i}-{uuid.uuid4().hex[:8]}"


async def test_64_concurrent_episodes_each_see_only_their_own_notebook(slime, tokenizer):
    """64 episodes at once, each with a notebook of its own (scope: episode over streamable HTTP: one server
    process, an MCP session per episode): each writes its own line and reads back exactly that line (a session
    two episodes shared would show one of them two lines), and every episode's session is closed when it ends
    (no connection to the server is left)."""
    notes = [note(i) for i in range(64)]
    with http_mcp_server("notebook") as url, SGLangTestServer(tokenizer) as server:
        args = mcp_args(server, http_server(url, "notebook", scope="episode", max_live=64))
        scripts = [(call("notebook_write", text=n), call("notebook_read"), ANSWER) for n in notes]
        done = await batch(slime, server, args, scripts)
        assert [s.status.name for s in done] == ["COMPLETED"] * 64
        texts = [tool_texts(tokenizer, s) for s in done]
        assert texts == [["1 lines", n] for n in notes], "each episode saw only its own notebook"
        assert wait_for(lambda: not connections_to(url)), "every episode's session was closed"
        await close(args)


async def test_episode_scope_stdio_servers_are_a_process_per_episode_at_most_max_live_at_once(
    slime, tokenizer
):
    """Four episodes at once with an episode-scope notebook over stdio (at most 2 alive): each has a server
    process of its own and reads back only its own line; two were alive at once, never more; none is left
    afterwards."""
    notes = [note(i) for i in range(4)]
    peak = 0
    stop = asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, len(children()))
            await asyncio.sleep(0.05)

    with SGLangTestServer(tokenizer) as server:
        args = mcp_args(server, stdio_server("notebook", "notebook", scope="episode", max_live=2))
        watcher = asyncio.create_task(watch())
        scripts = [
            (call("notebook_write", text=n), call("notebook_read"), call("notebook_pid"), ANSWER)
            for n in notes
        ]
        done = await batch(slime, server, args, scripts)
        stop.set()
        await watcher
        assert [s.status.name for s in done] == ["COMPLETED"] * 4
        texts = [tool_texts(tokenizer, s) for s in done]
        assert [t[:2] for t in texts] == [["1 lines", n] for n in notes], (
            "each episode saw only its own notebook"
        )
        assert len({t[2] for t in texts}) == 4, "a server process per episode"
        assert peak == 2, f"{peak} servers alive at once with max_live 2"
        assert wait_for(lambda: not children()), "every episode's server was stopped"
        await close(args)


async def test_a_server_killed_mid_episode_is_a_tool_error_and_the_episode_goes_on(slime, tokenizer):
    """The episode's notebook server dies in a call: that call and the next are tool errors the model sees (a dead
    episode-scope server is not restarted within its episode), and the episode ends normally. The shared
    calculator dies too: the next call reopens it (a new process) and is answered."""
    with SGLangTestServer(tokenizer) as server:
        args = mcp_args(
            server, stdio_server("notebook", "notebook", scope="episode"), stdio_server("calc", "calc")
        )
        script = (
            call("notebook_write", text="kept?"),
            call("notebook_die"),
            call("notebook_read"),
            call("calc_pid"),
            call("calc_die"),
            call("calc_pid"),
            ANSWER,
        )
        (sample,) = await batch(slime, server, args, [script])
        assert sample.status.name == "COMPLETED"
        wrote, died, read, pid, calc_died, pid_after = tool_texts(tokenizer, sample)
        assert wrote == "1 lines"
        assert "closed the connection" in died and "notebook" in died
        assert "is not running" in read
        assert "closed the connection" in calc_died
        assert pid_after.isdigit() and pid_after != pid, "the shared server was reopened: a new process"
        assert record(sample).tool_errors == 3
        assert wait_for(lambda: len(children()) == 1), (
            "the notebook's process is gone, the calculator's stays"
        )
        await close(args)


async def test_a_hanging_tool_times_out_and_the_shared_session_still_answers(slime, tokenizer):
    """A call that hangs is a tool error after ``call_timeout_s``; the same shared session answers the next call
    (calls are multiplexed: other episodes were not held up by the hanging one)."""
    with SGLangTestServer(tokenizer) as server:
        args = mcp_args(server, stdio_server("calc", "calc", call_timeout_s=1))
        hung = (call("calc_hang", seconds=120), call("calc_add", a=2, b=3), ANSWER)
        quick = (call("calc_add", a=2, b=3), ANSWER)
        done = await batch(slime, server, args, [hung, quick, quick])
        assert [s.status.name for s in done] == ["COMPLETED"] * 3
        timed_out, added = tool_texts(tokenizer, done[0])
        assert "no answer within 1 s (call_timeout_s)" in timed_out and added == "5"
        assert record(done[1]).wall_time_s < record(done[0]).wall_time_s
        await close(args)


async def test_a_1mb_result_is_cut_like_any_tool_output(slime, tokenizer):
    """A 1 MB text result is fitted as a Python tool's is: cut to ``max_tool_output_tokens`` with the marker."""
    with SGLangTestServer(tokenizer) as server:
        args = mcp_args(server, stdio_server("calc", "calc"), max_tool_output_tokens=256)
        (sample,) = await batch(slime, server, args, [(call("calc_big", n_bytes=1_000_000), ANSWER)])
        assert sample.status.name == "COMPLETED"
        (shown,) = tool_texts(tokenizer, sample)
        assert "tokens of tool output truncated" in shown
        assert len(tokenizer.encode(shown)) < 400
        assert record(sample).tool_outputs_truncated == 1
        await close(args)


async def test_results_structured_errors_and_images_reach_the_model(slime, tokenizer):
    """Structured content (with its text), an error result (isError) and an image (a text model is told one
    was there) become tool results; the error counts as a tool error."""
    with SGLangTestServer(tokenizer) as server:
        args = mcp_args(server, stdio_server("calc", "calc"))
        script = (
            call("calc_stats", numbers=[1, 2]),
            call("calc_fail", reason="bad input"),
            call("calc_picture"),
            ANSWER,
        )
        (sample,) = await batch(slime, server, args, [script])
        stats, failed, picture = tool_texts(tokenizer, sample)
        assert '"mean": 1.5' in stats
        assert "Error executing tool fail" in failed
        assert picture == "[an image (image/png): this model cannot be shown images]"
        assert record(sample).tool_errors == 1
        await close(args)


async def test_a_name_clashing_with_a_python_tool_stops_the_run_at_the_first_sample(slime, tokenizer):
    """The calculator's ``add`` offered without a prefix is the Python tool ``add``'s name: a configuration error
    raised from the first sample, naming both and the fix; no server is left running."""
    with SGLangTestServer(tokenizer) as server:
        args = mcp_args(server, stdio_server("calc", "calc", prefix=None))
        with pytest.raises(ConfigurationError) as raised:
            await batch(slime, server, args, [(call("add", a=2, b=3), ANSWER)])
        assert str(raised.value) == (
            "MCP tool 'add' of server 'calc' has the name of the Python tool 'add': set mcp_servers[calc].prefix, "
            "or leave the tool out of mcp_servers[calc].tools"
        )
        assert wait_for(lambda: not children())


async def test_a_server_that_exits_at_start_stops_the_run_with_its_stderr(slime, tokenizer):
    with SGLangTestServer(tokenizer) as server:
        args = mcp_args(server, stdio_server("exits", "notes", scope="episode"))
        with pytest.raises(ConfigurationError) as raised:
            await batch(slime, server, args, [(ANSWER,)])
        message = str(raised.value)
        assert message.startswith("MCP server 'notes' (") and "failed to start" in message
        assert message.endswith(
            "stderr: starting the notes server | fatal: cannot open /nonexistent/notes.db"
        )
        assert "\n" not in message


async def test_an_allow_list_naming_a_tool_the_server_lacks_stops_the_run(slime, tokenizer):
    with SGLangTestServer(tokenizer) as server:
        args = mcp_args(server, stdio_server("calc", "calc", tools=["add", "multiply"]))
        with pytest.raises(
            ConfigurationError, match=r"MCP server 'calc' lists no tool 'multiply' \(it lists: "
        ):
            await batch(slime, server, args, [(ANSWER,)])
        assert wait_for(lambda: not children())


async def test_after_three_batches_no_server_process_thread_or_fd_is_left(slime, tokenizer):
    """Batches of 2 episodes with a shared and an episode-scope server: between batches only the shared server's
    process is alive, and once it is closed, after three more batches (6 episode servers started and stopped),
    the process holds no more children, threads or fds than after the first batch (which warmed the client's
    connection pool and the executor's threads, sized by the batch): what one episode's server left behind
    would show here 6 times."""
    with SGLangTestServer(tokenizer) as server:
        args = mcp_args(
            server, stdio_server("notebook", "notebook", scope="episode"), stdio_server("calc", "calc")
        )
        scripts = [(call("notebook_write", text="x"), call("calc_add", a=2, b=3), ANSWER)] * 2
        await batch(slime, server, args, scripts)
        await close(args)
        assert wait_for(lambda: not children())
        before = held()
        for _ in range(3):
            done = await batch(slime, server, args, scripts)
            assert {s.status.name for s in done} == {"COMPLETED"}
            assert wait_for(lambda: len(children()) == 1), "only the shared server is alive between batches"
        await close(args)
        assert wait_for(lambda: all(now <= then for now, then in zip(held(), before, strict=True))), (
            f"{held()} (children, threads, fds) after, {before} before: {[t.name for t in threading.enumerate()]}"
        )
