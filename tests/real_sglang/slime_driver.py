"""Runs samples through slime's REAL ``generate_and_rm`` (the unmodified snapshot on PYTHONPATH) against a server,
in a process of its own, and prints what slime ended with as one JSON line.

slime's rollout module imports packages the project's tests do not install (ray, pylatexenc): they come from
``SLIME_STRANDS_SLIME_DEPS``, APPENDED to ``sys.path`` so the project's own packages win wherever both exist.
The test process itself never imports slime (its ``Sample`` and singletons would leak into other tests).

Input (stdin, JSON): ``base_url``, ``tokenizer`` (slime's ``--hf-checkpoint``), ``strands`` (the plugin
settings), ``slime`` (optional: slime args to set, e.g. ``partial_rollout``), ``jobs``:
``[{"session_id", "prompt", "label", "sampling_params", "abort", "abort_file", "continue"}]``. A job with
``abort`` is aborted the way slime's ``abort()`` does it once the server runs it: ``GenerateState.aborted =
True``, then ``abort_servers_until_idle`` (``/abort_request`` with ``abort_all``, until ``/v1/loads`` says
idle); with ``abort_file`` instead, once that file exists (the test decides the moment). A job with
``continue`` then goes on as slime's next rollout step hands the sample back (``--partial-rollout``): the
aborted sample, through a pickle round trip (slime's buffer and a Ray hop), into ``generate_and_rm`` again;
both the aborted and the continued sample are printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import sys
import types
from typing import Any

sys.path.append(os.environ["SLIME_STRANDS_SLIME_DEPS"])  # after site-packages: the project's packages win

from slime.backends.sglang_utils.server_control import abort_servers_until_idle
from slime.rollout.sglang_rollout import GenerateState, generate_and_rm
from slime.utils.http_utils import get, init_http_client
from slime.utils.types import Sample

_WAIT_S = 180.0


def slime_args(
    base_url: str, tokenizer: str, strands: dict[str, Any], overrides: dict[str, Any] | None = None
) -> types.SimpleNamespace:
    """What ``GenerateState``, ``generate_and_rm``, ``async_rm`` and the plugin read of slime's args."""
    host, port = base_url.removeprefix("http://").split(":")
    args = types.SimpleNamespace(
        sglang_router_ip=host,
        sglang_router_port=int(port),
        hf_checkpoint=tokenizer,
        custom_generate_function_path="slime_strands.rollout.generate",
        custom_rm_path="slime_strands.reward.math_reward",
        rm_type=None,
        group_rm=False,
        partial_rollout=False,
        mask_offpolicy_in_partial_rollout=False,
        rollout_sample_hook_path=None,
        rollout_max_response_len=512,
        eval_max_response_len=512,
        rollout_max_context_len=None,
        eval_max_context_len=None,
        use_rollout_routing_replay=False,
        apply_chat_template=False,
        apply_chat_template_kwargs={},
        reward_key=None,
        eval_reward_key=None,
        strands=strands,
        sglang_server_concurrency=8,
        rollout_num_gpus=1,
        rollout_num_gpus_per_engine=1,
        rollout_temperature=0.0,
        rollout_top_p=1.0,
        rollout_top_k=-1,
        rollout_stop=None,
        rollout_stop_token_ids=None,
        rollout_skip_special_tokens=False,
        sglang_dp_size=1,
        n_samples_per_prompt=1,
        sglang_enable_deterministic_inference=False,
        ci_test=False,
        use_distributed_post=False,
    )
    vars(args).update(overrides or {})
    return args


async def _abort_when_running(args: Any, base_url: str) -> None:
    deadline = asyncio.get_running_loop().time() + _WAIT_S
    while not (await get(f"{base_url}/v1/loads"))["loads"][0]["num_running_reqs"]:
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("the sample's turn never ran")
        await asyncio.sleep(0.1)  # polling the server's load report, bounded above
    await _abort(args, base_url)


async def _abort_when_told(args: Any, base_url: str, path: str, task: asyncio.Task[Any]) -> None:
    deadline = asyncio.get_running_loop().time() + _WAIT_S
    while not os.path.exists(path):
        if task.done() or asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"no abort asked ({path}) while the sample ran")
        await asyncio.sleep(0.02)  # polling for the test's file, bounded above
    await _abort(args, base_url)


async def _abort(args: Any, base_url: str) -> None:
    GenerateState(args).aborted = True  # slime's abort(): the flag, then every server until idle
    await abort_servers_until_idle([base_url])


def _summary(sample: Any) -> dict[str, Any]:
    return {
        "session_id": sample.session_id,
        "status": sample.status.name,
        "tokens": list(sample.tokens),
        "response_length": sample.response_length,
        "loss_mask": list(sample.loss_mask or []),
        "rollout_log_probs": list(sample.rollout_log_probs or []),
        "reward": sample.reward,
        "remove_sample": bool(getattr(sample, "remove_sample", False)),
        "weight_versions": list(sample.weight_versions or []),
        "metadata": sample.metadata,
    }


async def main(request: dict[str, Any]) -> dict[str, Any]:
    base_url = request["base_url"]
    args = slime_args(base_url, request["tokenizer"], request["strands"], request.get("slime"))
    init_http_client(args)
    results = []
    for job in request["jobs"]:
        sample = Sample(prompt=job["prompt"], label=job["label"], session_id=job["session_id"])
        params = dict(job["sampling_params"])
        task = asyncio.create_task(generate_and_rm(args, sample, params, evaluation=False))
        if job.get("abort"):
            await _abort_when_running(args, base_url)
        elif job.get("abort_file"):
            await _abort_when_told(args, base_url, job["abort_file"], task)
        results.append(_summary(await task))
        GenerateState(args).reset()
        if job.get("continue"):  # slime's next step: the sample from its buffer, through a Ray hop
            again = pickle.loads(pickle.dumps(sample))
            results.append(_summary(await generate_and_rm(args, again, params, evaluation=False)))
            GenerateState(args).reset()
    return {"samples": results}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.load(sys.stdin))), default=str))
