"""What current slime and real SGLang expect of generate(), case by case (issue 11), through real HTTP.

Every expectation is computed from what the test server saw and served (routing rows, top-p spans, spec
stats), from slime's own appender replaying those answers, or from slime's own group normalisation.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import qwen3_tokenizer_path
from slime_helpers import (
    CALL_ADD,
    SLIME_PARAMS,
    TOP_P_PARAMS,
    Sample,
    answered,
    as_array,
    make_args,
    new_sample,
    record,
    replay_with_slime_appender,
    run,
    session_requests,
    slime_args,
    slime_group_norm,
)

from slime_strands import SGLangClient, reward, rollout
from slime_strands._slime.config import SlimeConfig
from slime_strands.agent.episode import EpisodeSpec, run_episode
from slime_strands.agent.record import Termination
from slime_strands.errors import ConfigurationError
from slime_strands.reward_norm import post_process_rewards
from slime_strands.settings import PluginSettings, SettingsError
from slime_strands.testing import Fault, SGLangTestServer, Turn
from slime_strands.testing.invariants import assert_batch_convertible, assert_trajectory_invariants

pytestmark = pytest.mark.timeout(90)

LAYERS, TOPK = 3, 2


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=8192) as srv:
        yield srv


@pytest.fixture
def moe_server(tokenizer):
    """As if started with --enable-return-routed-experts (and slime's top-p patch)."""
    with SGLangTestServer(tokenizer, context_length=8192, routed_experts=(LAYERS, TOPK)) as srv:
        yield srv


def moe_args(server, **overrides):
    return make_args(
        server, use_rollout_routing_replay=True, num_layers=LAYERS, moe_router_topk=TOPK, **overrides
    )


def int32(value: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(value), dtype="<i4")


async def prompt_length(server) -> int:
    probe = await run(server, make_args(server), new_sample(), "Answer: 5")
    return len(probe.tokens) - probe.response_length


# -- 1. top-p replay -----------------------------------------------------------------------------------


async def test_top_p_replay_spans_are_the_servers_and_empty_elsewhere(server):
    args = make_args(server, rollout_top_p=0.9)
    sample = new_sample()
    out = await run(server, args, sample, CALL_ADD, "Answer: 5", params=TOP_P_PARAMS)
    assert out.status == Sample.Status.COMPLETED
    ids, offsets = list(out.rollout_top_p_token_ids), [int(o) for o in out.rollout_top_p_token_offsets]
    assert len(offsets) == out.response_length + 1 and offsets[0] == 0 and offsets[-1] == len(ids)
    prompt_len = len(out.tokens) - out.response_length
    expected: list[list[int]] = [[] for _ in range(out.response_length)]
    for request, out_ids, _, meta in answered(server, sample):
        assert request.body["sampling_params"]["custom_params"] == {"return_top_p_token_ids": True}
        kept, spans = int32(meta["top_p_token_ids"]), int32(meta["top_p_token_offsets"])
        start = len(request.body["input_ids"]) - prompt_len
        for i in range(len(out_ids)):
            expected[start + i] = kept[spans[i] : spans[i + 1]].tolist()
    got = [ids[offsets[i] : offsets[i + 1]] for i in range(out.response_length)]
    assert got == expected
    assert [bool(span) for span in got] == [m == 1 for m in out.loss_mask], "tool tokens: empty spans"
    assert_batch_convertible([out], args)


async def test_top_p_replay_is_requested_even_when_the_params_lack_it(server):
    args = make_args(server, rollout_top_p=0.9)
    out = await run(server, args, new_sample(), "Answer: 5", params={**SLIME_PARAMS, "top_p": 0.9})
    assert server.generate_requests[-1].body["sampling_params"]["custom_params"] == {
        "return_top_p_token_ids": True
    }
    assert_batch_convertible([out], args)


async def test_top_p_replay_without_the_servers_patch_fails_the_sample_loudly(tokenizer, caplog):
    with SGLangTestServer(tokenizer, top_p_patch=False) as server:
        args = make_args(server, rollout_top_p=0.9)
        out = await run(server, args, new_sample(), "Answer: 5", params=TOP_P_PARAMS)
    assert out.status == Sample.Status.FAILED and out.remove_sample
    assert (
        "top-p replay is on (--rollout-top-p < 1) but turn 1 came back without top_p_token_ids"
        in record(out).error
    )
    assert "FAILED" in caplog.text
    assert_batch_convertible([out], args)


# -- 2. routing replay on multi-turn -------------------------------------------------------------------


@pytest.mark.parametrize("echo", [False, True], ids=["sglang-0.5.23", "echoing-server"])
async def test_routing_replay_appends_only_new_rows_with_the_servers_values(tokenizer, echo):
    with SGLangTestServer(
        tokenizer, routed_experts=(LAYERS, TOPK), echo_routed_experts_start_len=echo
    ) as server:
        args = moe_args(server)
        sample = new_sample()
        out = await run(server, args, sample, CALL_ADD, CALL_ADD, "Answer: 5")
        served = answered(server, sample)
    assert out.status == Sample.Status.COMPLETED and len(served) == 3
    held, rows = 0, []
    for request, out_ids, _, meta in served:
        assert request.body["return_routed_experts"] is True
        assert request.body.get("routed_experts_start_len", 0) == held, "ask only for rows not held yet"
        new = int32(meta["routed_experts"]).reshape(-1, LAYERS, TOPK)
        assert len(new) == len(request.body["input_ids"]) + len(out_ids) - 1 - held
        rows.append(new)
        held += len(new)
    experts = as_array(out.rollout_routed_experts)
    assert experts.shape == (len(out.tokens) - 1, LAYERS, TOPK)
    assert np.array_equal(experts, np.concatenate(rows)), "the rows are the values the server sent"
    assert_batch_convertible([out], args)


async def test_routing_replay_missing_from_the_server_fails_the_sample_loudly(server, caplog):
    args = moe_args(server)  # the server was not started with --enable-return-routed-experts
    out = await run(server, args, new_sample(), CALL_ADD, "Answer: 5")
    assert out.status == Sample.Status.FAILED and out.remove_sample and out.reward == 0.0
    assert "turn 1 came back without routed_experts (start SGLang with --enable-return-routed-experts)" in (
        record(out).error
    )
    assert "FAILED" in caplog.text
    assert_batch_convertible([out], args)


# -- 3. one FAILED sample never crashes a step ---------------------------------------------------------


async def test_a_failed_sample_batches_with_the_others_under_routing_and_top_p_replay(moe_server):
    server = moe_server
    args = moe_args(server, rollout_top_p=0.9)
    samples = [new_sample() for _ in range(4)]
    scripts = [(CALL_ADD, "Answer: 5"), ("Answer: 4",), (Fault(status=422),), (CALL_ADD, Fault(status=422))]
    outs = await asyncio.gather(
        *(
            run(server, args, s, *script, params=TOP_P_PARAMS)
            for s, script in zip(samples, scripts, strict=True)
        )
    )
    assert [o.status for o in outs] == [Sample.Status.COMPLETED] * 2 + [Sample.Status.FAILED] * 2
    assert_batch_convertible(outs, args)
    for failed in outs[2:]:
        assert failed.loss_mask == [0] and failed.rollout_log_probs == [0.0] and failed.response_length == 1
        assert (
            list(failed.rollout_top_p_token_offsets) == [0, 0] and list(failed.rollout_top_p_token_ids) == []
        )
    # the one that failed mid-episode still starts from its real prompt
    assert outs[3].tokens[:-1] == session_requests(server, samples[3])[0].body["input_ids"]


# -- 4. recycled samples --------------------------------------------------------------------------------


async def test_a_recycled_failed_sample_is_reset_and_scored_again(moe_server):
    server = moe_server
    args = moe_args(server, rollout_top_p=0.9)
    sample = new_sample()
    out = await run(server, args, sample, Fault(status=422), params=TOP_P_PARAMS)
    assert out.status == Sample.Status.FAILED and out.reward == 0.0 and out.remove_sample is True
    out.non_generation_time = 12.0
    # slime re-queues the group (partial rollout / fully async): the sample comes back as it left
    out = await run(server, args, sample, CALL_ADD, "Answer: \\boxed{5}", params=TOP_P_PARAMS)
    assert out.status == Sample.Status.COMPLETED
    assert out.reward is None and out.remove_sample is False, "slime scores it again and trains on it"
    rec = record(out)
    assert rec.regenerations == 1 and rec.error is None and rec.termination is Termination.END_TURN
    assert out.non_generation_time < 12.0
    assert as_array(out.rollout_routed_experts).shape == (len(out.tokens) - 1, LAYERS, TOPK)
    assert len(out.rollout_top_p_token_offsets) == out.response_length + 1
    assert out.weight_versions == ["0", "0"] and out.prefix_cache_info.total_prompt_tokens == sum(
        meta["prompt_tokens"] for (_, _, _, meta) in answered(server, sample)[-2:]
    )
    assert await reward.math_reward(args, out) == 1.0


# -- 5. FAILED samples do not bias their group ------------------------------------------------------------


async def test_a_failed_sample_leaves_its_siblings_advantages_alone(server):
    args = make_args(
        server,
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        n_samples_per_prompt=4,
        rollout_batch_size=1,
    )
    group = [new_sample(group_index=0, index=i) for i in range(4)]
    scripts = [
        ("Answer: \\boxed{5}",),
        ("Answer: \\boxed{4}",),
        ("Answer: \\boxed{5}",),
        (Fault(status=422),),
    ]
    outs = list(
        await asyncio.gather(*(run(server, args, s, *t) for s, t in zip(group, scripts, strict=True)))
    )
    for out in outs:  # slime scores what generate left unscored
        if out.reward is None:
            out.reward = await reward.math_reward(args, out)
    assert outs[3].status == Sample.Status.FAILED and outs[3].reward == 0.0
    _, advantages = post_process_rewards(args, outs)
    survivors_args = slime_args(**{**vars(args), "n_samples_per_prompt": 3})
    _, expected = slime_group_norm(survivors_args, outs[:3])
    assert advantages[:3] == pytest.approx(expected, abs=1e-5) and advantages[3] == 0.0
    _, biased = slime_group_norm(args, outs)  # slime's default would let the failure move its siblings
    assert biased[:3] != pytest.approx(expected, abs=1e-3)


# -- 6. is in test_rollout.py (server aborts outside slime's abort) -------------------------------------

# -- 7. configuration errors raise at the first sample --------------------------------------------------


async def test_bad_settings_raise_with_the_exact_message(server):
    args = make_args(server, strands={"max_tool_iter": 3})
    with pytest.raises(SettingsError) as expected:
        PluginSettings.from_mapping({**args.strands})
    with pytest.raises(SettingsError) as raised:
        await rollout.generate(args, new_sample(), dict(SLIME_PARAMS))
    assert str(raised.value) == str(expected.value) and "max_tool_iter" in str(raised.value)
    assert server.generate_requests == []


@pytest.mark.parametrize(
    ("tool", "message"),
    [
        ("no_such_module.tool", "tools: 'no_such_module.tool' cannot be imported: ModuleNotFoundError: "
         "No module named 'no_such_module'"),
        ("rollout_tools.nope", "tools: module 'rollout_tools' has no attribute 'nope'"),
        ("rollout_tools.CALLS", "tools: 'rollout_tools.CALLS' is a dict, not a Strands tool "
         "(decorate it with @strands.tool)"),
        ("add", "tools: 'add' must be a dotted path: package.module.tool"),
    ],
)  # fmt: skip
async def test_a_tool_that_does_not_import_raises(server, tool, message):
    args = make_args(server, strands={"tools": [tool]})
    with pytest.raises(ConfigurationError) as raised:
        await rollout.generate(args, new_sample(), dict(SLIME_PARAMS))
    assert str(raised.value) == message
    assert server.generate_requests == []


async def test_a_template_that_fails_the_probe_raises(server, tmp_path):
    folder = Path(tmp_path) / "tokenizer"
    shutil.copytree(qwen3_tokenizer_path(), folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    config_path.write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    args = make_args(server, hf_checkpoint=str(folder))
    with pytest.raises(ConfigurationError, match="cannot find the end-of-turn token after an assistant turn"):
        await rollout.generate(args, new_sample(), dict(SLIME_PARAMS))
    assert server.generate_requests == []


async def test_a_sandbox_that_cannot_isolate_raises_at_the_first_sample(server, tmp_path, monkeypatch):
    """The python tool's sandbox fails closed at the first sample, not as a tool error in every episode."""
    from slime_strands.sandbox import SandboxIsolationError, _sandbox

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, refusal in (
        ("bwrap", "bwrap: No permissions to create new namespace"),
        ("unshare", "unshare: unshare failed: Operation not permitted"),
    ):  # where namespaces are forbidden, both tools fail like this
        script = bin_dir / tool
        script.write_text(f"#!/bin/sh\necho '{refusal}' >&2\nexit 1\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(_sandbox.HOST, "working_backends", {})  # nothing has isolated in this process yet
    args = make_args(
        server,
        strands={
            "tools": ["slime_strands.sandbox.execute_python_code"],
            "sandbox": {"backend": "auto", "timeout_s": 7, "prewarm": False},
        },
    )
    with pytest.raises(SandboxIsolationError, match="no isolating sandbox backend works here") as raised:
        await rollout.generate(args, new_sample(), dict(SLIME_PARAMS))
    assert isinstance(raised.value, ConfigurationError)
    assert "bubblewrap" in str(raised.value) and "backend: limits" in str(raised.value)
    assert server.generate_requests == []


async def test_apply_chat_template_is_refused_with_the_fix(server):
    args = make_args(server, apply_chat_template=True)
    with pytest.raises(
        ConfigurationError, match="--apply-chat-template is set: slime would render each prompt"
    ):
        await rollout.generate(args, new_sample(), dict(SLIME_PARAMS))
    eval_args = make_args(server, eval_datasets=[{"name": "aime", "apply_chat_template": True}])
    with pytest.raises(ConfigurationError, match="eval dataset 'aime' sets apply_chat_template"):
        await rollout.generate(eval_args, new_sample(), dict(SLIME_PARAMS), evaluation=True)
    assert server.generate_requests == []


async def test_routing_replay_without_the_model_shape_raises(moe_server):
    args = make_args(moe_server, use_rollout_routing_replay=True)
    with pytest.raises(ConfigurationError, match=r"needs args\.num_layers and args\.moe_router_topk"):
        await rollout.generate(args, new_sample(), dict(SLIME_PARAMS))


# -- 8 / 9. the window from /v1/models, SGLang's margin and its context errors -----------------------------


async def test_the_window_comes_from_v1_models_and_keeps_sglangs_margin(server, tokenizer):
    prompt_len = await prompt_length(server)
    window = prompt_len + 60
    with SGLangTestServer(tokenizer, context_length=window) as small:
        sample = new_sample()
        out = await run(small, make_args(small), sample, "word " * 200)
        assert any(r.path == "/v1/models" for r in small.requests)
        (request,) = session_requests(small, sample)
        assert (
            len(request.body["input_ids"]) + request.body["sampling_params"]["max_new_tokens"] == window - 6
        )
    assert out.status == Sample.Status.TRUNCATED and record(out).termination is Termination.CONTEXT_FULL
    assert len(out.tokens) == window - 6


async def test_sglangs_input_length_refusal_ends_truncated(server, tokenizer):
    """A KV pool smaller than the window: the scheduler refuses the second turn with "Input length (N tokens)
    exceeds the maximum allowed length (M tokens)": the episode ends TRUNCATED on the model's last output."""
    prompt_len = await prompt_length(server)
    with SGLangTestServer(tokenizer, context_length=8192, kv_capacity=prompt_len + 40) as small:
        sample = new_sample()
        out = await run(small, make_args(small), sample, CALL_ADD, "never served")
        _, second = session_requests(small, sample)
        assert second.body["rid"] not in small.answers
    assert out.status == Sample.Status.TRUNCATED and record(out).termination is Termination.CONTEXT_FULL
    assert out.response.endswith("</tool_call><|im_end|>")


# -- 10. smaller ones -----------------------------------------------------------------------------------


async def test_eval_max_context_len_bounds_eval_episodes(server):
    prompt_len = await prompt_length(server)
    args = make_args(server, eval_max_context_len=prompt_len + 40)
    out = await run(server, args, new_sample(), CALL_ADD, "word " * 100, evaluation=True)
    assert out.status == Sample.Status.TRUNCATED and len(out.tokens) == prompt_len + 40
    out = await run(server, args, new_sample(), CALL_ADD, "word " * 100)
    assert out.status == Sample.Status.COMPLETED, "training is bounded by --rollout-max-context-len only"


@pytest.mark.parametrize("where", ["sample", "flag"])
async def test_apply_chat_template_kwargs_reach_the_template(server, tokenizer, where):
    sample = new_sample()
    args = make_args(server)
    if where == "sample":
        sample.apply_chat_template_kwargs = {"enable_thinking": False}
    else:
        args.apply_chat_template_kwargs = {"enable_thinking": False}
    await run(server, args, sample, "Answer: 5")
    (request,) = session_requests(server, sample)
    assert tokenizer.decode(request.body["input_ids"]).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


async def test_spec_info_adds_up_the_servers_speculative_stats(tokenizer):
    with SGLangTestServer(tokenizer, speculative_draft_tokens=4) as server:
        sample = new_sample()
        args = make_args(server, sglang_speculative_algorithm="EAGLE")
        out = await run(server, args, sample, CALL_ADD, "Answer: 5")
        metas = [meta for (_, _, _, meta) in answered(server, sample)]
    assert out.spec_info.spec_verify_ct == sum(m["spec_verify_ct"] for m in metas) > 0
    assert out.spec_info.completion_token_num == sum(m["completion_tokens"] for m in metas)


def test_the_pool_is_sized_by_rollout_num_engines(server):
    args = make_args(server, sglang_server_concurrency=8, rollout_num_gpus=8, rollout_num_gpus_per_engine=1)
    assert SlimeConfig.of(args).runtime.client.max_connections == 8 * 8
    args.rollout_num_engines = 3  # e.g. external engines: slime counts them, not the GPUs
    assert SlimeConfig.of(args).runtime.client.max_connections == 8 * 3


@pytest.mark.parametrize(
    ("gpus", "per_engine", "engines"),
    [(8, 2, None), (8, 4, None), (6, 4, None), (8, 8, None), (2, 1, None), (16, 2, 3), (1, 1, None)],
)
def test_the_pool_counts_the_engines_as_slime_does(server, slime, gpus, per_engine, engines):
    """Engines of several GPUs each (``--rollout-num-gpus-per-engine`` > 1): slime's own
    ``get_rollout_num_engines`` is the oracle of the pool's size."""
    from slime.utils.http_utils import get_rollout_num_engines

    args = make_args(
        server, sglang_server_concurrency=8, rollout_num_gpus=gpus, rollout_num_gpus_per_engine=per_engine
    )
    if engines is not None:
        args.rollout_num_engines = engines
    slimes = get_rollout_num_engines(args)
    assert slimes >= 1
    config = SlimeConfig.of(args)
    assert config.pool_size == 8 * slimes, (gpus, per_engine, engines)
    assert config.runtime.client.max_connections == 8 * slimes


def test_a_flag_added_to_the_args_keeps_their_runtime(server):
    """slime may set attributes on its args during a run: the view is read again, the runtime (client pool,
    tokenizer, checked templates) stays while the configuration is the same."""
    args = make_args(server)
    runtime = SlimeConfig.of(args).runtime
    args.wandb_run_id = "abc"  # read again (a misspelt strands key could have come with it)
    assert SlimeConfig.of(args).runtime is runtime
    args.sglang_server_concurrency = 4  # another pool: another runtime
    assert SlimeConfig.of(args).runtime is not runtime


async def test_runtimes_naming_one_checkpoint_share_one_tokenizer(server):
    """A training and an eval configuration (different settings: two runtimes) load the tokenizer once."""
    train = SlimeConfig.of(make_args(server)).runtime
    evaluation = SlimeConfig.of(make_args(server, strands={"max_tool_iters": 2})).runtime
    assert train is not evaluation
    assert await train.tokenizer() is await evaluation.tokenizer()


# -- every turn recorded with slime's appender semantics ---------------------------------------------------


@pytest.mark.parametrize("echo", [False, True], ids=["sglang-0.5.23", "echoing-server"])
async def test_the_sample_equals_what_slimes_appender_builds(tokenizer, echo):
    with SGLangTestServer(
        tokenizer,
        routed_experts=(LAYERS, TOPK),
        echo_routed_experts_start_len=echo,
        speculative_draft_tokens=3,
    ) as server:
        args = moe_args(server, rollout_top_p=0.9, sglang_speculative_algorithm="EAGLE")
        sample = new_sample()
        server.script(
            CALL_ADD,
            Turn(CALL_ADD, weight_version="7"),
            Turn("Answer: 5", weight_version="8"),
            key=sample.session_id,
        )
        out = await rollout.generate(args, sample, dict(TOP_P_PARAMS))
        if not echo:  # SGLang 0.5.23 does not echo the start: tell slime's appender what was asked
            for request, _, _, meta in answered(server, sample):
                meta.setdefault("routed_experts_start_len", request.body.get("routed_experts_start_len", 0))
        expected = replay_with_slime_appender(server, sample, args, len(out.tokens) - out.response_length)
    assert out.tokens == expected.tokens and out.response_length == expected.response_length
    assert out.loss_mask == expected.loss_mask and out.rollout_log_probs == expected.rollout_log_probs
    assert (
        as_array(out.rollout_top_p_token_ids).tolist() == as_array(expected.rollout_top_p_token_ids).tolist()
    )
    assert (
        as_array(out.rollout_top_p_token_offsets).tolist()
        == as_array(expected.rollout_top_p_token_offsets).tolist()
    )
    assert np.array_equal(as_array(out.rollout_routed_experts), as_array(expected.rollout_routed_experts))
    assert out.weight_versions == expected.weight_versions == ["0", "7", "8"]
    assert out.prefix_cache_info == expected.prefix_cache_info
    assert out.spec_info == expected.spec_info
    assert out.status == expected.status == Sample.Status.COMPLETED


# -- the same episode code without slime (what a standalone evaluator runs) --------------------------------


async def test_run_episode_needs_no_slime(server, tokenizer):
    settings = PluginSettings(tools=("rollout_tools.add",), retry_delay_s=0.01)
    spec = EpisodeSpec(prompt="What is 2+3?", sampling_params={"max_new_tokens": 256}, routing_key="solo")
    server.script(CALL_ADD, "Answer: 5", key="solo")
    gc.set_threshold(700, *gc.get_threshold()[1:])
    result = await run_episode(tokenizer, SGLangClient(server.base_url), settings, spec)
    assert gc.get_threshold()[0] == settings.gc_young_threshold, "an episode raises the young GC threshold"
    assert result.termination is Termination.END_TURN and result.turns == 2 and result.tool_calls == 1
    assert_trajectory_invariants(result.trajectory, server, routing_key="solo")
    assert result.response.endswith("Answer: 5<|im_end|>")
    assert result.response[-result.final_turn_chars :] == "Answer: 5<|im_end|>"
    tm = result.trajectory
    assert result.response == tokenizer.decode(tm.token_ids[tm.prompt_length :], skip_special_tokens=False)
