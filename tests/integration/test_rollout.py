"""slime's entry point end to end: generate() against the local SGLang-protocol server, real tokenizer,
real Strands agent; every produced Sample is checked against the server's records."""

from __future__ import annotations

import asyncio
import copy
import inspect
import json

import pytest
from conftest import qwen3_tokenizer_path
from rollout_tools import ABORT_FLAG, CALLS
from slime_helpers import (
    CALL_ADD,
    SLIME_PARAMS,
    Sample,
    answered,
    install_generate_state,
    make_args,
    new_sample,
    record,
    run,
    session_requests,
    slime_args,
)
from standin_kit import QWEN3_EOS

from slime_strands import metrics, reward, rollout
from slime_strands.agent.record import Termination
from slime_strands.provider.client import SGLangClient
from slime_strands.testing import Fault, SGLangTestServer, Turn
from slime_strands.testing.invariants import assert_sample_invariants, assert_sample_matches_server

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=8192, eos_tokens=QWEN3_EOS) as srv:  # Qwen3's end ids
        yield srv


def test_signature_matches_slime_contract():
    names = list(inspect.signature(rollout.generate).parameters)
    assert names[:3] == ["args", "sample", "sampling_params"]
    assert "evaluation" in names
    assert inspect.iscoroutinefunction(rollout.generate)


async def test_solve_with_tool_call(server, tokenizer):
    CALLS["add"] = 0
    sample = new_sample()
    out = await run(server, make_args(server), sample, CALL_ADD, "The sum is 5.\nAnswer: \\boxed{5}")
    assert out.status == Sample.Status.COMPLETED
    assert CALLS["add"] == 1
    assert out.reward is None  # slime scores it
    assert out.tool_iters == 1 and out.tool_calls == 1
    meta = record(out)
    assert meta.termination is Termination.END_TURN and meta.turns == 2 and meta.evaluation is False
    assert meta.parse_errors == {} and meta.tool_errors == 0
    assert meta.cached_tokens > 0 and meta.prompt_tokens > meta.cached_tokens
    assert "<tool_response>\n5\n</tool_response>" in out.response
    assert out.response.endswith("Answer: \\boxed{5}<|im_end|>")
    assert out.response == tokenizer.decode(out.tokens[-out.response_length :], skip_special_tokens=False)
    assert out.weight_versions == ["0", "0"]
    # Every turn is routed with the sample's session id; the default system prompt asks for \boxed{}.
    requests = [
        r for r in server.generate_requests if r.headers.get("x-smg-routing-key") == sample.session_id
    ]
    assert len(requests) == 2
    prompt_text = tokenizer.decode(out.tokens[: len(out.tokens) - out.response_length])
    assert "\\boxed{" in prompt_text and "execute_python_code" in prompt_text


async def test_sampling_params_translated_not_mutated(server):
    params = {**SLIME_PARAMS, "custom_params": {"return_top_p_token_ids": True}, "top_p": 0.9}
    frozen = copy.deepcopy(params)
    sample = new_sample()
    await run(server, make_args(server, rollout_top_p=0.9), sample, "Answer: 5", params=params)
    assert params == frozen
    sent = server.generate_requests[-1].body["sampling_params"]
    assert sent["custom_params"] == {"return_top_p_token_ids": True}, "top-p replay needs custom_params"
    assert "stop" not in sent and sent["top_p"] == 0.9
    assert sent["max_new_tokens"] <= 2048 and 151645 in sent["stop_token_ids"]


async def test_tool_limit_truncates_cleanly(server):
    sample = new_sample()
    args = make_args(server, strands={"max_tool_iters": 2})
    out = await run(server, args, sample, CALL_ADD, CALL_ADD, CALL_ADD)
    assert out.status == Sample.Status.TRUNCATED
    assert record(out).termination is Termination.TOOL_LIMIT
    assert out.tool_iters == 2
    assert out.response.endswith("</tool_call><|im_end|>")  # ends on the model's (unexecuted) third call
    assert out.response.count("<tool_response>") == 2


async def test_response_budget_is_whole_trajectory(server):
    sample = new_sample()
    args = make_args(server, rollout_max_response_len=80)
    long_answer = "word " * 200
    params = {**SLIME_PARAMS, "max_new_tokens": 80}
    out = await run(server, args, sample, CALL_ADD, long_answer, params=params)
    assert out.status == Sample.Status.TRUNCATED
    assert out.response_length == 80  # generated + tool tokens together fill the budget exactly
    second = server.generate_requests[-1].body
    first_out = len(server.answers[server.generate_requests[-2].body["rid"]][0])
    observation = len(second["input_ids"]) - len(server.generate_requests[-2].body["input_ids"]) - first_out
    assert second["sampling_params"]["max_new_tokens"] == 80 - first_out - observation


async def test_context_window_exhausted(server):
    probe = await run(server, make_args(server), new_sample(), "Answer: 5")
    prompt_len = len(probe.tokens) - probe.response_length
    args = make_args(server, rollout_max_context_len=prompt_len + 40)
    out = await run(server, args, new_sample(), CALL_ADD, "word " * 100)
    assert out.status == Sample.Status.TRUNCATED
    assert record(out).termination is Termination.CONTEXT_FULL  # the second turn is clamped to the room left
    assert len(out.tokens) == prompt_len + 40
    # A context too small for the tool result: the episode ends on the first answer, context_full.
    args = make_args(server, rollout_max_context_len=prompt_len + 30)
    out = await run(server, args, new_sample(), CALL_ADD, "never")
    assert out.status == Sample.Status.TRUNCATED
    assert record(out).termination is Termination.CONTEXT_FULL
    assert out.response.endswith("</tool_call><|im_end|>")


async def test_huge_tool_output_truncated_by_tokens(server, tokenizer):
    sample = new_sample()
    args = make_args(server, strands={"max_tool_output_tokens": 200})
    call = '<tool_call>\n{"name": "huge_output", "arguments": {"n": 5000}}\n</tool_call>'
    out = await run(server, args, sample, call, "Answer: 5")
    assert out.status == Sample.Status.COMPLETED
    assert record(out).tool_outputs_truncated == 1
    assert "tool output truncated" in out.response
    assert "line 0:" in out.response and "line 4999:" in out.response  # head and tail kept
    assert out.response_length < 400


async def test_server_abort_outside_slimes_abort_retries_the_turn(server, monkeypatch, tokenizer):
    """A worker restarting behind the router aborts a request slime did not abort: the turn is sent again
    (its partial output discarded) and the episode goes on."""
    install_generate_state(monkeypatch, tokenizer)
    sample = new_sample()
    cut = Turn("partial answer", finish="abort", abort_message="worker restarted")
    out = await run(server, make_args(server), sample, CALL_ADD, cut, "Answer: 5")
    assert out.status == Sample.Status.COMPLETED and record(out).termination is Termination.END_TURN
    second, retry = session_requests(server, sample)[1:]
    assert second.body["input_ids"] == retry.body["input_ids"] and second.body["rid"] != retry.body["rid"]
    assert "partial answer" not in out.response


async def test_server_aborting_every_time_fails_the_sample_with_the_reason(server, monkeypatch, tokenizer):
    install_generate_state(monkeypatch, tokenizer)
    sample = new_sample()
    cut = Turn("partial", finish="abort", abort_message="worker restarted")
    args = make_args(server, strands={"server_abort_retries": 2})
    out = await run(server, args, sample, CALL_ADD, cut, cut, cut)
    assert out.status == Sample.Status.FAILED and out.remove_sample is True and out.reward == 0.0
    assert record(out).error == (
        "SGLangAbortError: the server aborted the request 3 times without being asked to: worker restarted"
    )
    assert len(session_requests(server, sample)) == 4


async def test_no_server_abort_retries_ends_the_episode_aborted_at_the_first_abort(
    server, monkeypatch, tokenizer
):
    """``server_abort_retries: 0`` (slime's fully-async rollout, whose weight update aborts requests without slime's
    flag): the first abort the server answers ends the episode ABORTED, not FAILED and not sent again, so that
    slime's worker hands its group back; the turns before it are kept."""
    install_generate_state(monkeypatch, tokenizer)
    sample = new_sample()
    cut = Turn("partial", finish="abort", abort_message="paused for a weight update")
    args = make_args(server, strands={"server_abort_retries": 0})
    out = await run(server, args, sample, CALL_ADD, cut, "never sent")
    assert out.status == Sample.Status.ABORTED and out.reward is None and not out.remove_sample
    assert record(out).termination is Termination.ABORTED and record(out).turns >= 1
    assert len(session_requests(server, sample)) == 2


async def test_slime_abort_flag_stops_between_turns(server, monkeypatch, tokenizer):
    state = install_generate_state(monkeypatch, tokenizer)
    ABORT_FLAG["state"] = state
    args = make_args(server, strands={"tools": ["rollout_tools.abort_now"]})
    call = '<tool_call>\n{"name": "abort_now", "arguments": {"reason": "x"}}\n</tool_call>'
    sample = new_sample()
    out = await run(server, args, sample, call, "never generated")
    assert out.status == Sample.Status.ABORTED and out.reward is None
    assert (
        len([r for r in server.generate_requests if r.headers.get("x-smg-routing-key") == sample.session_id])
        == 1
    )
    # Already aborted before starting: no request at all.
    late = new_sample()
    out = await rollout.generate(args, late, dict(SLIME_PARAMS))
    assert out.status == Sample.Status.ABORTED
    assert not [r for r in server.generate_requests if r.headers.get("x-smg-routing-key") == late.session_id]


async def test_slime_abort_of_a_running_request_is_aborted_not_retried(server, monkeypatch, tokenizer):
    state = install_generate_state(monkeypatch, tokenizer)
    sample = new_sample()
    server.script(Turn("a long answer", delay_s=600), key=sample.session_id)  # only the abort answers it
    task = asyncio.create_task(rollout.generate(make_args(server), sample, dict(SLIME_PARAMS)))
    while not server.in_flight:
        await asyncio.sleep(0.01)
    state.aborted = True  # slime sets its flag, then aborts every request on every worker
    await SGLangClient(server.base_url).abort()
    out = await task
    assert out.status == Sample.Status.ABORTED and out.reward is None
    assert record(out).termination is Termination.ABORTED
    assert len(session_requests(server, sample)) == 1


async def test_partial_rollout_regenerates_from_prompt_when_asked(server, monkeypatch, tokenizer):
    """``resume_aborted: false``: a recycled sample starts again from its prompt (the default continues it:
    tests/integration/test_partial_rollout.py)."""
    state = install_generate_state(monkeypatch, tokenizer)
    ABORT_FLAG["state"] = state
    sample = new_sample()
    strands = {"tools": ["rollout_tools.abort_now"], "resume_aborted": False}
    args = make_args(server, partial_rollout=True, strands=strands)
    call = '<tool_call>\n{"name": "abort_now", "arguments": {"reason": "x"}}\n</tool_call>'
    out = await run(server, args, sample, call)
    assert out.status == Sample.Status.ABORTED and out.response_length > 0
    stale = list(out.tokens)
    state.aborted = False  # the next rollout step: slime hands the sample back
    server.requests.clear()
    out = await run(server, args, sample, "Answer: 5")
    assert out.status == Sample.Status.COMPLETED
    assert record(out).regenerations == 1
    assert out.tokens[-out.response_length :] != stale[-out.response_length :]
    assert out.loss_mask.count(1) == out.response_length  # no stale tokens left


async def test_server_down_gives_failed_sample_slime_can_train_around(tokenizer):
    args = slime_args(
        sglang_router_ip="127.0.0.1",
        sglang_router_port=9,  # discard port: nothing listens
        hf_checkpoint=qwen3_tokenizer_path(),
        rollout_max_response_len=128,
        strands={"tools": ["rollout_tools.add"], "retry_delay_s": 0.01, "max_retries": 2},
    )
    sample = new_sample()
    out = await rollout.generate(args, sample, dict(SLIME_PARAMS))
    assert out.status == Sample.Status.FAILED
    assert out.remove_sample is True and out.reward == 0.0
    assert out.response_length == 1 and out.loss_mask == [0] and out.rollout_log_probs == [0.0]
    assert len(out.tokens) > 1
    assert "SGLangConnectionError" in record(out).error


@pytest.mark.parametrize("fan_out", [False, True])
async def test_a_bug_writing_the_sample_fails_the_sample_not_the_step(server, monkeypatch, fan_out):
    """After the episode ran, a failure turning it into Sample fields still ends only this sample FAILED."""
    from slime_strands._slime import sample_writer

    def broken(self):
        raise RuntimeError("a bug in the appender")

    monkeypatch.setattr(sample_writer._Appender, "finish", broken)
    strands = {"tools": ["rollout_tools.add"], "collect_subagents": fan_out}
    args = make_args(server, strands=strands)
    sample = new_sample()
    server.script("Answer: 5", key=sample.session_id)
    out = await rollout.generate(args, sample, dict(SLIME_PARAMS))
    (out,) = out if fan_out else [out]
    assert out is sample and len(server.generate_requests) == 1
    assert out.status == Sample.Status.FAILED and out.remove_sample and out.reward == 0.0
    assert out.loss_mask == [0] and record(out).error == "RuntimeError: a bug in the appender"
    assert_sample_invariants(out)


async def test_503_burst_then_recovery(server):
    sample = new_sample()
    out = await run(
        server, make_args(server), sample, Fault(503), Fault(503), Fault(drop_connection=True), "Answer: 5"
    )
    assert out.status == Sample.Status.COMPLETED


async def test_malformed_calls_reach_model_and_are_counted(server):
    sample = new_sample()
    bad_json = '<tool_call>\n{"name": "add", "arguments": {"a": 2}\n</tool_call>'
    unknown = '<tool_call>\n{"name": "mul", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    out = await run(server, make_args(server), sample, bad_json, unknown, "Answer: 5")
    assert out.status == Sample.Status.COMPLETED
    meta = record(out)
    assert meta.parse_errors == {"bad_json": 1, "unknown_tool": 1}
    assert meta.tool_errors == 0
    assert "invalid tool call (bad_json)" in out.response and "unknown tool 'mul'" in out.response


async def test_system_message_in_data_wins(server, tokenizer):
    sample = new_sample(
        prompt=[{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+3?"}]
    )
    out = await run(server, make_args(server), sample, "5")
    prompt_text = tokenizer.decode(out.tokens[: len(out.tokens) - out.response_length])
    assert prompt_text.startswith("<|im_start|>system\nBe terse.")
    assert "boxed" not in prompt_text


async def test_eval_mode_shares_one_params_dict(server):
    shared = dict(SLIME_PARAMS, max_new_tokens=1024)
    frozen = copy.deepcopy(shared)
    samples = [new_sample() for _ in range(4)]
    for s in samples:
        server.script("Answer: 5", key=s.session_id)
    args = make_args(server)
    outs = await asyncio.gather(*(rollout.generate(args, s, shared, evaluation=True) for s in samples))
    assert shared == frozen
    for out in outs:
        assert out.status == Sample.Status.COMPLETED
        assert record(out).evaluation is True
        assert_sample_matches_server(out, server, routing_key=out.session_id)


async def test_64_samples_concurrently(server):
    samples = [new_sample() for _ in range(64)]
    for i, s in enumerate(samples):
        server.script(
            f'<tool_call>\n{{"name": "add", "arguments": {{"a": {i}, "b": 1}}}}\n</tool_call>',
            f"Answer: \\boxed{{{i + 1}}}",
            key=s.session_id,
        )
    args = make_args(server)
    outs = await asyncio.gather(*(rollout.generate(args, s, dict(SLIME_PARAMS)) for s in samples))
    for i, out in enumerate(outs):
        assert out.status == Sample.Status.COMPLETED, record(out)
        assert f"<tool_response>\n{i + 1}\n</tool_response>" in out.response
        assert_sample_matches_server(out, server, routing_key=out.session_id)


async def test_turn_stopped_by_other_eos_is_closed_with_end_of_turn(server, tokenizer):
    """Qwen3 also stops on <|endoftext|>: the next turn must still see a well-formed history."""
    sample = new_sample()
    endoftext = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    out = await run(server, make_args(server), sample, Turn(CALL_ADD, stop_token_id=endoftext), "Answer: 5")
    assert out.status == Sample.Status.COMPLETED
    assert "</tool_call><|endoftext|><|im_end|>\n<|im_start|>user\n<tool_response>\n5" in out.response
    at = out.tokens.index(endoftext)
    assert out.tokens[at + 1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert out.loss_mask[at - (len(out.tokens) - out.response_length)] == 1  # sampled
    assert out.loss_mask[at + 1 - (len(out.tokens) - out.response_length)] == 0  # appended by us


async def test_reward_grades_the_final_turn_only(server):
    """generate + math_reward as slime chains them: answers inside tool output or reasoning never count."""
    echo = '<tool_call>\n{"name": "echo", "arguments": {"text": "Answer: \\\\boxed{5}"}}\n</tool_call>'
    args = make_args(server, strands={"enable_thinking": True})
    cases = [
        ((echo, "<think>The tool says 5.</think>\n\nAnswer: \\boxed{5}"), False, 1.0),
        ((echo, "<think>Answer: \\boxed{5}</think>\n\nI give up: \\boxed{4}"), False, -1.05),
        ((echo, "<think>Answer: \\boxed{5}</think>\n\nI give up: \\boxed{4}"), True, 0.0),
        (("Answer: \\boxed{5}",), True, 1.0),
    ]
    for turns, evaluation, expected in cases:
        sample = new_sample()
        out = await run(server, args, sample, *turns, evaluation=evaluation)
        assert out.status == Sample.Status.COMPLETED
        final = out.response[-record(out).final_turn_chars :]
        assert final.endswith("<|im_end|>") and "<tool_response>" not in final
        if len(turns) > 1:
            assert "<tool_response>\nAnswer: \\boxed{5}\n</tool_response>" in out.response
        assert await reward.math_reward(args, out) == pytest.approx(expected), turns


async def test_metrics_aggregate_real_episodes(server):
    """The step metrics of real episodes equal what the server saw and served (not what generate wrote)."""
    bad = "<tool_call>\n{not json}\n</tool_call>"
    samples = [new_sample() for _ in range(3)]
    turns = [(CALL_ADD, "Answer: 5"), (bad, "Answer: 5"), (CALL_ADD, CALL_ADD, CALL_ADD)]
    args = make_args(server, strands={"max_tool_iters": 2})
    for s, script in zip(samples, turns, strict=True):
        await run(server, args, s, *script)
    m = metrics.aggregate(samples)
    served = [answered(server, s) for s in samples]
    metas = [meta for answers in served for (_, _, _, meta) in answers]
    generated = [sum(len(ids) for (_, ids, _, _) in answers) for answers in served]
    response = [
        len(answers[-1][0].body["input_ids"]) + len(answers[-1][1]) - len(answers[0][0].body["input_ids"])
        for answers in served
    ]
    assert m["samples"] == 3 and m["status/completed"] == pytest.approx(2 / 3)
    assert m["termination/end_turn"] == pytest.approx(2 / 3)
    assert m["termination/tool_limit"] == pytest.approx(1 / 3)
    assert m["turns_mean"] == pytest.approx(sum(len(a) for a in served) / 3) == pytest.approx((2 + 2 + 3) / 3)
    assert m["tool_calls_mean"] == pytest.approx((1 + 1 + 2) / 3)  # a malformed call is an attempt
    assert m["tool_error_rate"] == 0.0  # parse errors are counted apart from tool failures
    assert m["parse_errors_per_sample/bad_json"] == pytest.approx(1 / 3)
    assert m["cache_hit_rate"] == pytest.approx(
        sum(meta["cached_tokens"] for meta in metas) / sum(meta["prompt_tokens"] for meta in metas)
    )
    assert m["prompt_tokens_mean"] == pytest.approx(sum(meta["prompt_tokens"] for meta in metas) / 3)
    assert m["generated_tokens_mean"] == pytest.approx(sum(generated) / 3)
    assert m["response_tokens_mean"] == pytest.approx(sum(response) / 3)
    assert m["tool_token_share"] == pytest.approx(1 - sum(generated) / sum(response))
    assert m["generation_time_s_mean"] > 0 and m["wall_time_s_max"] >= m["wall_time_s_p50"] > 0


def _python_call(code: str) -> str:
    payload = json.dumps({"name": "execute_python_code", "arguments": {"code": code}})
    return f"<tool_call>\n{payload}\n</tool_call>"


async def test_default_math_agent_runs_code_in_the_sandbox(server):
    """The shipped tool end to end: sympy output and a runaway loop both come back as tool responses."""
    args = make_args(
        server,
        strands={"tools": ["slime_strands.sandbox.execute_python_code"], "sandbox": {"timeout_s": 2.0}},
    )
    sample = new_sample("Factor 1001.")
    out = await run(
        server,
        args,
        sample,
        _python_call("import sympy\nprint(sympy.factorint(1001))"),
        _python_call("while True:\n    pass"),
        "Answer: \\boxed{5}",
    )
    assert out.status == Sample.Status.COMPLETED
    assert "<tool_response>\n{7: 1, 11: 1, 13: 1}\n</tool_response>" in out.response
    assert "[timeout: killed after 2.0 s]" in out.response
    meta = record(out)
    assert meta.tool_calls == 2 and meta.tool_errors == 1 and meta.tool_time_s >= 2.0
    assert out.non_generation_time >= 2.0
