"""Partial rollout against the REAL SGLang 0.5.23, through slime's real ``generate_and_rm`` and its abort (the
flag, then ``/abort_request`` with ``abort_all`` until ``/v1/loads`` says idle), as ``--partial-rollout
--mask-offpolicy-in-partial-rollout`` runs it: episodes cut mid-turn, their samples handed back (a pickle hop,
slime's buffer) to a second ``generate_and_rm`` that continues them. Greedy: the random-weight model is
deterministic, one request at a time, so a continued episode can be compared with the same episode run straight
through. The module's episodes run in ONE driver process (slime's import is most of its cost).

What the real server answers an abort mid-turn: ``finish_reason`` ``{"type": "abort", "message": "Aborted"}``
with the ``output_ids`` written so far and their ``output_token_logprobs`` (``completion_tokens`` = their
number, ``weight_versions`` covering them). An unconstrained turn continued from them (input = the trajectory
+ the partial output, ``max_new_tokens`` = what the cut left) ends exactly as the uninterrupted turn, token
and logprob. A grammar restarts at each request's first output token (xgrammar), so a constrained turn
continued that way writes its whole constrained text again: such a turn is asked again from its input.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from real_sglang.real_helpers import call, literal, server_loads
from real_sglang.recording_proxy import Exchange, RecordingProxy
from real_sglang.server_setup import wait_idle
from real_sglang.slime_runner import finish_slime, start_slime
from slime_strands._slime.partial_rollout import CHECKPOINT_KEY
from slime_strands.agent.checkpoint import EpisodeCheckpoint
from slime_strands.testing.invariants import assert_sample_matches_server

pytestmark = [pytest.mark.real_sglang, pytest.mark.timeout(600)]

SLIME = {"partial_rollout": True, "mask_offpolicy_in_partial_rollout": True}
STRANDS = {
    "tools": ["rollout_tools.echo"],
    "system_prompt": "You echo text with the echo tool.",
    "max_tool_iters": 1,
    "retry_delay_s": 0.05,
    "max_retries": 3,
}
GREEDY = {
    "temperature": 0.0, "top_p": 1.0, "top_k": -1, "stop": None, "stop_token_ids": None,
    "skip_special_tokens": False, "no_stop_trim": True, "spaces_between_special_tokens": False,
}  # fmt: skip
"""What slime's GenerateState sends (temperature 0)."""
WRITTEN_BEFORE_ABORT = 6
"""Tokens the cut turn has written when the test asks for slime's abort. The abort lands some 15 decode steps
later on a loaded 2-core machine (two 20 ms polls and two HTTP calls, measured); the cut turns are over 100
tokens long, so it lands mid-turn."""
WAIT_S = 240.0
FREE_TURN = {"ignore_eos": True, "max_new_tokens": 128}
"""One unconstrained turn with no end (greedy, ``ignore_eos``): it runs to its budget unless cut."""
ECHO = call("echo", text=" ".join(f"word{i}" for i in range(24)))
"""The call every turn of the constrained episode writes (~115 tokens: the random model splits the forced
text into small tokens): turn 1 runs the tool, turn 2 is over the tool limit (``max_tool_iters`` 1), so the
episode ends TRUNCATED."""
CONSTRAINED = {"regex": literal(ECHO), "max_new_tokens": 512}
"""slime's ``max_new_tokens`` is the episode's response budget: both calls and the tool's result fit."""


@dataclass(frozen=True)
class Cut:
    """One episode of the module's run: the job (its ``session_id`` routes its requests), the sample slime's
    abort left, the sample the next step finished, and the episode run straight through where there is one."""

    job: dict[str, Any]
    aborted: SimpleNamespace
    continued: SimpleNamespace
    straight: SimpleNamespace | None

    @property
    def key(self) -> str:
        return str(self.job["session_id"])


@dataclass(frozen=True)
class PartialRun:
    proxy: RecordingProxy
    free: Cut
    """An unconstrained turn cut mid-generation (turn 1), and the same episode straight through."""
    constrained: Cut
    """A grammar-constrained episode cut mid-way through turn 2 (after a tool run)."""


def job(params: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "session_id": str(uuid.uuid4()),
        "prompt": "Echo the text.",
        "label": "5",
        "sampling_params": {**GREEDY, **params},
        **extra,
    }


def abort_mid_turn(proxy: RecordingProxy, base_url: str, key: str, turn: int, flag: Path) -> None:
    """Ask for slime's abort (the driver polls ``flag``) once the episode's ``turn``-th request runs and has
    written some tokens (the server's own load report counts them)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        requests = proxy.generations(key)
        if len(requests) >= turn and requests[turn - 1].status is None:
            loads = server_loads(base_url)
            written = loads.used_tokens - len(requests[turn - 1].body["input_ids"])
            if loads.running and written >= WRITTEN_BEFORE_ABORT:
                break
        assert time.monotonic() < deadline, f"turn {turn} never ran: {[e.status for e in requests]}"
        time.sleep(0.02)  # polling the proxy's record and the server's load report, bounded above
    flag.touch()


@pytest.fixture(scope="module")
def partial_run(sglang_server, tmp_path_factory) -> Iterator[PartialRun]:
    """slime's two steps for both episodes in one driver: each cut episode is aborted (the test picks the
    moment, the driver aborts as slime does) then continued; the straight episode runs in between."""
    flags = tmp_path_factory.mktemp("partial-aborts")
    free = job(FREE_TURN, abort_file=str(flags / "free"), **{"continue": True})
    straight = job(FREE_TURN)
    constrained = job(CONSTRAINED, abort_file=str(flags / "constrained"), **{"continue": True})
    wait_idle(sglang_server.base_url)
    with RecordingProxy(sglang_server.base_url) as proxy:
        driver = start_slime(proxy, [free, straight, constrained], STRANDS, SLIME)
        try:
            abort_mid_turn(proxy, sglang_server.base_url, free["session_id"], 1, flags / "free")
            abort_mid_turn(proxy, sglang_server.base_url, constrained["session_id"], 2, flags / "constrained")
        except BaseException:
            driver.kill()
            driver.wait()
            raise
        free_aborted, free_continued, reference, cut_aborted, cut_continued = finish_slime(driver)
        yield PartialRun(
            proxy,
            Cut(free, free_aborted, free_continued, reference),
            Cut(constrained, cut_aborted, cut_continued, None),
        )
    wait_idle(sglang_server.base_url)


def partial_output(exchange: Exchange) -> tuple[list[int], list[float]]:
    """The tokens and logprobs the server answered an abort with (it must be an abort mid-turn)."""
    meta = exchange.answer["meta_info"]
    assert meta["finish_reason"] == {
        "type": "abort",
        "message": "Aborted",
        "status_code": None,
        "err_type": None,
    }
    ids, entries = exchange.answer["output_ids"], meta["output_token_logprobs"]
    assert 0 < len(ids) == len(entries) == meta["completion_tokens"], "the partial output, with its logprobs"
    assert [e[1] for e in entries] == ids
    return ids, [e[0] for e in entries]


def assert_same_as_straight(continued: Any, straight: Any, masked_before: int) -> None:
    """The continued sample is the uninterrupted one: tokens, logprobs (as sampled), the mask but for the
    tokens slime masked as off-policy, the ending."""
    assert continued.status == straight.status and continued.tokens == straight.tokens
    assert continued.response_length == straight.response_length
    assert continued.rollout_log_probs == pytest.approx(straight.rollout_log_probs, abs=1e-4)
    assert continued.loss_mask == [0] * masked_before + straight.loss_mask[masked_before:]
    assert continued.metadata["strands"]["termination"] == straight.metadata["strands"]["termination"]


def test_an_unconstrained_turn_cut_mid_generation_is_continued_from_its_partial_output(partial_run):
    """One long turn (no end: ``ignore_eos``) cut by slime's abort: the server's partial output and logprobs
    stay on the sample and in its checkpoint; the next step's request is the saved trajectory WITH the partial
    output, asking for what the cut left of the turn; the finished sample is the uninterrupted one."""
    proxy, cut = partial_run.proxy, partial_run.free
    aborted, continued = cut.aborted, cut.continued
    first, resent = proxy.generations(cut.key)
    ids, logprobs = partial_output(first)
    assert aborted.status == "ABORTED" and aborted.reward is None
    assert aborted.tokens == first.body["input_ids"] + ids, "the partial output is on the aborted sample"
    assert aborted.rollout_log_probs == logprobs, "with the logprobs the server answered"
    saved = EpisodeCheckpoint.from_data(aborted.metadata[CHECKPOINT_KEY])
    assert saved.trajectory.rebuild().token_ids == aborted.tokens and saved.model.pending is not None

    assert resent.body["input_ids"] == aborted.tokens, "the next request: the saved trajectory + partial turn"
    sent = first.body["sampling_params"]["max_new_tokens"]
    assert resent.body["sampling_params"]["max_new_tokens"] == sent - len(ids), (
        "the rest of the turn's budget"
    )
    assert CHECKPOINT_KEY not in continued.metadata and continued.metadata["strands"]["continuations"] == 1
    assert continued.tokens[: len(aborted.tokens)] == aborted.tokens
    assert continued.response_length == sent, "one turn of its whole budget: partial + continuation"
    seam = len(ids)
    assert_sample_matches_server(continued, proxy, routing_key=cut.key, masked_before=seam)
    assert continued.weight_versions == ["default", "default"], "one per server answer"
    assert_same_as_straight(continued, cut.straight, masked_before=seam)


def test_a_grammar_constrained_tool_call_cut_mid_turn_is_asked_again(partial_run):
    """Grammar-constrained tool calls (``regex``: the model writes a long echo call): turn 1 runs the tool,
    slime's abort cuts turn 2 mid-generation. The server answers the partial output (the grammar's text so
    far), but a continuation of it would restart the grammar: the sample and its checkpoint end on turn 2's
    input, the next step asks turn 2 again with its whole budget, writes the same turn (greedy: the partial
    output is its start) and the episode ends as the uninterrupted one would (turn 2's call over the tool
    limit: TRUNCATED)."""
    proxy, cut = partial_run.proxy, partial_run.constrained
    aborted, continued = cut.aborted, cut.continued
    turn1, turn2, again = proxy.generations(cut.key)
    assert turn1.finish_type == "stop"
    ids, _ = partial_output(turn2)
    assert aborted.status == "ABORTED" and aborted.tokens == turn2.body["input_ids"], (
        "the constrained turn's partial output is not kept: it cannot be continued under its grammar"
    )
    saved = EpisodeCheckpoint.from_data(aborted.metadata[CHECKPOINT_KEY])
    assert saved.trajectory.rebuild().token_ids == aborted.tokens
    assert [m["role"] for m in saved.messages] == ["user", "assistant", "user"], "the tool's result is kept"

    assert again.body["input_ids"] == aborted.tokens, "the next request is the saved trajectory"
    assert again.body["sampling_params"] == turn2.body["sampling_params"], "the whole turn, its grammar too"
    assert again.finish_type == "stop"
    assert again.answer["output_ids"][: len(ids)] == ids, "the same turn as the one cut (greedy)"
    assert len(ids) < len(again.answer["output_ids"]), "cut mid-turn"
    assert continued.status == "TRUNCATED" and continued.metadata["strands"]["termination"] == "tool_limit"
    seam = len(aborted.tokens) - (len(continued.tokens) - continued.response_length)
    assert_sample_matches_server(continued, proxy, routing_key=cut.key, masked_before=seam)
    assert continued.loss_mask[seam:].count(1) == len(again.answer["output_ids"]), (
        "the turn asked again is the one trainable part"
    )
