"""The random-weight model as a fuzzer: unconstrained sampling with Qwen3's special tokens boosted by
``logit_bias`` (stray ``<tool_call>``, ``</tool_call>``, ``<think>``, ``<|im_start|>``, ``<tool_response>``,
both end ids), over concurrent multi-turn episodes. Whatever it writes: no exception, a valid status, and every
trajectory exactly what the server saw and answered."""

from __future__ import annotations

import asyncio

import pytest

from real_sglang.real_helpers import check_record, settings
from real_sglang.tiny_model import END_OF_TEXT, IM_END
from slime_strands.agent.episode import EpisodeSpec, run_episode
from slime_strands.agent.record import TREATMENTS, Termination
from slime_strands.provider.client import SGLangClient

pytestmark = [pytest.mark.real_sglang, pytest.mark.timeout(600)]

SPECIALS = {
    151657: 9.0,  # <tool_call>
    151658: 9.0,  # </tool_call>
    151667: 8.0,  # <think>
    151668: 8.0,  # </think>
    151644: 7.0,  # <|im_start|>
    151665: 7.0,  # <tool_response>
    151666: 7.0,  # </tool_response>
    IM_END: 6.0,
    END_OF_TEXT: 6.0,
}
"""Each boost multiplies a token's share of the (nearly uniform) random distribution by e^bias: a few percent
each, so most turns carry several special tokens and many end on one of the end ids."""
EPISODES = 8


async def test_fuzzed_episodes_end_in_valid_states_with_exact_trajectories(proxy, tokenizer):
    client = SGLangClient(proxy.base_url, retry_delay=0.05, max_retries=3)
    params = {
        "temperature": 1.0,
        "max_new_tokens": 48,
        "logit_bias": {str(k): v for k, v in SPECIALS.items()},
    }
    plugin = settings(max_tool_iters=3)
    try:
        records = await asyncio.gather(
            *(
                run_episode(
                    tokenizer,
                    client,
                    plugin,
                    EpisodeSpec(
                        prompt="What is 2 + 3?",
                        sampling_params=params,
                        routing_key=f"fuzz-{i}",
                        max_response_tokens=400,
                    ),
                )
                for i in range(EPISODES)
            )
        )
    finally:
        await client.aclose()
    for i, record in enumerate(records):
        assert TREATMENTS[record.termination].status in ("COMPLETED", "TRUNCATED"), (
            i,
            record.termination,
            record.error,
        )
        assert record.termination is not Termination.FAILED
        check_record(record, proxy, f"fuzz-{i}")
    generated = [t for r in records for s in r.trajectory.spans if s.kind == "generated" for t in s.token_ids]
    assert sum(t in SPECIALS for t in generated) >= EPISODES, "the fuzzer wrote hardly any special token"
