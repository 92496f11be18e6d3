"""Rollout workers on a cluster of two nodes on this machine (``ray.cluster_utils.Cluster``): the workers spread
over the nodes, and a whole node lost in the middle of a batch of episodes through slime's entry point: the
lost node's episodes run once more on a replacement, every Sample ends COMPLETED once, none lost or doubled."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from ray_kit import alive, own_ray_tmpdir, wait_until
from slime_helpers import SLIME_PARAMS, Sample, install_generate_state, make_args, new_sample, record
from standin_kit import QWEN3_EOS
from worker_tools import GATE_ENV

from slime_strands import workers
from slime_strands.testing import SGLangTestServer
from slime_strands.testing.invariants import assert_sample_matches_server

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
GATE = Path(tempfile.mkdtemp(prefix="ssr-wcgate-", dir="/tmp"))


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    os.environ[GATE_ENV] = str(GATE)
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", GATE_ENV: str(GATE)}
    with own_ray_tmpdir():
        found = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
        nodes = [found.add_node(num_cpus=2) for _ in range(2)]
        found.wait_for_nodes()
        ray.init(address=found.address, log_to_driver=False, runtime_env={"env_vars": env})
        try:
            yield found, nodes
        finally:
            ray.shutdown()
            found.shutdown()


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=16384, eos_tokens=QWEN3_EOS) as srv:
        yield srv


@pytest.fixture(autouse=True)
async def pools_closed():
    for path in GATE.glob("*"):
        path.unlink()
    yield
    for pool in workers.pools():
        await pool.aclose()
    workers._POOLS.clear()


def _hold(key: str) -> str:
    return f'<tool_call>\n{{"name": "hold", "arguments": {{"key": "{key}"}}}}\n</tool_call>'


def _started() -> list[tuple[str, int]]:
    found = []
    for path in GATE.glob("started-*"):
        key, pid = path.name.removeprefix("started-").rsplit("-", 1)
        found.append((key, int(pid)))
    return found


async def _generate(args: Any, sample: Any) -> Any:
    from slime_strands import rollout

    return await rollout.generate(args, sample, dict(SLIME_PARAMS))


async def test_a_node_lost_mid_batch_reruns_its_episodes_once_on_a_replacement(
    cluster, server, monkeypatch, tokenizer
):
    found, nodes = cluster
    install_generate_state(monkeypatch, tokenizer)
    strands = {
        "tools": ["rollout_tools.add", "worker_tools.hold"],
        "retry_delay_s": 0.01,
        "max_retries": 3,
        "rollout_workers": {"count": 2, "max_in_flight": 2},  # 1 CPU each: SPREAD puts one on each node
    }
    args = make_args(server, strands=strands)
    samples = [new_sample(f"Problem {i}", index=i) for i in range(4)]
    for i, sample in enumerate(samples):
        server.script(_hold(str(i)), key=sample.session_id)
    batch = asyncio.gather(*(_generate(args, s) for s in samples))
    try:
        held = await wait_until(lambda: (f := _started()) and len(f) >= 4 and f, "4 episodes holding")
        (pool,) = workers.pools()
        state = pool.state()
        assert {w.node_id for w in state.workers} == {n.node_id for n in nodes}  # one worker per node
        lost = state.workers[0]
        on_lost = {key for key, pid in held if pid == lost.pid}
        assert len(on_lost) == 2  # least in flight: two on each
        found.remove_node(next(n for n in nodes if n.node_id == lost.node_id))
        await wait_until(lambda: _replaced(pool, lost.node_id), "a replacement worker on the live node")
        # a rerun starts from its prompt: it asks for its first turn again
        for i, sample in enumerate(samples):
            again = (_hold(str(i)),) if str(i) in on_lost else ()
            server.script(*again, f"Answer: \\boxed{{{i}}}", key=sample.session_id)
        (GATE / "open").touch()
        outs = await asyncio.wait_for(batch, 240)
    finally:
        (GATE / "open").touch()
    assert [out.index for out in outs] == [0, 1, 2, 3]
    for i, out in enumerate(outs):
        assert out.status == Sample.Status.COMPLETED, out.metadata
        assert f"released {i}" in out.response and out.response.count("released") == 1
        assert_sample_matches_server(out, server, routing_key=out.session_id)
        assert record(out).tool_calls == 1
    state = pool.state()
    assert state.retried == 2 and state.failed == 0 and state.lost_workers == 1
    assert sum(state.episodes) == 4 and all(w.node_id != lost.node_id for w in state.workers)
    assert not alive(lost.pid)


def _replaced(pool: Any, lost_node: str) -> bool:
    state = pool.state()
    return len(state.workers) == 2 and all(w.node_id != lost_node for w in state.workers)
