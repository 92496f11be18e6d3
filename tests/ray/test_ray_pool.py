"""The Ray sandbox pool on a local Ray: the same results as a local sandbox, isolation in the workers, bounded
queueing, workers lost mid-run (killed, hung), cancelled runs, pools that cannot start, nothing leaked.

Every wait is for an event (a run started, a worker replaced, a process gone) with a hang guard; nothing
asserts how long something took."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal

import pytest
from ray_kit import Gate, alive, close_pools, descendants, local_ray, pool_for, pool_settings, wait_until
from sandbox_isolation import namespaces_refused

from slime_strands.errors import ConfigurationError
from slime_strands.sandbox import RayPool, SandboxPoolError, _ray_pool, configure_sandbox, run_python
from slime_strands.settings import SandboxSettings

pytestmark = pytest.mark.timeout(300)

PROGRAMS = {
    "stdout": "import sympy\nprint(sympy.factorint(1001))",
    "traceback": "def f():\n    return 1 / 0\nf()",
    "exit": "import sys\nprint('bye')\nsys.exit(3)",
    "stderr": "import sys\nprint('to stderr', file=sys.stderr)",
    "timeout": "while True:\n    pass",
    "truncated": "print('x' * 50000)",
    "memory": "b = bytearray(4 << 30)",
    "silent": "x = 1",
}


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    with local_ray(num_cpus=4):
        yield


@pytest.fixture
async def gate():
    found = Gate()
    yield found
    found.open()  # nothing stays blocked past the test
    found.remove()


def _same_but_time(a, b) -> None:
    assert dataclasses.replace(a, duration_s=0.0) == dataclasses.replace(b, duration_s=0.0)


async def _closed(pool: RayPool) -> None:
    """Close ``pool`` and see every worker process, and everything below it, gone."""
    state = pool.state()
    processes = {w.pid for w in state.workers}
    for pid in list(processes):
        processes |= descendants(pid)
    await pool.aclose()
    await wait_until(lambda: not any(alive(p) for p in processes), "the pool's processes ending")


async def test_the_result_is_the_same_object_whichever_placement():
    """stdout, stderr, exit codes, timeouts, truncation, memory: field for field (but the run's own time)."""
    local = SandboxSettings(timeout_s=3, memory_mb=512, max_output_chars=2000)
    ray = dataclasses.replace(local, **pool_settings(workers=2, slots_per_worker=2))
    pool = RayPool(ray)
    try:
        assert await pool.start() == (await _local_backend(local))
        for name, code in PROGRAMS.items():
            here, there = await run_python(code, local), await pool.run(code)
            _same_but_time(here, there)
            assert here.to_model_text(2000) == there.to_model_text(2000), name
        assert (await pool.run(PROGRAMS["timeout"])).timed_out
    finally:
        await _closed(pool)


async def _local_backend(settings: SandboxSettings) -> str:
    from slime_strands.sandbox import ensure_isolation

    return await ensure_isolation(settings)


async def test_workers_isolate_as_the_local_sandbox_does(tmp_path):
    """Each worker checks isolation where it runs (auto: bwrap, else unshare) and its runs see no host file."""
    if namespaces_refused("auto"):
        pytest.skip(f"this machine refuses both isolating backends: {namespaces_refused('auto')}")
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host secret")
    secret.chmod(0o644)
    pool = RayPool(SandboxSettings(**pool_settings(workers=1, slots_per_worker=1), prewarm=False))
    try:
        backend = await pool.start()
        assert backend in ("bwrap", "unshare")
        result = await pool.run(f"print(open({str(secret)!r}).read())")
        assert result.backend == backend and "FileNotFoundError" in result.stderr and not result.stdout
    finally:
        await _closed(pool)


async def test_a_full_pool_queues_with_a_bound(gate):
    """Never more runs at the workers than their slots; up to max_waiting wait; one more is a tool error at once."""
    settings = SandboxSettings(
        backend="limits",
        prewarm=False,
        timeout_s=120,
        **pool_settings(workers=2, slots_per_worker=1, max_waiting=3),
    )
    pool = RayPool(settings)
    try:
        await pool.start()
        held = [asyncio.create_task(pool.run(gate.code(str(i)))) for i in range(5)]  # 2 running, 3 waiting
        await gate.wait_started(2)
        await wait_until(lambda: _waiting(pool, 3), "three runs waiting")
        refused = await pool.run("print('one too many')")
        assert refused.error and "sandbox.ray.max_waiting" in refused.error and not refused.stdout
        gate.open()
        results = await asyncio.gather(*held)
        assert [r.stdout for r in results] == [f"done {i}\n" for i in range(5)]
        state = pool.state()
        assert state.peak_busy == 2 and state.waiting == 0 and state.busy == 0
    finally:
        await _closed(pool)


def _waiting(pool: RayPool, count: int) -> bool:
    return pool.state().waiting == count


async def test_a_worker_killed_mid_run_reruns_once_elsewhere_and_is_replaced(gate):
    settings = SandboxSettings(
        backend="limits", prewarm=False, timeout_s=120, **pool_settings(workers=2, slots_per_worker=2)
    )
    pool = RayPool(settings)
    try:
        await pool.start()
        before = pool.state()
        runs = [asyncio.create_task(pool.run(gate.code(str(i)))) for i in range(4)]
        await gate.wait_started(4)  # two on each worker, all held
        victim = before.workers[0].pid
        below = descendants(victim)
        assert below, "the worker's sandbox interpreter and runs"
        os.kill(victim, signal.SIGKILL)
        await wait_until(lambda: _replaced(pool, victim), "a replacement worker")
        await gate.wait_started(6)  # the two lost runs started again
        gate.open()
        results = await asyncio.gather(*runs)
        assert sorted(r.stdout for r in results) == [f"done {i}\n" for i in range(4)]
        assert all(r.ok for r in results)
        state = pool.state()
        assert (state.retried, state.lost_workers, state.failed) == (2, 1, 0)
        await wait_until(
            lambda: not any(alive(p) for p in below), "the killed worker's sandbox processes ending"
        )
    finally:
        await _closed(pool)


def _replaced(pool: RayPool, lost_pid: int) -> bool:
    state = pool.state()
    return len(state.workers) == 2 and lost_pid not in {w.pid for w in state.workers}


async def test_a_run_whose_worker_is_lost_twice_is_a_clear_tool_error(gate):
    settings = SandboxSettings(
        backend="limits", prewarm=False, timeout_s=120, **pool_settings(workers=2, slots_per_worker=1)
    )
    pool = RayPool(settings)
    try:
        await pool.start()
        run = asyncio.create_task(pool.run(gate.code("x")))
        for attempt in (1, 2):
            await gate.wait_started(attempt)
            state = pool.state()
            busy = [w.pid for w in state.workers if w.pid in _runner_pids(gate, state)]
            assert len(busy) == 1
            os.kill(busy[0], signal.SIGKILL)
        result = await run
        assert not result.ok and result.error and "lost twice" in result.error and not result.stdout
        assert (
            "[sandbox error: the Ray sandbox worker running this code was lost twice"
            in result.to_model_text()
        )
        state = pool.state()
        assert (state.retried, state.failed) == (1, 1)
        await wait_until(lambda: _replaced_all(pool, 2), "both lost workers replaced")
        assert (await pool.run("print('after')")).stdout == "after\n"
    finally:
        await _closed(pool)


def _runner_pids(gate: Gate, state) -> set[int]:
    """Worker pids whose process tree holds a started gated run."""
    runs = {pid for _, pid in gate.started() if alive(pid)}
    return {w.pid for w in state.workers if descendants(w.pid) & runs}


def _replaced_all(pool: RayPool, count: int) -> bool:
    state = pool.state()
    return len(state.workers) == 2 and state.lost_workers == count


async def test_a_hung_worker_is_lost_after_the_timeout_and_its_margin(gate, monkeypatch):
    """A worker that stops answering (SIGSTOP: a frozen node) is killed after timeout_s + the margin; the run
    goes on elsewhere."""
    monkeypatch.setattr(_ray_pool, "ATTEMPT_MARGIN_S", 0.5)
    settings = SandboxSettings(
        backend="limits", prewarm=False, timeout_s=20, **pool_settings(workers=2, slots_per_worker=1)
    )
    pool = RayPool(settings)
    frozen = None
    try:
        await pool.start()
        run = asyncio.create_task(pool.run(gate.code("h")))
        await gate.wait_started(1)
        (frozen,) = _runner_pids(gate, pool.state())
        os.kill(frozen, signal.SIGSTOP)
        await gate.wait_started(2)  # started again on the other worker once the first was declared lost
        gate.open()
        result = await run
        assert result.stdout == "done h\n" and result.ok
        await wait_until(lambda: not alive(frozen), "the hung worker killed")
        assert pool.state().lost_workers == 1
    finally:
        if frozen is not None and alive(frozen):
            os.kill(frozen, signal.SIGCONT)
        await _closed(pool)


async def test_a_cancelled_run_is_killed_and_frees_its_slot(gate):
    settings = SandboxSettings(
        backend="limits", prewarm=False, timeout_s=120, **pool_settings(workers=1, slots_per_worker=1)
    )
    pool = RayPool(settings)
    try:
        await pool.start()
        run = asyncio.create_task(pool.run(gate.code("c")))
        ((_, pid),) = await gate.wait_started(1)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        await wait_until(lambda: not alive(pid), "the cancelled run killed")
        assert (await pool.run("print('next')")).stdout == "next\n"
        assert pool.state().busy == 0
    finally:
        await _closed(pool)


@pytest.mark.parametrize(
    ("ray", "message"),
    [
        ({"workers": 5, "cpus_per_worker": 1.0}, "need 5 CPUs, but the Ray cluster has 4 in all"),
        ({"workers": 1, "custom_resource": "sandbox_node"}, "ray start --resources '{\"sandbox_node\": N}'"),
    ],
)
async def test_a_pool_the_cluster_cannot_hold_is_a_configuration_error(ray, message):
    pool = RayPool(SandboxSettings(prewarm=False, **pool_settings(**ray)))
    try:
        with pytest.raises(SandboxPoolError, match=message.replace("(", r"\(")) as raised:
            await pool.start()
        assert isinstance(raised.value, ConfigurationError)
        with pytest.raises(SandboxPoolError):  # every later sample: at once, the same error
            await pool.run("print(1)")
    finally:
        await pool.aclose()


async def test_workers_that_cannot_be_placed_are_a_configuration_error_at_the_start_timeout():
    import ray

    @ray.remote(num_cpus=4)
    class Hog:
        def ready(self) -> bool:
            return True

    hog = Hog.remote()
    await hog.ready.remote()  # every CPU of the cluster taken
    pool = RayPool(SandboxSettings(prewarm=False, **pool_settings(workers=1, start_timeout_s=2)))
    try:
        with pytest.raises(
            SandboxPoolError, match=r"did not start within sandbox\.ray\.start_timeout_s = 2 s"
        ) as raised:
            await pool.start()
        assert "each worker needs {'CPU': 1.0}; free in the cluster now: {'CPU': 0.0}):" in str(raised.value)
    finally:
        await pool.aclose()
        ray.kill(hog)


async def test_the_room_a_start_failure_names_counts_what_the_pools_started_workers_hold():
    """Free CPUs alone understate the room a pool has when some of its workers started (they hold theirs until
    the pool gives up): the start failure's message names both."""
    import ray

    pool = RayPool(SandboxSettings(prewarm=False, **pool_settings(workers=2, cpus_per_worker=0.5)))
    try:
        await pool.start()
        await wait_until(
            lambda: ray.available_resources().get("CPU") == 3.0, "Ray's view of the workers' CPUs"
        )
        room = await pool._own.call(pool._room())
        assert room == (
            "each worker needs {'CPU': 0.5}; free in the cluster now: {'CPU': 3.0}, besides the {'CPU': 1.0} "
            "that the 2 started worker(s) of the pool's 2 hold"
        )
    finally:
        await _closed(pool)


async def test_new_settings_retire_the_pool_and_leave_nothing_behind():
    """configure_sandbox (what the plugin does per configuration) stops the old pool once its runs are done:
    its workers, their sandbox interpreters and the pool's thread end."""
    settings = SandboxSettings(prewarm=False, **pool_settings(workers=2, slots_per_worker=1))
    try:
        configure_sandbox(settings)
        assert (await run_python("print('pooled')")).stdout == "pooled\n"
        pool = pool_for(settings)
        processes = {w.pid for w in pool.state().workers}
        assert len(processes) == 2
        for pid in list(processes):
            processes |= descendants(pid)
        configure_sandbox(SandboxSettings(prewarm=False))
        await wait_until(lambda: not any(alive(p) for p in processes), "the retired pool's processes ending")
        await wait_until(lambda: not pool._own._thread.is_alive(), "the retired pool's thread ending")
        assert (await run_python("print('local again')")).stdout == "local again\n"
    finally:
        await close_pools()


async def test_inside_a_ray_actor_the_pool_uses_its_cluster_and_dies_with_it():
    """As in slime, where generate() runs in the RolloutManager actor: Ray is initialised there, the pool's
    workers are that actor's, and they end when it does."""
    import ray

    @ray.remote(num_cpus=0)
    class RolloutManagerLike:
        def generate(self, code: str) -> tuple[str, list[int]]:
            from slime_strands.sandbox import _placements, ensure_isolation, run_python
            from slime_strands.settings import RayPoolSettings  # only what the workers can import

            settings = SandboxSettings(
                prewarm=False, placement="ray", ray=RayPoolSettings(workers=2, slots_per_worker=1)
            )

            async def main() -> tuple[str, list[int]]:
                await ensure_isolation(settings)  # the plugin's first-sample preflight
                result = await run_python(code, settings)
                return result.stdout, [w.pid for w in _placements.runner(settings).state().workers]

            return asyncio.run(main())

    manager = RolloutManagerLike.remote()
    stdout, workers = await manager.generate.remote("print('in the actor')")
    assert stdout == "in the actor\n" and len(workers) == 2 and all(alive(p) for p in workers)
    again, same = await manager.generate.remote("print('again')")  # a later sample: the same pool
    assert again == "again\n" and same == workers
    processes = set(workers)
    for pid in workers:
        processes |= descendants(pid)
    ray.kill(manager)
    await wait_until(
        lambda: not any(alive(p) for p in processes), "the pool's processes ending with its owner"
    )
