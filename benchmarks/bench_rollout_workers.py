"""Rollout workers (``rollout_workers.count``): turns/s and CPU per turn in slime's process vs on Ray workers.

slime calls ``generate`` for every sample on one event loop in one process; with ``rollout_workers.count: N``
each episode runs on one of N Ray actors and slime's process (the "driver") only reads slime's args, hands the
job over, awaits the record and writes the Sample. This benchmark runs slime-strands' real ``generate`` (the
stand-in ``Sample``, slime's args as a namespace, slime's ``GenerateState`` as the plugin reads it: a tokenizer
and an abort flag that stays down) for N concurrent agents, each a real Strands agent with the real Qwen3
tokenizer and one tool (100-300 words a call) against ``bench_client.py``'s scripted SGLang-protocol server
in ANOTHER process (a tool call per turn until the trajectory nears 3k tokens, then the final answer: ~7
turns an episode). Each (agents, path) cell runs in a fresh process (its own local Ray for the worker paths,
started, warmed up on a few episodes, then timed) and prints one table of figures and ratios from one run:

  - turns/s (model calls over the timed batch's wall time) and its ratio to the in-process path's;
  - CPU ms per turn: the driver's (``time.process_time`` of slime's process, every thread, Ray's included),
    the workers' (their processes' user+system time), Ray's other processes' (raylet, GCS, idle workers:
    every other process under the driver), and the total of the three; the stand-in server's apart, with its
    share of all the CPU the run used; "cores busy": all of it over the wall time (2 at most here);
  - the driver's CPU per turn over the in-process path's (the target: <= 10%);
  - the hop's added latency per episode (p50 / p99): the time slime's process waited for the runner's record
    minus the episode's own ``run_episode`` wall time measured where it ran (on the worker: the record's
    ``wall_time_s``), so the hand-over, Ray's transport both ways, the pickling and the wait for the worker's
    loop; in-process the same difference (the runner's preflight) is the reference;
  - errors: samples not COMPLETED, without the final answer, or with tokens / loss mask / logprobs that do not
    line up.

Below the table: the targets' figures, and how many workers one driver could feed (its loop saturates at
1000 / driver-ms turns/s; a worker carries 1000 / worker-ms turns/s on one core).

    python benchmarks/bench_rollout_workers.py                 # full run (~9 min on 2 cores)
    python benchmarks/bench_rollout_workers.py --agents 8 --workers 0,1 --warmup 2  # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from bench_client import SYSTEM_PROMPT, _set_target, result_line, tokenizer_path  # noqa: E402

MAX_NEW_TOKENS = 512
RESPONSE_BUDGET = 16384
"""slime's --rollout-max-response-len: far above a 3k-token trajectory (the server stops it first)."""
TARGET_TOKENS = 3000
WARMUP_TOKENS = 1000


@dataclass
class Cell:
    agents: int
    workers: int
    base_url: str
    server_pid: int
    warmup: int


@dataclass
class Result:
    cell: Cell
    turns: int = 0
    episodes: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    driver_cpu_s: float = 0.0
    worker_cpu_s: float = 0.0
    ray_cpu_s: float = 0.0
    server_cpu_s: float = 0.0
    hop_ms: list[float] = field(default_factory=list)
    worker_episodes: list[int] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------
# One cell: a fresh process, slime's generate for every agent
# ---------------------------------------------------------------------------------------------------


def _args(cell: Cell) -> Any:
    """slime's args as generate and slime's GenerateState read them (bench_client's client settings)."""
    host, port = cell.base_url.removeprefix("http://").split(":")
    strands: dict[str, Any] = {
        "system_prompt": SYSTEM_PROMPT,
        "tools": ["bench_tools.lookup"],
        "tool_parser": "hermes",
        "max_tool_iters": None,
        "max_calls_per_turn": None,
        "max_tool_output_tokens": 10**9,
        "max_retries": 5,
    }
    if cell.workers:
        strands["rollout_workers"] = {"count": cell.workers}
    return types.SimpleNamespace(
        sglang_router_ip=host, sglang_router_port=int(port), hf_checkpoint=tokenizer_path(),
        rollout_max_response_len=RESPONSE_BUDGET, eval_max_response_len=RESPONSE_BUDGET,
        rollout_max_context_len=None, eval_max_context_len=None, partial_rollout=False,
        use_rollout_routing_replay=False, apply_chat_template=False, apply_chat_template_kwargs={},
        reward_key=None, eval_reward_key=None, strands=strands,
        sglang_server_concurrency=max(cell.agents, 16), rollout_num_gpus=1, rollout_num_gpus_per_engine=1,
        rollout_temperature=1.0, rollout_top_p=1.0, rollout_top_k=-1, rollout_stop=None,
        rollout_stop_token_ids=None, rollout_skip_special_tokens=False, sglang_dp_size=1, n_samples_per_prompt=1,
        sglang_enable_deterministic_inference=False, ci_test=False,
    )  # fmt: skip


SAMPLING_PARAMS = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "max_new_tokens": RESPONSE_BUDGET,  # slime: the whole response's budget (the server stops each turn first)
    "stop": None,
    "stop_token_ids": None,
    "skip_special_tokens": False,
    "no_stop_trim": True,
    "spaces_between_special_tokens": False,
}


def _install_generate_state(tokenizer: Any) -> None:
    """slime's GenerateState singleton as the plugin reads it (its tokenizer, an abort flag that stays down):
    the worker path then watches slime's abort per episode, as it does inside slime."""
    state = types.SimpleNamespace(aborted=False, tokenizer=tokenizer)
    module = types.ModuleType("slime.rollout.sglang_rollout")
    module.GenerateState = lambda args: state  # type: ignore[attr-defined]
    for name in ("slime", "slime.rollout"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["slime.rollout.sglang_rollout"] = module


class _TimedRunner:
    """Wraps the runner generate uses: how long slime's process waited for each record, and the episode's own
    run_episode wall time inside it (measured where it ran)."""

    def __init__(self, inner: Any, hops: list[float]) -> None:
        self.inner, self.hops = inner, hops

    async def run(self, runtime: Any, job: Any, **kw: Any) -> Any:
        started = time.perf_counter()
        record = await self.inner.run(runtime, job, **kw)
        self.hops.append((time.perf_counter() - started - record.wall_time_s) * 1e3)
        return record


def _cpu_s(pid: int) -> float:
    import psutil

    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


def _descendants() -> dict[int, float]:
    import psutil

    out = {}
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        out[child.pid] = float(times.user + times.system)
    return out


def _check(sample: Any) -> str | None:
    if str(getattr(sample.status, "value", sample.status)) != "completed":
        return f"status {sample.status}: {sample.metadata.get('strands', sample.metadata)}"[:300]
    if "boxed{42}" not in (sample.response or ""):
        return "no final answer"
    lengths = {sample.response_length, len(sample.loss_mask), len(sample.rollout_log_probs)}
    if len(lengths) != 1 or not any(sample.loss_mask):
        return "tokens, loss mask and logprobs do not line up"
    return None


async def _run_cell(cell: Cell) -> Result:
    from transformers import AutoTokenizer

    from slime_strands import rollout, workers
    from slime_strands.agent.record import EpisodeRecord
    from slime_strands.testing.slime_types import Sample

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    _install_generate_state(tokenizer)
    args = _args(cell)
    hops: list[float] = []
    real_runner_for = rollout.runner_for
    rollout.runner_for = lambda runtime: _TimedRunner(real_runner_for(runtime), hops)  # type: ignore[assignment]

    async def one(index: int) -> Any:
        sample = Sample(prompt=f"Research question {index}: gather records, then answer.", label="42")
        sample.index, sample.session_id = index, str(uuid.uuid4())
        await rollout.generate(args, sample, dict(SAMPLING_PARAMS))
        return sample

    # warm-up: the workers start (at the first sample), imports, template caches, connection pools
    _set_target(cell.base_url, WARMUP_TOKENS)
    for sample in await asyncio.gather(*(one(-1 - i) for i in range(cell.warmup))):
        if (problem := _check(sample)) is not None:
            raise SystemExit(f"warm-up episode failed: {problem}")
    _set_target(cell.base_url, TARGET_TOKENS)
    hops.clear()
    pool = workers.pools()[0] if cell.workers else None
    worker_pids = [w.pid for w in pool.state().workers] if pool is not None else []
    episodes_before = list(pool.state().episodes) if pool is not None else []
    others_before = _descendants()
    workers_before = {pid: _cpu_s(pid) for pid in worker_pids}
    server_before = _cpu_s(cell.server_pid)
    cpu_before, wall_before = time.process_time(), time.perf_counter()
    samples = await asyncio.gather(*(one(i) for i in range(cell.agents)))
    result = Result(cell, wall_s=time.perf_counter() - wall_before)
    result.driver_cpu_s = time.process_time() - cpu_before
    result.server_cpu_s = _cpu_s(cell.server_pid) - server_before
    result.worker_cpu_s = sum(_cpu_s(pid) - before for pid, before in workers_before.items())
    others_after = _descendants()
    result.ray_cpu_s = sum(
        cpu - others_before.get(pid, 0.0) for pid, cpu in others_after.items() if pid not in workers_before
    )
    if pool is not None:
        result.worker_episodes = [a - b for a, b in zip(pool.state().episodes, episodes_before, strict=False)]
        await pool.aclose()
    result.hop_ms = hops
    for sample in samples:
        record = EpisodeRecord.of(sample)
        result.episodes += 1
        result.turns += record.turns if record is not None else 0
        if (problem := _check(sample)) is not None:
            result.errors += 1
            result.error_samples.append(problem)
    return result


def _cell_process(spec: str) -> None:
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    cell = Cell(**json.loads(spec))
    if cell.workers:
        import ray

        os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="bench-rw-", dir="/tmp")  # a Ray of its own
        path = os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        ray.init(
            address="local",
            num_cpus=max(2, cell.workers),
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            runtime_env={"env_vars": {"PYTHONPATH": path}},
        )
    try:
        result = asyncio.run(_run_cell(cell))
    finally:
        if cell.workers:
            import ray

            ray.shutdown()
            shutil.rmtree(os.environ["RAY_TMPDIR"], ignore_errors=True)
    print("RESULT " + json.dumps(asdict(result)), flush=True)


# ---------------------------------------------------------------------------------------------------
# The orchestrator: the server process, one process per cell, one table
# ---------------------------------------------------------------------------------------------------


def _run(cell: Cell, timeout_s: float) -> Result:
    command = [sys.executable, os.path.abspath(__file__), "_cell", json.dumps(asdict(cell))]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if (data := result_line(proc.stdout)) is not None:
        return Result(**{**data, "cell": Cell(**data["cell"])})
    raise SystemExit(f"the cell {cell} failed:\n{(proc.stderr or proc.stdout)[-3000:]}")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _path(r: Result) -> str:
    return "in-process" if r.cell.workers == 0 else f"{r.cell.workers} worker{'s' * (r.cell.workers > 1)}"


def _rate(r: Result) -> float:
    return r.turns / r.wall_s if r.wall_s else float("nan")


def _ms(seconds: float, r: Result) -> float:
    return seconds * 1e3 / r.turns if r.turns else float("nan")


def _total(r: Result) -> float:
    return r.driver_cpu_s + r.worker_cpu_s + r.ray_cpu_s


def format_table(results: list[Result], command: str) -> str:
    header = (
        "| agents | path | episodes | turns | wall s | turns/s | turns/s vs in-process | CPU ms/turn total | "
        "driver | driver vs in-process | workers | Ray other | server (share of all CPU) | cores busy | "
        "hop p50 ms | hop p99 ms | errors |"
    )
    lines = [f"`{command}`", "", header, "|" + "---|" * 17]
    base: dict[int, Result] = {r.cell.agents: r for r in results if r.cell.workers == 0}
    for r in results:
        ref = base.get(r.cell.agents)
        used = _total(r) + r.server_cpu_s
        rate_ratio = f"{_rate(r) / _rate(ref):.2f}x" if ref is not None else "-"
        driver_ratio = (
            f"{r.driver_cpu_s / r.turns / (_total(ref) / ref.turns):.1%}" if ref and r.turns else "-"
        )
        lines.append(
            f"| {r.cell.agents:,} | {_path(r)} | {r.episodes} | {r.turns} | {r.wall_s:.1f} | {_rate(r):,.0f} | "
            f"{rate_ratio} | {_ms(_total(r), r):.2f} | {_ms(r.driver_cpu_s, r):.3f} | {driver_ratio} | "
            f"{_ms(r.worker_cpu_s, r):.2f} | {_ms(r.ray_cpu_s, r):.2f} | {_ms(r.server_cpu_s, r):.2f} "
            f"({r.server_cpu_s / used:.0%}) | {used / r.wall_s:.2f} | {_pct(r.hop_ms, 0.5):.1f} | "
            f"{_pct(r.hop_ms, 0.99):.1f} | {r.errors} |"
        )
    lines.append("")
    lines += _summary(results, base)
    return "\n".join(lines)


def _summary(results: list[Result], base: dict[int, Result]) -> list[str]:
    """The targets' figures and the projection of N workers, from the table's own runs."""
    out = []
    for r in results:
        ref = base.get(r.cell.agents)
        if ref is None or r.cell.workers == 0 or not r.turns:
            continue
        driver, ours = _ms(r.driver_cpu_s, r), _ms(_total(ref), ref)
        worker = _ms(r.worker_cpu_s, r)
        projected = worker / driver if driver else float("inf")
        out.append(
            f"{r.cell.agents:,} agents, {_path(r)}: driver {driver:.3f} ms/turn = {driver / ours:.1%} of the "
            f"in-process path's {ours:.2f} ms (target <= 10%); turns/s {_rate(r) / _rate(ref):.2f}x in-process"
            f"{' (target >= 1.5x)' if r.cell.workers == 2 else ''}; one driver loop carries ~{1e3 / driver:,.0f} "
            f"turns/s = ~{projected:.0f} workers at {worker:.2f} ms/turn (one core each); episodes per worker "
            f"{r.worker_episodes}"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", default="512,2048", help="concurrent agents, one batch each")
    parser.add_argument("--workers", default="0,1,2", help="0: in-process; N: N rollout workers")
    parser.add_argument("--warmup", type=int, default=32, help="episodes run before the timed batch")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per cell process, seconds")
    parser.add_argument("--json", help="also write every figure to this file")
    if len(sys.argv) > 1 and sys.argv[1] == "_cell":
        _cell_process(sys.argv[2])
        return
    ns = parser.parse_args()
    server = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "bench_client.py"), "_serve", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    results = []
    try:
        assert server.stdout is not None
        base_url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        for agents in [int(n) for n in ns.agents.split(",") if n]:
            for count in [int(n) for n in ns.workers.split(",") if n]:
                cell = Cell(agents, count, base_url, server.pid, max(ns.warmup, 2 * count))
                result = _run(cell, ns.timeout)
                print(
                    f"{agents:>6} agents {_path(result):>10}: {result.turns} turns in {result.wall_s:.1f} s, "
                    f"{result.errors} errors {result.error_samples[:1]}",
                    file=sys.stderr,
                    flush=True,
                )
                results.append(result)
    finally:
        server.kill()
        server.wait()
    command = "python benchmarks/bench_rollout_workers.py " + " ".join(sys.argv[1:])
    print(format_table(results, command.strip()))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump([asdict(r) for r in results], f)


if __name__ == "__main__":
    main()
