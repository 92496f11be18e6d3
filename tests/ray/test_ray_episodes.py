"""Episodes through slime's entry point with the sandbox on a Ray pool (a local Ray): token-identical to the
same episodes with a local sandbox, and every sample of a batch ends well when a worker is killed mid-batch.

Real tokenizer, real Strands agent, the SGLang stand-in; every Sample is checked against the server's
records (the trajectory invariants)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from ray_kit import (
    Gate,
    alive,
    close_pools,
    descendants,
    local_ray,
    pool_for,
    python_call,
    sandbox_strands,
    wait_until,
)
from slime_helpers import Sample, make_args, new_sample, record, run
from standin_kit import QWEN3_EOS

from slime_strands.settings import PluginSettings
from slime_strands.testing import SGLangTestServer

pytestmark = pytest.mark.timeout(300)

RAY_POOL = {"workers": 2, "slots_per_worker": 2}
EPISODES = [  # (first program, second program): deterministic output, errors, a timeout, truncation
    ("import sympy\nprint(sympy.factorint(1001))", "print(sum(range(10)))"),
    ("def f():\n    return 1 / 0\nf()", "print('retry')"),
    ("while True:\n    pass", "import sys\nsys.exit(2)"),
    ("print('y' * 30000)", "print(__name__)"),
]


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    with local_ray(num_cpus=4):
        yield


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=16384, eos_tokens=QWEN3_EOS) as srv:
        yield srv


@pytest.fixture(autouse=True)
async def pools_closed():
    yield
    await close_pools()


async def _batch(server, placement: dict) -> list:
    args = make_args(server, strands=sandbox_strands(timeout_s=2.0, max_output_chars=2000, **placement))
    samples = [new_sample(f"Problem {i}: what is 2+3?") for i in range(len(EPISODES))]
    return await asyncio.gather(
        *(
            run(server, args, sample, python_call(first), python_call(second), "Answer: \\boxed{5}")
            for sample, (first, second) in zip(samples, EPISODES, strict=True)
        )
    )


async def test_deterministic_episodes_are_token_identical_local_and_on_ray(server):
    local = await _batch(server, {})
    on_ray = await _batch(server, {"placement": "ray", "ray": RAY_POOL})
    for here, there in zip(local, on_ray, strict=True):
        assert here.status == there.status == Sample.Status.COMPLETED
        assert here.tokens == there.tokens and here.response == there.response
        assert here.loss_mask == there.loss_mask and here.rollout_log_probs == there.rollout_log_probs
    assert (
        "[timeout: killed after 2.0 s]" in on_ray[2].response and "{7: 1, 11: 1, 13: 1}" in on_ray[0].response
    )
    state = pool_for(PluginSettings.from_mapping(sandbox_strands(**_ray_sandbox())).sandbox).state()
    assert len(state.workers) == 2 and state.peak_busy >= 1  # the ray batch really ran on the pool


def _ray_sandbox(**extra) -> dict:
    return {"timeout_s": 2.0, "max_output_chars": 2000, "placement": "ray", "ray": RAY_POOL, **extra}


async def test_every_sample_ends_well_when_a_worker_is_killed_mid_batch(server):
    gate = Gate()
    sandbox = {"backend": "limits", "prewarm": False, "timeout_s": 120.0, "placement": "ray", "ray": RAY_POOL}
    args = make_args(server, strands=sandbox_strands(**sandbox))
    pool = pool_for(PluginSettings.from_mapping(sandbox_strands(**sandbox)).sandbox)
    samples = [new_sample(f"Problem {i}") for i in range(6)]
    try:
        batch = asyncio.gather(
            *(
                run(server, args, sample, python_call(gate.code(str(i))), f"Answer: \\boxed{{{i}}}")
                for i, sample in enumerate(samples)
            )
        )
        await gate.wait_started(4)  # both workers full, two episodes waiting for a slot
        state = pool.state()
        victim = state.workers[0].pid
        below = descendants(victim)
        os.kill(victim, signal.SIGKILL)
        await wait_until(lambda: _two_workers_without(pool, victim), "the killed worker replaced")
        gate.open()
        outs = await batch
    finally:
        gate.open()
        gate.remove()
    for i, out in enumerate(outs):
        assert out.status == Sample.Status.COMPLETED, out.metadata
        assert f"<tool_response>\ndone {i}\n</tool_response>" in out.response
        assert record(out).tool_errors == 0
    state = pool.state()
    assert state.retried == 2 and state.failed == 0 and state.lost_workers == 1
    await wait_until(lambda: not any(alive(p) for p in below), "the killed worker's sandbox processes ending")


def _two_workers_without(pool, pid: int) -> bool:
    state = pool.state()
    return len(state.workers) == 2 and pid not in {w.pid for w in state.workers}
