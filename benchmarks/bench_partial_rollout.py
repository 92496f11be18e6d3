"""Partial rollout on a long-tailed episode mix: continuing aborted episodes against restarting them.

slime's rollout loop (``generate_rollout_async``, the real one: slime's source is needed) over-samples, takes
the first ``--batch`` groups that finish and aborts the rest (``abort()``); with ``--partial-rollout`` the
aborted groups come back first at the next step. Here most episodes are short and ``--long-share`` of them
``--long-factor`` times longer (a tool call per turn, then the answer), every turn taking
``--turn-s`` seconds on the stand-in server (an abort cuts it, returning what it had generated). The same
steps run twice, each in a fresh process: with slime-strands continuing an aborted episode where it stopped
(``resume_aborted: true``, the default) and restarting it from its prompt (``resume_aborted: false``, what
slime-strands did before). Per step: wall time, turns the server generated, turns in the batch slime trains
on, turns the continued episodes did not generate again (saved), long episodes in the batch, groups left in
the buffer.

    SLIME_STRANDS_SLIME_SOURCE=/path/to/slime python benchmarks/bench_partial_rollout.py  # ~2 min on 2 cores
    python benchmarks/bench_partial_rollout.py --steps 3 --batch 2 --turn-s 0.02  # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
import uuid
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the tests' scripted policy and slime loader

ANSWER = "All additions are done.\nAnswer: \\boxed{5}"


def _add_call(i: int) -> str:
    return f'<tool_call>\n{{"name": "add", "arguments": {{"a": {i}, "b": 1}}}}\n</tool_call>'


def _args(server: Any, opts: argparse.Namespace, resume: bool) -> Any:
    from conftest import qwen3_tokenizer_path
    from slime_helpers import router_flags, slime_args

    return slime_args(
        **router_flags(server), hf_checkpoint=qwen3_tokenizer_path(),
        rollout_max_response_len=8192, rollout_max_context_len=None, rollout_temperature=1.0, rollout_top_p=1.0,
        rollout_top_k=-1, rollout_stop=None, rollout_stop_token_ids=None, rollout_skip_special_tokens=False,
        sglang_server_concurrency=256, rollout_num_gpus=1, rollout_num_gpus_per_engine=1, sglang_dp_size=1,
        n_samples_per_prompt=opts.group, rollout_batch_size=opts.batch,
        over_sampling_batch_size=int(opts.batch * opts.over_sampling), rollout_global_dataset=True,
        dynamic_sampling_filter_path=None, partial_rollout=True, mask_offpolicy_in_partial_rollout=False,
        custom_generate_function_path="slime_strands.rollout.generate",
        custom_rm_path="slime_strands.reward.math_reward", group_rm=False, reward_key=None,
        rollout_sample_filter_path=None, rollout_all_samples_process_path=None, rollout_sample_hook_path=None,
        use_distributed_post=False, use_rollout_routing_replay=False, sglang_enable_deterministic_inference=False,
        apply_chat_template=False, apply_chat_template_kwargs={}, ci_test=False,
        strands={
            "tools": ["rollout_tools.add"], "max_tool_iters": None, "retry_delay_s": 0.05, "max_retries": 3,
            "resume_aborted": resume, "system_prompt": "Add numbers with the add tool.",
        },
    )  # fmt: skip


class _Prompts:
    """slime's data source: the buffer first, then new groups; each episode short or long, by a seeded draw."""

    def __init__(self, slime: Any, policy: Any, opts: argparse.Namespace) -> None:
        self.slime, self.policy, self.opts = slime, policy, opts
        self.rng = random.Random(opts.seed)
        self.buffer: list[list[Any]] = []
        self.groups = 0
        self.long: set[str] = set()

    def __call__(self, n: int) -> list[list[Any]]:
        taken, self.buffer = self.buffer[:n], self.buffer[n:]
        return taken + [self._group() for _ in range(n - len(taken))]

    def _group(self) -> list[Any]:
        group = []
        for i in range(self.opts.group):
            sample = self.slime.Sample(
                prompt="Add 1 to a number with the add tool until told to stop, then answer.",
                label="5",
                group_index=self.groups,
                index=self.groups * self.opts.group + i,
                session_id=str(uuid.uuid4()),
            )
            long = self.rng.random() < self.opts.long_share
            turns = self.opts.turns * (self.opts.long_factor if long else 1)
            if long:
                self.long.add(sample.session_id)
            self.policy.script(sample.session_id, *[_add_call(t) for t in range(turns - 1)], ANSWER)
            group.append(sample)
        self.groups += 1
        return group


async def _steps(opts: argparse.Namespace, resume: bool) -> list[dict[str, Any]]:
    from partial_kit import ContinuingPolicy, real_slime
    from transformers import AutoTokenizer

    from slime_strands.agent.record import EpisodeRecord
    from slime_strands.testing import SGLangTestServer

    with real_slime() as slime:
        if slime is None:
            raise SystemExit(
                "slime's source is needed: set SLIME_STRANDS_SLIME_SOURCE to a checkout of THUDM/slime"
            )
        from conftest import qwen3_tokenizer_path
        from slime.utils import http_utils

        tokenizer = AutoTokenizer.from_pretrained(qwen3_tokenizer_path())
        with SGLangTestServer(tokenizer, context_length=65536) as server:
            policy = ContinuingPolicy(server, tokenizer)
            policy.latency_s = opts.turn_s
            args = _args(server, opts, resume)
            prompts = _Prompts(slime, policy, opts)
            http_utils.init_http_client(args)
            rows = []
            for rollout_id in range(opts.steps):
                answered, started = len(server.answers), time.perf_counter()
                out, aborted = await slime.generate_rollout_async(args, rollout_id, prompts)
                slime.GenerateState(args).reset()
                prompts.buffer += aborted
                batch = [s for g in out.samples for s in g]
                records = [r for s in batch if (r := EpisodeRecord.of(s)) is not None]
                rows.append(
                    {
                        "step": rollout_id,
                        "wall_s": time.perf_counter() - started,
                        "generated": len(server.answers) - answered,
                        "trained": sum(r.turns for r in records),
                        "saved": sum(r.turns_saved for r in records),
                        "long": sum(s.session_id in prompts.long for s in batch),
                        "buffer": len(prompts.buffer),
                    }
                )
            await http_utils._http_client.aclose()
    return rows


def format_report(opts: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        f"{opts.batch} groups x {opts.group} per step, over-sampling {opts.over_sampling}x; episodes of "
        f"{opts.turns} turns, {opts.long_share:.0%} of them {opts.long_factor}x longer; {opts.turn_s} s a turn",
        "",
        "| step | mode | wall s | turns generated | turns trained | turns saved | long episodes | buffer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for step in range(opts.steps):
        for mode, rows in runs.items():
            r = rows[step]
            lines.append(
                f"| {step} | {mode} | {r['wall_s']:.2f} | {r['generated']} | {r['trained']} | {r['saved']} | "
                f"{r['long']} | {r['buffer']} |"
            )
    lines.append("")
    for mode, rows in runs.items():
        generated = sum(r["generated"] for r in rows)
        trained = sum(r["trained"] for r in rows)
        later = rows[1:] or rows  # the first step also loads the tokenizer and starts slime's state
        rate = sum(r["trained"] for r in later) / max(sum(r["wall_s"] for r in later), 1e-9)
        lines.append(
            f"{mode}: {generated} turns generated, {trained} trained ({trained / max(1, generated):.0%}), "
            f"{sum(r['saved'] for r in rows)} saved ({sum(r['saved'] for r in rows) / len(rows):.1f} a step), "
            f"{sum(r['long'] for r in rows)} long episodes trained, {rate:.1f} trained turns/s after step 0"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8, help="groups slime trains on per step")
    parser.add_argument("--group", type=int, default=2, help="samples per prompt")
    parser.add_argument("--over-sampling", type=float, default=1.5, help="groups in flight / batch")
    parser.add_argument("--turns", type=int, default=4, help="turns of a median episode")
    parser.add_argument("--long-share", type=float, default=0.2)
    parser.add_argument("--long-factor", type=int, default=10)
    parser.add_argument("--turn-s", type=float, default=0.1, help="seconds the server takes per turn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", choices=["continue", "restart"], help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(asyncio.run(_steps(opts, resume=opts.child == "continue"))))
        return
    runs = {}
    for mode in ("continue", "restart"):
        child = subprocess.run(
            [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--child", mode],
            capture_output=True,
            text=True,
            check=False,
        )
        if child.returncode:
            sys.stderr.write(child.stderr[-4000:])
            raise SystemExit(f"the {mode} run failed")
        runs[mode] = json.loads(child.stdout.strip().splitlines()[-1])
    print("python benchmarks/bench_partial_rollout.py " + " ".join(sys.argv[1:]))
    print(format_report(opts, runs))


if __name__ == "__main__":
    main()
