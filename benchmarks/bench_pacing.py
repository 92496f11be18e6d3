"""Strands' own cost per turn over hundreds of tool rounds: one invocation against paced invocations.

A Strands invocation runs its tool rounds recursively (the model call after a round happens inside that
round's generator), so every event of turn N passes through N nested generators, and after ~245 rounds on
Python 3.12 the nesting passes the recursion limit. slime-strands runs episodes as several invocations
(``slime_strands.agent.pacing``, ``tool_rounds_per_invocation``). This drives an agent slime-strands builds
(``build_agent`` + ``run_agent``) around a model that does nothing (``bench_client``'s null model: a scripted
tool call per turn whose tool returns 100-300 words, then an answer) for ``--rounds`` tool rounds, once as a
single invocation and once paced, each in a fresh process with the episodes' garbage-collector setting, and
prints the process CPU per turn (between the ends of consecutive model calls: Strands' loop, the tool and the
history copies) in windows of turns, the paced/single ratio, and how each run ended.

    python benchmarks/bench_pacing.py                       # 400 rounds, paced by 16 (~1 min on 2 cores)
    python benchmarks/bench_pacing.py --rounds 40 --pace 8  # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_client, beside this file

WINDOW = 50
"""Turns per row of the table."""


async def _run(rounds: int, pace: int | None) -> dict[str, Any]:
    from bench_client import _null_model
    from bench_tools import lookup
    from strands.hooks import AfterModelCallEvent, HookProvider, HookRegistry

    from slime_strands.agent.episode import build_agent, run_agent
    from slime_strands.agent.limits import ToolLimiter
    from slime_strands.agent.runtime import raise_gc_threshold
    from slime_strands.settings import PluginSettings

    class TurnEnds(HookProvider):
        def __init__(self) -> None:
            self.cpu: list[float] = []

        def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
            registry.add_callback(AfterModelCallEvent, lambda _: self.cpu.append(time.process_time()))

    raise_gc_threshold(PluginSettings())
    model = _null_model(rounds + 1)
    ends = TurnEnds()
    agent = build_agent(model, tools=[lookup], hooks=[ends], system_prompt="Use the lookup tool.")
    started = time.process_time()
    termination, error = await run_agent(
        agent, "Gather records, then answer.", limiter=ToolLimiter(), tool_rounds_per_invocation=pace
    )
    per_turn = [b - a for a, b in itertools.pairwise(ends.cpu)]  # turn 2 onwards: one full round each
    return {
        "turns": model.turns,
        "ended": termination.value,
        "error": error,
        "cpu_s": time.process_time() - started,
        "per_turn_ms": [1e3 * t for t in per_turn],
    }


def _worker(rounds: int, pace: int | None) -> dict[str, Any]:
    argv = [sys.executable, os.path.abspath(__file__), "_run", str(rounds), str(pace)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


def _window_median(per_turn: list[float], start: int) -> float | None:
    chunk = per_turn[start : start + WINDOW]
    return statistics.median(chunk) if chunk else None


def format_report(rounds: int, pace: int, single: dict[str, Any], paced: dict[str, Any]) -> str:
    """The table: median CPU per turn in windows of WINDOW turns, then the totals and the endings."""
    lines = [
        f"| turns (of {rounds} tool rounds + the answer) | one invocation, ms/turn | paced by {pace}, ms/turn "
        "| paced vs one |",
        "|---|---|---|---|",
    ]
    measured = max(len(single["per_turn_ms"]), len(paced["per_turn_ms"]))
    for start in range(0, measured, WINDOW):
        one, many = _window_median(single["per_turn_ms"], start), _window_median(paced["per_turn_ms"], start)
        ratio = f"{many / one:.2f}x" if one and many else "-"
        cells = [f"{v:.2f}" if v is not None else "(ended)" for v in (one, many)]
        turns = f"{start + 2}-{min(start + WINDOW, measured) + 1}"  # per-turn figures start at turn 2
        lines.append(f"| {turns} | {cells[0]} | {cells[1]} | {ratio} |")
    lines.append("")
    for name, run in (("one invocation", single), (f"paced by {pace}", paced)):
        ending = run["ended"] + (f" ({run['error']})" if run["error"] else "")
        lines.append(f"{name}: {run['turns']} model calls, {run['cpu_s']:.2f} s CPU, ended {ending[:160]}")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_run":
        pace = None if sys.argv[3] == "None" else int(sys.argv[3])
        print(json.dumps(asyncio.run(_run(int(sys.argv[2]), pace))))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=400, help="tool rounds before the answer")
    parser.add_argument("--pace", type=int, default=16, help="tool rounds per invocation in the paced run")
    args = parser.parse_args()
    single, paced = _worker(args.rounds, None), _worker(args.rounds, args.pace)
    print(f"python benchmarks/bench_pacing.py --rounds {args.rounds} --pace {args.pace}")
    print(format_report(args.rounds, args.pace, single, paced))


if __name__ == "__main__":
    main()
