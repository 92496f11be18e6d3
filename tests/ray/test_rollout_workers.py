"""Agent episodes on a Ray pool of rollout workers (``rollout_workers.count``), through slime's entry points.

Real tokenizer, real Strands agent, the SGLang stand-in in this process (the workers reach it over HTTP); each
Sample is checked against the server's records (the trajectory invariants) and compared field for field with
the same greedy episode run in slime's process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest
from ray_kit import alive, own_ray_tmpdir, wait_until
from slime_helpers import (
    CALL_ADD,
    SLIME_LOOP_FLAGS,
    SLIME_PARAMS,
    Sample,
    comparable,
    install_generate_state,
    make_args,
    new_sample,
    record,
    run,
)
from standin_kit import QWEN3_EOS
from worker_tools import GATE_ENV

from slime_strands import metrics, workers
from slime_strands.errors import ConfigurationError
from slime_strands.testing import SGLangTestServer
from slime_strands.testing.invariants import assert_sample_matches_server

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
GATE = Path(tempfile.mkdtemp(prefix="ssr-wgate-", dir="/tmp"))


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    import ray

    os.environ[GATE_ENV] = str(GATE)
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", GATE_ENV: str(GATE)}
    with own_ray_tmpdir():
        ray.init(
            address="local",
            num_cpus=4,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": env},
        )
        try:
            yield
        finally:
            ray.shutdown()


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


def _strands(count: int, **extra: Any) -> dict[str, Any]:
    return {
        "tools": ["rollout_tools.add", "rollout_tools.echo", "worker_tools.hold"],
        "retry_delay_s": 0.01,
        "max_retries": 3,
        "rollout_workers": {"count": count, **extra},
        **extra.pop("strands", {}),
    }


EPISODES = [
    (CALL_ADD, "Answer: \\boxed{5}"),
    ("No tools needed. \\boxed{5}",),
    (CALL_ADD, CALL_ADD, "It is \\boxed{4}"),
    ('<tool_call>\n{"name": "echo", "arguments": {"text": "hi"}}\n</tool_call>', "\\boxed{5}"),
]


async def _batch(server, count: int, *, evaluation: bool = False) -> list[Any]:
    args = make_args(server, strands=_strands(count))
    samples = [new_sample(f"Problem {i}: what is 2+3?", index=i) for i in range(len(EPISODES))]
    return list(
        await asyncio.gather(
            *(
                run(server, args, s, *turns, evaluation=evaluation)
                for s, turns in zip(samples, EPISODES, strict=True)
            )
        )
    )


async def test_samples_are_identical_in_process_and_on_workers(server, monkeypatch, tokenizer, caplog):
    install_generate_state(monkeypatch, tokenizer)
    for evaluation in (False, True):
        here = await _batch(server, 0, evaluation=evaluation)
        there = await _batch(server, 2, evaluation=evaluation)
        for a, b in zip(here, there, strict=True):
            assert a.status == Sample.Status.COMPLETED, a.metadata
            assert comparable(a) == comparable(b)
    (pool,) = workers.pools()
    state = pool.state()
    assert len(state.workers) == 2 and len({w.pid for w in state.workers}) == 2
    assert os.getpid() not in {w.pid for w in state.workers}
    assert sorted(state.episodes) == [4, 4] and state.starts == 1  # round-robin ties: 4 each, one start
    logged = workers.worker_metrics()
    assert {k: logged[k] for k in ("workers/episodes/0", "workers/episodes/1", "workers/count")} == {
        "workers/episodes/0": 4.0,
        "workers/episodes/1": 4.0,
        "workers/count": 2.0,
    }
    assert logged["workers/lost_workers"] == logged["workers/failed"] == 0.0
    with caplog.at_level(logging.INFO, logger="slime_strands.metrics"):
        metrics.log_rollout(0, make_args(server, strands=_strands(2)), there)
    (line,) = [r.getMessage() for r in caplog.records if "slime-strands metrics" in r.getMessage()]
    assert "'rollout/strands/workers/episodes/1': 4.0" in line and "'rollout/strands/samples': 4.0" in line


async def test_samples_are_identical_through_slimes_generate_and_rm(server, slime, tokenizer):
    outs = {}
    for count in (0, 2):
        args = make_args(server, strands=_strands(count), **SLIME_LOOP_FLAGS)
        batch = []
        for i, turns in enumerate(EPISODES):
            sample = slime.Sample(prompt=f"Problem {i}", label="5", index=i, session_id=f"{count}-{i}")
            server.script(*turns, key=sample.session_id)
            batch.append(slime.generate_and_rm(args, sample, dict(SLIME_PARAMS)))
        outs[count] = await asyncio.gather(*batch)
        for out in outs[count]:
            assert_sample_matches_server(out, server, routing_key=out.session_id)
    for a, b in zip(outs[0], outs[2], strict=True):
        assert a.reward == b.reward and a.status == b.status
        assert comparable(a) == comparable(b)
    assert sum(workers.pools()[0].state().episodes) == len(EPISODES)


async def test_a_tool_that_does_not_import_on_the_workers_stops_the_run_at_the_first_sample(server):
    args = make_args(server, strands={**_strands(2), "tools": ["worker_tools.hold", "no_such_module.tool"]})
    with pytest.raises(ConfigurationError, match=r"no_such_module\.tool.*cannot be imported"):
        await rollout_generate(args, new_sample())


async def test_too_many_workers_for_the_cluster_is_one_clear_line(server):
    args = make_args(server, strands=_strands(64))
    with pytest.raises(ConfigurationError, match=r"64 workers x 1 CPUs need 64 CPUs.*rollout_workers\.count"):
        await rollout_generate(args, new_sample())


async def rollout_generate(args: Any, sample: Any) -> Any:
    from slime_strands import rollout

    return await rollout.generate(args, sample, dict(SLIME_PARAMS))


def _hold(key: str) -> str:
    return f'<tool_call>\n{{"name": "hold", "arguments": {{"key": "{key}"}}}}\n</tool_call>'


def _started() -> list[tuple[str, int]]:
    found = []
    for path in GATE.glob("started-*"):
        key, pid = path.name.removeprefix("started-").rsplit("-", 1)
        found.append((key, int(pid)))
    return found


async def test_a_worker_killed_mid_episode_reruns_its_episodes_once_and_is_replaced(
    server, monkeypatch, tokenizer
):
    install_generate_state(monkeypatch, tokenizer)
    args = make_args(server, strands=_strands(2, max_in_flight=2))
    samples = [new_sample(f"Problem {i}", index=i) for i in range(4)]
    for i, sample in enumerate(samples):
        server.script(_hold(str(i)), key=sample.session_id)  # the answer comes once the holds are placed
    batch = asyncio.gather(*(rollout_generate(args, s) for s in samples))
    try:
        held = await wait_until(lambda: (f := _started()) and len(f) >= 4 and f, "4 episodes holding")
        (pool,) = workers.pools()
        victim = pool.state().workers[0].pid
        on_victim = {key for key, pid in held if pid == victim}
        assert len(on_victim) == 2  # least in flight: two on each
        os.kill(victim, signal.SIGKILL)
        await wait_until(lambda: _two_without(pool, victim), "the killed worker replaced")
        for i, sample in enumerate(
            samples
        ):  # a rerun starts from its prompt: it asks for its first turn again
            again = (_hold(str(i)),) if str(i) in on_victim else ()
            server.script(*again, f"Answer: \\boxed{{{i}}}", key=sample.session_id)
        (GATE / "open").touch()
        outs = await asyncio.wait_for(batch, 240)
    finally:
        (GATE / "open").touch()
    for i, out in enumerate(outs):
        assert out.status == Sample.Status.COMPLETED, out.metadata
        assert f"released {i}" in out.response and out.response.count("released") == 1
        assert_sample_matches_server(out, server, routing_key=out.session_id)
        assert record(out).tool_calls == 1
    state = pool.state()
    assert state.retried == 2 and state.failed == 0 and state.lost_workers == 1
    assert not alive(victim)


def _two_without(pool: Any, pid: int) -> bool:
    state = pool.state()
    return len(state.workers) == 2 and pid not in {w.pid for w in state.workers}


async def test_slimes_abort_reaches_the_episodes_on_the_workers(server, monkeypatch, tokenizer):
    state = install_generate_state(monkeypatch, tokenizer)
    args = make_args(server, strands=_strands(2))
    samples = [new_sample(f"Problem {i}", index=i) for i in range(4)]
    for i, sample in enumerate(samples):
        server.script(_hold(str(i)), "never asked", key=sample.session_id)
    batch = asyncio.gather(*(rollout_generate(args, s) for s in samples))
    await wait_until(lambda: len(_started()) >= 4, "4 episodes holding")
    state.aborted = True  # slime's abort: the held tools stop, no episode asks for another turn
    outs = await asyncio.wait_for(batch, 120)
    for out in outs:
        assert out.status == Sample.Status.ABORTED, out.metadata
        assert server.pending(out.session_id) == 1
    with contextlib.suppress(FileNotFoundError):
        (GATE / "open").touch()


async def test_a_checkpoint_made_on_a_worker_continues_token_exact_anywhere(server, monkeypatch, tokenizer):
    """Partial rollout: slime's abort stops episodes on the workers mid-tool; each sample continues (in slime's
    process for half of them, on the workers for the others) and ends as the same episode run straight
    through in slime's process, token for token."""
    state = install_generate_state(monkeypatch, tokenizer)
    turns = [(_hold(str(i)), CALL_ADD, "Answer: \\boxed{5}") for i in range(4)]  # one gate file each
    straight = []
    args0 = make_args(server, partial_rollout=True, strands=_strands(0))
    args2 = make_args(server, partial_rollout=True, strands=_strands(2))
    (GATE / "open").touch()
    for i in range(4):
        sample = new_sample("Problem", index=i)
        straight.append(await run(server, args0, sample, *turns[i]))
    (GATE / "open").unlink()
    for path in GATE.glob("started-*"):
        path.unlink()
    samples = [new_sample("Problem", index=i) for i in range(4)]
    for i, sample in enumerate(samples):
        server.script(*turns[i], key=sample.session_id)
    batch = asyncio.gather(*(rollout_generate(args2, s) for s in samples))
    await wait_until(lambda: len(_started()) >= 4, "4 episodes holding on the workers")
    assert {pid for _, pid in _started()} == {w.pid for w in workers.pools()[0].state().workers}
    state.aborted = True
    cut = await asyncio.wait_for(batch, 120)
    assert [s.status for s in cut] == [Sample.Status.ABORTED] * 4
    state.aborted = False
    (GATE / "open").touch()
    continued = await asyncio.gather(
        *(rollout_generate(args0 if i % 2 else args2, s) for i, s in enumerate(cut))
    )
    for out, reference in zip(continued, straight, strict=True):
        assert out.status == reference.status == Sample.Status.COMPLETED, out.metadata
        assert out.tokens == reference.tokens and out.response == reference.response
        assert out.loss_mask == reference.loss_mask and out.rollout_log_probs == reference.rollout_log_probs
        assert_sample_matches_server(out, server, routing_key=out.session_id)
        assert record(out).continuations == 1


def _process_cost() -> tuple[int, int, int]:
    """This process's threads, open fds and resident memory (kB)."""
    status = Path("/proc/self/status").read_text()
    rss = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd")), rss


async def test_the_drivers_threads_fds_and_memory_stay_flat_over_three_batches(
    server, monkeypatch, tokenizer
):
    """slime's process with rollout workers: the first batch starts the pool (its Ray handles, its watches);
    the next batches add no thread, no fd and no memory beyond noise (a client, a connection or a task kept
    per episode or per batch would show here)."""
    install_generate_state(monkeypatch, tokenizer)
    args = make_args(server, strands=_strands(2))
    costs = []
    for _ in range(3):
        samples = [new_sample(f"Problem {i}: what is 2+3?", index=i) for i in range(4 * len(EPISODES))]
        outs = await asyncio.gather(
            *(run(server, args, s, *EPISODES[i % len(EPISODES)]) for i, s in enumerate(samples))
        )
        for out in outs:
            assert out.status == Sample.Status.COMPLETED, out.metadata
            assert_sample_matches_server(out, server, routing_key=out.session_id)
        costs.append(_process_cost())
    (pool,) = workers.pools()
    assert pool.state().starts == 1 and len(pool.state().workers) == 2
    (threads1, fds1, rss1), _, (threads3, fds3, rss3) = costs
    assert threads3 <= threads1, costs
    assert fds3 <= fds1 + 2, costs
    assert rss3 - rss1 < 16_000, costs  # kB: 32 episodes more, each record is a few kB


CALL_HELPER = '<tool_call>\n{"name": "helper", "arguments": {"task": "Add 2 and 3."}}\n</tool_call>'


def _plain(value: Any) -> Any:
    """A value comparable with ==: images as their pixels, arrays and tensors as their shape and bytes."""
    import numpy as np

    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "tobytes") and hasattr(value, "size") and hasattr(value, "mode"):  # a PIL image
        return ("image", value.size, value.mode, value.tobytes())
    if hasattr(value, "numpy") or isinstance(value, np.ndarray):
        array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
        return ("array", array.shape, str(array.dtype), array.tobytes())
    return value


async def test_sub_agents_fan_out_the_same_samples_on_workers(server, monkeypatch, tokenizer):
    """collect_subagents: generate returns [sub-agent's Sample, main Sample], the same on workers as here."""
    install_generate_state(monkeypatch, tokenizer)
    outs = {}
    for count in (0, 2):
        strands = {**_strands(count), "tools": ["rollout_tools.add", "rollout_tools.helper"]}
        args = make_args(
            server,
            custom_rm_path="slime_strands.reward.math_reward",
            strands={**strands, "collect_subagents": True},
        )
        sample = new_sample("What is 2+3? Ask the helper.", index=3)
        server.script(CALL_HELPER, CALL_ADD, "The sum is 5.", "Answer: \\boxed{5}", key=sample.session_id)
        out = await rollout_generate(args, sample)
        assert isinstance(out, list) and len(out) == 2 and out[1] is sample
        assert [s.status for s in out] == [Sample.Status.COMPLETED] * 2, out[1].metadata
        assert [record(s).segment for s in out] == [0, 1] and record(out[1]).subagents == 1
        assert "The sum is 5." in out[0].response and "\\boxed{5}" in out[1].response
        outs[count] = out
    for a, b in zip(outs[0], outs[2], strict=True):
        assert comparable(a) == comparable(b)
    assert sum(workers.pools()[0].state().episodes) == 1


async def test_images_give_the_same_samples_on_workers(monkeypatch, tmp_path):
    """A vision-language checkpoint (loaded by each worker from its folder), an image in the prompt and a tool
    returning a figure: the expanded tokens, the images and the trainer's pixel values are the same."""
    import base64

    from real_sglang.tiny_vl_model import make_tiny_vl_model
    from vlm_kit import png, vl_checkpoint

    from slime_strands.testing.invariants import assert_sample_images

    folder = make_tiny_vl_model(tmp_path / "qwen2.5-vl", "qwen2.5-vl")
    vl_tokenizer, vision = vl_checkpoint(folder)
    install_generate_state(monkeypatch, vl_tokenizer)
    uri = "data:image/png;base64," + base64.b64encode(png(100, 60, seed=3)).decode()
    prompt = [
        {"role": "user", "content": [{"type": "image", "image": uri}, {"type": "text", "text": "Find x."}]}
    ]
    call = '<tool_call>\n{"name": "plot", "arguments": {"expression": "x**2"}}\n</tool_call>'
    outs = []
    with SGLangTestServer(vl_tokenizer, vision=vision) as vl_server:
        for count in (0, 2):
            strands = {**_strands(count), "tools": ["rollout_tools.plot"], "tool_parser": "hermes"}
            args = make_args(vl_server, hf_checkpoint=str(folder), strands=strands)
            out = await run(vl_server, args, new_sample(prompt), call, "x = 3")
            assert out.status == Sample.Status.COMPLETED, out.metadata
            assert_sample_images(out, vision)
            assert [image.size for image in out.multimodal_inputs["images"]] == [(100, 60), (64, 64)]
            outs.append(out)
    here, there = outs
    assert _plain(comparable(here)) == _plain(comparable(there))
    assert sum(workers.pools()[0].state().episodes) == 1
