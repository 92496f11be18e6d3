"""Helpers for tests of slime's entry points: slime-like args, samples, a run that checks every Sample against
the server's records, slime's abort flag, and slime's own appender replaying what the server served.

The tests build slime's args here and only here (:func:`slime_args`, :func:`make_args`): when the plugin reads
another flag, or slime renames one, this is the one place to say it."""

from __future__ import annotations

import os
import sys
import types
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from tokenizer_kit import qwen3_tokenizer_path

from slime_strands import rollout
from slime_strands.agent.record import EpisodeRecord
from slime_strands.testing import SGLangTestServer
from slime_strands.testing.invariants import assert_sample_matches_server
from slime_strands.testing.slime_types import load_sample_class

Sample = load_sample_class()
SLIME_SOURCE_ENV = "SLIME_STRANDS_SLIME_SOURCE"  # .ci/run exports it (scripts/real_sglang/setup.sh prints it)


def slime_source() -> Path | None:
    """slime's unmodified source (THUDM/slime: not on PyPI): ``$SLIME_STRANDS_SLIME_SOURCE``, else the snapshot
    in ``shared/slime`` beside this clone (how CI lays it out); None where neither is at hand."""
    here = Path(__file__).resolve().parents[1]
    for candidate in (os.environ.get(SLIME_SOURCE_ENV), here.parent / "shared" / "slime"):
        if candidate and (Path(candidate) / "slime" / "utils" / "types.py").is_file():
            return Path(candidate)
    return None


CALL_ADD = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
SLIME_PARAMS = {  # what slime's GenerateState builds (rollout_stop None, top_p 1)
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "max_new_tokens": 2048,
    "stop": None,
    "stop_token_ids": None,
    "skip_special_tokens": False,
    "no_stop_trim": True,
    "spaces_between_special_tokens": False,
}
TOP_P_PARAMS = {**SLIME_PARAMS, "top_p": 0.9, "custom_params": {"return_top_p_token_ids": True}}
SLIME_LOOP_FLAGS = {  # what slime's rollout loop and generate_and_rm read besides make_args' flags
    "custom_generate_function_path": "slime_strands.rollout.generate",
    "custom_rm_path": "slime_strands.reward.math_reward",
    "rollout_global_dataset": True,
    "dynamic_sampling_filter_path": None,
    "group_rm": False,
    "rollout_sample_filter_path": None,
    "rollout_all_samples_process_path": None,
    "rollout_sample_hook_path": None,
    "use_distributed_post": False,
}


def slime_args(**flags: Any) -> types.SimpleNamespace:
    """slime's args as a test double: an object with the given flags as attributes, nothing else (a flag left
    out is absent, as in the args of a slime build that lacks it; the plugin reads it as None)."""
    return types.SimpleNamespace(**flags)


GROUP_NORM = dict(  # slime's reward normalisation per group (RolloutManager._post_process_rewards)
    advantage_estimator="grpo",
    rewards_normalization=True,
    grpo_std_normalization=True,
    n_samples_per_prompt=4,
    rollout_batch_size=3,
    reward_key=None,
)


def group_norm_args(**overrides: Any) -> types.SimpleNamespace:
    """slime's args as its reward post-process reads them: GRPO over groups of 4, 3 prompts a batch."""
    return slime_args(**{**GROUP_NORM, **overrides})


def router_flags(server: SGLangTestServer) -> dict[str, Any]:
    """``--sglang-router-ip`` / ``--sglang-router-port`` of ``server``."""
    host, port = server.base_url.removeprefix("http://").split(":")
    return {"sglang_router_ip": host, "sglang_router_port": int(port)}


def make_args(server: SGLangTestServer, **overrides: Any) -> types.SimpleNamespace:
    """slime's args for episodes against ``server``: what ``generate`` and slime's ``GenerateState`` read."""
    strands = {
        "tools": ["rollout_tools.add", "rollout_tools.huge_output", "rollout_tools.echo"],
        "retry_delay_s": 0.01,
        "max_retries": 3,
    }
    strands.update(overrides.pop("strands", {}))
    values = dict(
        **router_flags(server),
        hf_checkpoint=qwen3_tokenizer_path(),
        rollout_max_response_len=2048,
        eval_max_response_len=1024,
        rollout_max_context_len=None,
        eval_max_context_len=None,
        partial_rollout=False,
        use_rollout_routing_replay=False,
        apply_chat_template=False,
        apply_chat_template_kwargs={},
        reward_key=None,
        eval_reward_key=None,
        strands=strands,
        # What real slime's GenerateState(args) reads, for runs where slime is importable.
        sglang_server_concurrency=64,
        rollout_num_gpus=1,
        rollout_num_gpus_per_engine=1,
        rollout_temperature=1.0,
        rollout_top_p=1.0,
        rollout_top_k=-1,
        rollout_stop=None,
        rollout_stop_token_ids=None,
        rollout_skip_special_tokens=False,
        sglang_dp_size=1,
        n_samples_per_prompt=1,
        sglang_enable_deterministic_inference=False,
        ci_test=False,
    )
    values.update(overrides)
    return slime_args(**values)


def new_sample(prompt: Any = "What is 2+3?", **kw: Any) -> Any:
    return Sample(prompt=prompt, label="5", session_id=kw.pop("session_id", str(uuid.uuid4())), **kw)


async def run(server, args, sample, *turns, params=None, evaluation=False):
    """generate() one sample against ``turns`` scripted for its session; a sample slime trains on (or an
    aborted one) is checked against every request and answer of its session."""
    server.script(*turns, key=sample.session_id)
    out = await rollout.generate(args, sample, dict(params or SLIME_PARAMS), evaluation=evaluation)
    assert out is sample
    if out.status != Sample.Status.FAILED:
        assert_sample_matches_server(out, server, routing_key=sample.session_id)
    return out


TIMINGS = {"non_generation_time", "timings", "trace"}
"""Sample fields and metadata keys that differ between two runs of the same episode: clocks, slime's trace ids."""


def comparable(sample: Any) -> dict[str, Any]:
    """A Sample's fields but what differs between two runs of the same episode (its identity, the prompt it
    was given, its clocks): two greedy runs of one episode give equal dicts, wherever they ran."""
    fields = {
        k: v
        for k, v in vars(sample).items()
        if k not in ("metadata", "session_id", "prompt", "index", "group_index", "rollout_id", *TIMINGS)
    }
    fields["metadata"] = _without_timings(sample.metadata)
    return fields


def _without_timings(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k not in TIMINGS and not k.endswith("_s")}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def record(sample: Any) -> EpisodeRecord:
    found = EpisodeRecord.of(sample)
    assert found is not None, sample.metadata
    return found


def session_requests(server: SGLangTestServer, sample: Any) -> list:
    return [r for r in server.generate_requests if r.headers.get("x-smg-routing-key") == sample.session_id]


def answered(server: SGLangTestServer, sample: Any) -> list:
    """(request, output_ids, logprobs, meta_info) of every answer with tokens of the sample's session."""
    out = []
    for request in session_requests(server, sample):
        rid = request.body["rid"]
        if rid in server.answers:
            ids, lps = server.answers[rid]
            out.append((request, ids, lps, server.meta_infos[rid]))
    return out


def install_generate_state(monkeypatch, tokenizer) -> types.SimpleNamespace:
    """slime's GenerateState singleton as the plugin sees it (its tokenizer and abort flag)."""
    state = types.SimpleNamespace(aborted=False, tokenizer=tokenizer)
    fake = types.ModuleType("slime.rollout.sglang_rollout")
    fake.GenerateState = lambda args: state  # type: ignore[attr-defined]
    for name in ("slime", "slime.rollout"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "slime.rollout.sglang_rollout", fake)
    return state


def replay_with_slime_appender(server: SGLangTestServer, sample: Any, args: Any, prompt_len: int) -> Any:
    """The Sample slime's own ``append_response_tokens`` builds from what the server saw and answered for the
    sample's session: template tokens between turns untrainable, each answer trainable with its meta_info."""
    expected = Sample(prompt=sample.prompt, tokens=[])
    for request, ids, lps, meta in answered(server, sample):
        sent = request.body["input_ids"]
        if not expected.tokens:
            expected.tokens = list(sent[:prompt_len])
        between = sent[len(expected.tokens) :]
        if between:
            expected.append_response_tokens(args, tokens=between, trainable=False)
        expected.append_response_tokens(args, tokens=ids, log_probs=lps, trainable=True, meta_info=meta)
    return expected


def as_array(value: Any) -> np.ndarray:
    return np.asarray(value.tolist() if hasattr(value, "tolist") else value)


def slime_group_norm(args: Any, samples: list[Any]) -> tuple[list[Any], list[float]]:
    """slime's DEFAULT reward post-process (``RolloutManager._post_process_rewards``, slime main): the real
    method when slime is importable, else its steps redone in torch float32: rewards in rows of
    ``n_samples_per_prompt`` when the batch is full (else one row), minus the row mean, divided by the row's
    unbiased std + 1e-6 for grpo / gspo / cispo with std normalisation."""
    try:
        from slime.ray.rollout import RolloutManager
    except Exception:  # slime (and ray) not installed: the torch redo below
        pass
    else:
        manager = types.SimpleNamespace(args=args, custom_reward_post_process_func=None)
        return RolloutManager._post_process_rewards(manager, samples)
    import torch

    raw = [s.get_reward_value(args) for s in samples]
    centred = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
    if args.advantage_estimator not in centred or not args.rewards_normalization:
        return raw, raw
    values = torch.tensor(raw, dtype=torch.float)
    row = (
        args.n_samples_per_prompt
        if len(raw) == args.n_samples_per_prompt * args.rollout_batch_size
        else len(raw)
    )
    table = values.reshape(-1, row)
    table = table - table.mean(dim=-1, keepdim=True)
    if args.advantage_estimator in ("grpo", "gspo", "cispo") and args.grpo_std_normalization:
        table = table / (table.std(dim=-1, keepdim=True) + 1e-6)
    return raw, table.flatten().tolist()
