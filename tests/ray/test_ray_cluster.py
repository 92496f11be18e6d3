"""The Ray sandbox pool on a cluster of two nodes on this machine (``ray.cluster_utils.Cluster``): workers spread
over the nodes, and a whole node removed in the middle of a batch of episodes through slime's entry point:
every sample ends well."""

from __future__ import annotations

import asyncio

import pytest
from ray_kit import (
    Gate,
    alive,
    close_pools,
    descendants,
    own_ray_tmpdir,
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

SANDBOX = {  # one worker per node of 2 CPUs: SPREAD, not a lack of room, puts them apart
    "backend": "limits",
    "prewarm": False,
    "timeout_s": 120.0,
    "placement": "ray",
    "ray": {"workers": 2, "slots_per_worker": 2, "cpus_per_worker": 1.0},
}


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    with own_ray_tmpdir():
        found = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
        nodes = [found.add_node(num_cpus=2) for _ in range(2)]
        found.wait_for_nodes()
        ray.init(address=found.address, log_to_driver=False)
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
    yield
    await close_pools()


async def test_workers_spread_over_the_nodes_and_a_node_lost_mid_batch_loses_no_sample(cluster, server):
    found, nodes = cluster
    gate = Gate()
    args = make_args(server, strands=sandbox_strands(**SANDBOX))
    pool = pool_for(PluginSettings.from_mapping(sandbox_strands(**SANDBOX)).sandbox)
    samples = [new_sample(f"Problem {i}") for i in range(6)]
    try:
        batch = asyncio.gather(
            *(
                run(server, args, sample, python_call(gate.code(str(i))), f"Answer: \\boxed{{{i}}}")
                for i, sample in enumerate(samples)
            )
        )
        await gate.wait_started(4)  # both workers full, two episodes waiting
        state = pool.state()
        assert {w.node_id for w in state.workers} == {n.node_id for n in nodes}  # one worker per node
        lost = state.workers[0]
        below = descendants(lost.pid) | {lost.pid}
        found.remove_node(next(n for n in nodes if n.node_id == lost.node_id))
        await wait_until(lambda: _replaced(pool, lost.node_id), "a replacement worker on the live node")
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
    assert all(w.node_id != lost.node_id for w in state.workers)
    await wait_until(lambda: not any(alive(p) for p in below), "the lost node's sandbox processes ending")


def _replaced(pool, lost_node: str) -> bool:
    state = pool.state()
    return len(state.workers) == 2 and all(w.node_id != lost_node for w in state.workers)
