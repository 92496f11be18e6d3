"""Executions per second of model-written snippets: our sandbox backends versus camel-ai's interpreter.

For each backend available here (bwrap, unshare, limits) and for camel-ai's SubprocessInterpreter (what
slime's example uses: unisolated, a new interpreter per call), runs a trivial snippet and a sympy-importing
snippet ``--runs`` times one after another, and ``--runs`` at once for our backends (bounded by the
sandbox's concurrency), and prints executions/second with the ratio to camel.

    python benchmarks/bench_sandbox.py [--runs 40] [--no-camel] [--ray | --ray-only]

"warm" is the default (numpy and sympy preloaded in the forking interpreter); "no-preload" is
``prewarm: false`` (still forked, but every run imports what it uses); "cold" starts a whole new sandbox
(namespaces + interpreter) for every run, as a per-call sandbox without a warm interpreter would.

With ``--ray`` (or ``--ray-only``), on a local Ray it starts (never another one on this machine), the Ray pool
(``sandbox.placement: ray``) against the local sandbox: the hop's cost per execution (p50 / p99 latency of the
same snippet at the same concurrency, local and through the pool), then executions/second of latency-bound
code (``time.sleep(0.1)``; ``--sleep 0.1,1`` adds longer sleeps) against the pool's size, next to the ideal (every slot busy all the time), and what
a worker costs (start time, resident memory of the actor and of its sandbox interpreter).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from slime_strands.sandbox import ExecutionResult, RayPool, Sandbox, SandboxIsolationError
from slime_strands.sandbox._backends import BACKENDS, command
from slime_strands.settings import RayPoolSettings, SandboxSettings

SNIPPETS = {
    "trivial": "print(1 + 1)",
    "sympy": "import sympy\nprint(sympy.factorint(2**64 - 1))",
}
EXPECTED = {"trivial": "2", "sympy": "{3: 1, 5: 1, 17: 1, 257: 1, 641: 1, 65537: 1, 6700417: 1}"}


async def ours(backend: str, prewarm: bool, snippet: str, runs: int) -> tuple[float, float] | str:
    """(sequential, concurrent) executions per second, or why the snippet cannot run there."""
    box = Sandbox(SandboxSettings(backend=backend, prewarm=prewarm, timeout_s=60))
    try:
        try:
            first = await box.run(SNIPPETS[snippet])  # start-up and probe are not measured
        except SandboxIsolationError as exc:  # this machine refuses the backend's namespaces
            return str(exc).split(". ", 1)[0][:100]
        if first.stdout.strip() != EXPECTED[snippet]:
            return (first.error or first.stderr.strip().splitlines()[-1])[:60]
        started = time.perf_counter()
        for _ in range(runs):
            result = await box.run(SNIPPETS[snippet])
            assert result.stdout.strip() == EXPECTED[snippet], result
        sequential = runs / (time.perf_counter() - started)
        started = time.perf_counter()
        results = await asyncio.gather(*(box.run(SNIPPETS[snippet]) for _ in range(runs)))
        assert all(r.stdout.strip() == EXPECTED[snippet] for r in results)
        concurrent = runs / (time.perf_counter() - started)
    finally:
        await box.aclose()
    return sequential, concurrent


async def cold(backend: str, snippet: str, runs: int) -> float:
    """Executions per second when every run starts (and stops) its own sandbox."""
    started = time.perf_counter()
    for _ in range(runs):
        box = Sandbox(SandboxSettings(backend=backend, prewarm=False, timeout_s=60))
        try:
            result = await box.run(SNIPPETS[snippet])
        finally:
            await box.aclose()
        assert result.stdout.strip() == EXPECTED[snippet], result
    return runs / (time.perf_counter() - started)


def camel(snippet: str, runs: int) -> float:
    from camel.interpreters import SubprocessInterpreter

    interpreter = SubprocessInterpreter(require_confirm=False, print_stdout=False, print_stderr=False)
    assert EXPECTED[snippet] in interpreter.run(SNIPPETS[snippet], "python")
    started = time.perf_counter()
    for _ in range(runs):
        interpreter.run(SNIPPETS[snippet], "python")
    return runs / (time.perf_counter() - started)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latencies(run, code: str, runs: int, concurrency: int) -> list[float]:
    """Milliseconds of each of ``runs`` executions of ``code``, ``concurrency`` at a time."""
    slots = asyncio.Semaphore(concurrency)
    found: list[float] = []

    async def one() -> None:
        async with slots:
            started = time.perf_counter()
            result = await run(code)
            found.append((time.perf_counter() - started) * 1000)
            assert result.ok, result

    await asyncio.gather(*(one() for _ in range(runs)))
    return found


async def ray_hop(runs: int, settings: SandboxSettings) -> None:
    """p50 / p99 per execution, local sandbox against the pool, same snippet and concurrency: measured in
    alternating chunks, so that both see the same load on a shared machine."""
    print(f"\nThe Ray hop: ms per execution of `print(1)`, {runs} runs each, alternating chunks (p50 / p99)")
    print(f"{'concurrency':<13}{'local p50':>10}{'local p99':>10}{'ray p50':>9}{'ray p99':>9}{'hop p50':>9}")
    for concurrency in (1, 4):
        local = Sandbox(dataclasses.replace(settings, concurrency=concurrency))
        pool = RayPool(dataclasses.replace(settings, **_pool(1, concurrency)))
        found: dict[str, list[float]] = {"local": [], "ray": []}
        try:
            await pool.start()
            for runner in (local, pool):
                await latencies(runner.run, "print(1)", 4 * concurrency, concurrency)  # warm
            chunk = 10 * concurrency
            for index in range(max(runs // chunk, 1)):
                pair = [("local", local), ("ray", pool)]
                for name, runner in pair if index % 2 == 0 else pair[::-1]:
                    found[name] += await latencies(runner.run, "print(1)", chunk, concurrency)
        finally:
            await local.aclose()
            await pool.aclose()
        figures = [_quantile(found[name], q) for name in ("local", "ray") for q in (0.5, 0.99)]
        cells = "".join(f"{f:>{w}.2f}" for f, w in zip(figures, (10, 10, 9, 9), strict=True))
        print(f"{concurrency:<13}{cells}{figures[2] - figures[0]:>9.2f}")


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _tree(pids: set[int]) -> set[int]:
    """``pids`` and every process below them."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(_stat(int(entry.name))[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = set(pids), set(pids)
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _cpu_s(pids: set[int]) -> float:
    """CPU seconds of these processes and of their children they reaped (runs end reaped by the sandbox)."""
    total = 0
    for pid in pids:
        try:
            fields = _stat(pid)
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


def _ray_daemons(ray_dir: str) -> set[int]:
    """Ray's own processes of this benchmark's Ray (their command lines name its directory)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if ray_dir.encode() in (entry / "cmdline").read_bytes():
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


async def cpu_per_run(runs: int, settings: SandboxSettings, ray_dir: str) -> None:
    """CPU milliseconds per execution of every process involved: a figure the machine's load moves less than
    latency. ``ray call`` is a call of the worker that runs nothing (Ray's own share of the hop)."""
    print(f"\nCPU per execution of `print(1)` ({runs} runs, 4 at a time), every process involved")
    local = Sandbox(dataclasses.replace(settings, concurrency=4))
    pool = RayPool(dataclasses.replace(settings, **_pool(1, 4)))
    try:
        await pool.start()
        (worker,) = pool._slots.workers()
        ray_pids = {os.getpid(), *(w.pid for w in pool.state().workers), *_ray_daemons(ray_dir)}
        await local.run("print(1)")
        assert local._interp is not None
        cases = [
            ("local", local.run, {os.getpid(), local._interp.proc.pid}),
            ("ray", pool.run, ray_pids),
            ("ray call", lambda _code: _noop(worker.handle), ray_pids),
        ]
        for name, run, pids in cases:
            await latencies(run, "print(1)", 8, 4)  # warm
            before = _cpu_s(_tree(pids))
            await latencies(run, "print(1)", runs, 4)
            spent = (_cpu_s(_tree(pids)) - before) * 1000 / runs
            print(f"{name:<9}{spent:>7.2f} ms")
    finally:
        await local.aclose()
        await pool.aclose()


async def _noop(handle: Any) -> ExecutionResult:
    """A call of the worker that runs no code (its ``start``, done already, answers at once)."""
    await handle.start.remote()
    return ExecutionResult("", "", 0)


def _pool(workers: int, slots: int) -> dict:
    return {"placement": "ray", "ray": RayPoolSettings(workers=workers, slots_per_worker=slots)}


async def ray_scaling(
    sizes: list[int], sleep: float, opts: argparse.Namespace, settings: SandboxSettings
) -> None:
    """Executions/second of ``time.sleep(sleep)`` against the pool's size, every slot kept busy (the best of
    ``repeats`` measurements: load from elsewhere only ever slows a run down)."""
    slots = opts.slots
    code = f"import time\ntime.sleep({sleep})\nprint('ok')"
    print(
        f"\nThroughput of latency-bound code (time.sleep({sleep:g})) against the pool's size, {slots} slots per worker"
    )
    print(f"{'workers':<9}{'slots':>6}{'exec/s':>9}{'ideal':>8}{'of ideal':>10}{'x first':>9}{'start s':>9}")
    first = None
    for workers in sizes:
        pool = RayPool(dataclasses.replace(settings, **_pool(workers, slots)))
        total = workers * slots
        try:
            started = time.perf_counter()
            await pool.start()
            start_s = time.perf_counter() - started
            await latencies(pool.run, code, total, total)  # warm every worker
            rates = []
            for _ in range(opts.repeats):
                started = time.perf_counter()
                await latencies(pool.run, code, total * opts.rounds, total)
                rates.append(total * opts.rounds / (time.perf_counter() - started))
        finally:
            await pool.aclose()
        rate, ideal = max(rates), total / sleep
        first = first or rate
        print(
            f"{workers:<9}{total:>6}{rate:>9.1f}{ideal:>8.0f}{rate / ideal:>9.0%}{rate / first:>8.2f}x"
            f"{start_s:>9.1f}"
        )


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _memory(pid: int) -> tuple[float, float]:
    """Resident MiB of ``pid`` and of every process below it."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    below, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - below
        below |= frontier
    return _rss_mib(pid), sum(_rss_mib(p) for p in below if Path(f"/proc/{p}").exists())


async def worker_cost(settings: SandboxSettings) -> None:
    """Resident memory of one worker: its actor process, and the sandbox interpreter below it."""
    pool = RayPool(dataclasses.replace(settings, **_pool(1, 4)))
    try:
        await pool.start()
        (worker,) = pool.state().workers
        actor, below = _memory(worker.pid)
        print(
            f"\nOne worker ({worker.backend}, prewarm {settings.prewarm}): actor process {actor:.0f} MiB, "
            f"its sandbox interpreter {below:.0f} MiB resident"
        )
    finally:
        await pool.aclose()


async def ray_benchmarks(opts: argparse.Namespace) -> None:
    import ray

    sizes = [int(n) for n in opts.pool_sizes.split(",")]
    ray_dir = tempfile.mkdtemp(prefix="ssr-bench-", dir="/tmp")  # a Ray of our own: never another one here
    os.environ["RAY_TMPDIR"] = ray_dir
    ray.init(address="local", num_cpus=max(sizes) + 1, include_dashboard=False, log_to_driver=False)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nRay {ray.__version__}, local, {os.cpu_count()} cores, load average {load} at the start")
    try:
        settings = SandboxSettings(timeout_s=60)
        await ray_hop(opts.hop_runs, settings)
        await cpu_per_run(opts.hop_runs, settings, ray_dir)
        for sleep in (float(x) for x in opts.sleep.split(",")):
            await ray_scaling(sizes, sleep, opts, settings)
        await worker_cost(settings)
        print(f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    finally:
        ray.shutdown()
        shutil.rmtree(ray_dir, ignore_errors=True)


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--no-camel", action="store_true")
    parser.add_argument("--ray", action="store_true", help="also the Ray pool (sandbox.placement: ray)")
    parser.add_argument("--ray-only", action="store_true", help="only the Ray pool")
    parser.add_argument("--hop-runs", type=int, default=300, help="executions per hop measurement")
    parser.add_argument("--pool-sizes", default="1,2,4,8", help="pool sizes (workers) for the throughput")
    parser.add_argument("--slots", type=int, default=4, help="slots per worker for the throughput")
    parser.add_argument("--rounds", type=int, default=5, help="times each slot runs the sleep, measured")
    parser.add_argument(
        "--repeats", type=int, default=3, help="measurements per pool size (the best is shown)"
    )
    parser.add_argument(
        "--sleep", default="0.1", help="seconds each latency-bound run sleeps (a list: 0.1,1)"
    )
    opts = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if not opts.ray_only:
        await backends(opts)
    if opts.ray or opts.ray_only:
        await ray_benchmarks(opts)


async def backends(opts: argparse.Namespace) -> None:
    """Our backends against camel-ai's interpreter (executions/second)."""
    root = os.geteuid() == 0
    baseline: dict[str, float] = {}
    if not opts.no_camel:
        for snippet in SNIPPETS:
            baseline[snippet] = camel(snippet, opts.runs)
    print(f"{'backend':<22}{'snippet':<9}{'seq exec/s':>12}{'vs camel':>10}{'conc exec/s':>13}")
    for snippet, rate in baseline.items():
        print(f"{'camel (unisolated)':<22}{snippet:<9}{rate:>12.1f}{1.0:>10.2f}{'-':>13}")
    for backend in BACKENDS:
        if command(backend, root=root) is None:
            print(f"{backend:<22}not installed")
            continue
        for prewarm in (True, False):
            label = backend + ("" if prewarm else " no-preload")
            for snippet in SNIPPETS:
                rates = await ours(backend, prewarm, snippet, opts.runs)
                if isinstance(rates, str):
                    print(f"{label:<22}{snippet:<9}  failed: {rates}")
                    continue
                sequential, concurrent = rates
                ratio = f"{sequential / baseline[snippet]:.2f}" if snippet in baseline else "-"
                print(f"{label:<22}{snippet:<9}{sequential:>12.1f}{ratio:>10}{concurrent:>13.1f}")
        for snippet in SNIPPETS:
            try:
                rate = await cold(backend, snippet, max(opts.runs // 4, 3))
            except (AssertionError, SandboxIsolationError) as exc:
                print(f"{backend + ' cold':<22}{snippet:<9}  failed: {str(exc)[:60]}")
                continue
            ratio = f"{rate / baseline[snippet]:.2f}" if snippet in baseline else "-"
            print(f"{backend + ' cold':<22}{snippet:<9}{rate:>12.1f}{ratio:>10}{'-':>13}")


if __name__ == "__main__":
    asyncio.run(main())
