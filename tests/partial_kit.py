"""Helpers for partial-rollout tests: a scripted policy that continues a turn an abort cut, tools that hold a
batch until the abort, slime's real rollout module where its source is at hand, and the comparison of a
continued sample with the uninterrupted one.

The policy answers every routing key from its own script; logprobs, top-p spans and routing rows are functions
of the absolute position and the token (the stand-in computes the last two so), so an episode cut and
continued and the same episode run straight through must come out token for token the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import importlib.util
import sys
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from slime_helpers import SLIME_LOOP_FLAGS, make_args, slime_source

from slime_strands.agent.record import EpisodeRecord
from slime_strands.testing import SGLangTestServer, Turn

LAYERS, TOPK = 3, 2
"""The MoE shape of the tests' routing replay."""
HOLD_S = 600.0
"""A held answer waits this long unless an abort ends it: only an abort can release it within a test."""


def partial_args(server: SGLangTestServer, *, mask: bool, tools: Sequence[str], **overrides: Any) -> Any:
    """slime's args for partial rollout with top-p and routing replay on (and slime's rollout loop's flags)."""
    strands = {"tools": list(tools), "max_tool_iters": None, **overrides.pop("strands", {})}
    return make_args(
        server,
        rollout_top_p=0.9,
        use_rollout_routing_replay=True,
        num_layers=LAYERS,
        moe_router_topk=TOPK,
        partial_rollout=True,
        mask_offpolicy_in_partial_rollout=mask,
        **SLIME_LOOP_FLAGS,
        strands=strands,
        **overrides,
    )


def logprob(position: int, token: int) -> float:
    """The policy's logprob of ``token`` at ``position`` of the trajectory."""
    return -round(0.01 + ((token * 7 + position * 13) % 991) / 300.0, 6)


@dataclasses.dataclass
class _Progress:
    turn: int = 0
    current: list[int] | None = None
    served: int = 0
    last_rid: str | None = None


class ContinuingPolicy:
    """The stand-in's responder: per routing key the scripted turns in order (a summary when the request ends
    with the summary prompt); a request that follows an ``abort`` answer gets the rest of that turn.

    ``hold(key, turn, mode)``: the turn's first request waits for an abort (``running``: it then answers half
    of the turn, as a server cut mid-generation; ``queued``: nothing, as one still in the waiting queue);
    ``then_abort``: it is answered in full and ``on_hold()`` is called (slime's flag set just as it ends).
    ``parked(key)`` says when the key's request is held or waits at its gate: the moment to abort (every
    request the server knows is in its ``in_flight``, the ones about to be answered at once too).
    """

    def __init__(self, server: SGLangTestServer, tokenizer: Any, *, summary_mark: str | None = None) -> None:
        self.server = server
        self.tokenizer = tokenizer
        self.end = server.end_of_turn_id
        self.summary_mark = summary_mark
        self.scripts: dict[str | None, list[str]] = {}
        self.holds: dict[tuple[str | None, int], str] = {}
        self.gates: dict[tuple[str | None, int], threading.Event] = {}
        self.on_hold: Callable[[], None] = lambda: None
        self.latency_s = 0.0
        """Seconds a whole turn takes to generate (the rest of a cut turn: its share); an abort ends it."""
        self.weight_version: str | None = None
        self._progress: dict[str | None, _Progress] = {}
        self._parked: set[str | None] = set()
        self.summary_turns: dict[str | None, list[int]] = {}
        """Per key, the numbers of the turns answered with a summary."""
        self.servers = [server]
        server.responder = self

    def move_to(self, server: SGLangTestServer) -> None:
        """Answer on ``server`` from now on (a restarted server): turns in progress go on there."""
        self.server = server
        self.servers.append(server)
        server.responder = self

    def script(self, key: str | None, *turns: str) -> None:
        self.scripts[key] = list(turns)
        self._progress[key] = _Progress()

    def hold(self, key: str | None, turn: int, mode: str = "running") -> None:
        assert mode in ("running", "queued", "then_abort")
        self.holds[(key, turn)] = mode

    def gate(self, key: str | None, turn: int, event: threading.Event) -> None:
        """The turn's first request is answered only once ``event`` is set (the server's thread waits)."""
        self.gates[(key, turn)] = event

    def turns_done(self, key: str | None) -> int:
        return self._progress[key].turn

    def parked(self, key: str | None) -> bool:
        """Whether the key's request in flight is held (``running`` / ``queued``) or waits at its gate."""
        return key in self._parked and self._progress[key].last_rid in self.server.in_flight

    def __call__(self, body: dict[str, Any], headers: dict[str, str]) -> Turn:
        key = headers.get("x-smg-routing-key")
        self._parked.discard(key)
        progress = self._progress[key]
        input_ids = body["input_ids"]
        rid = progress.last_rid or ""
        answered = next((s for s in self.servers if rid in s.meta_infos), None)
        previous = {} if answered is None else answered.meta_infos[rid]
        if progress.current is not None and previous.get("finish_reason", {}).get("type") == "abort":
            assert answered is not None
            served = progress.served + len(answered.answers.get(rid, ([], []))[0])
            continues = input_ids[len(input_ids) - served :] == progress.current[:served]
            # the cut answer's tokens are now the tail of the input; else the turn is asked again from its
            # start (a sub-agent killed with its tool call runs again)
            progress.served = served if continues else 0
        else:
            progress.turn += 1
            progress.current, progress.served = self._next_turn(key, input_ids), 0
        progress.last_rid = str(body.get("rid"))
        rest = progress.current[progress.served :]
        start = len(input_ids)
        lps = [logprob(start + i, t) for i, t in enumerate(rest)]
        gate = self.gates.pop((key, progress.turn), None)
        if gate is not None:
            self._parked.add(key)
            gate.wait(HOLD_S)
            self._parked.discard(key)
        mode = self.holds.pop((key, progress.turn), None)
        if mode in ("running", "queued"):
            self._parked.add(key)  # the server holds the answer from here until an abort
        if mode == "then_abort":
            self.on_hold()
        elif mode == "queued":
            return Turn(token_ids=[], delay_s=HOLD_S, weight_version=self.weight_version)
        delay = HOLD_S if mode == "running" else self.latency_s * len(rest) / len(progress.current)
        return Turn(token_ids=rest[:-1], logprobs=lps, delay_s=delay, weight_version=self.weight_version)

    def _next_turn(self, key: str | None, input_ids: list[int]) -> list[int]:
        tail = self.tokenizer.decode(input_ids[-160:])
        if self.summary_mark is not None and self.summary_mark in tail:
            turns = self.summary_turns.setdefault(key, [])
            turns.append(self._progress[key].turn)
            text = f"Summary {len(turns)}: the additions are going well; keep adding."
        else:
            text = self.scripts[key].pop(0)
        return [*self.tokenizer.encode(text, add_special_tokens=False), self.end]


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Yield to the event loop until ``predicate()`` holds (the test's own timeout bounds it)."""
    while not predicate():
        await asyncio.sleep(0.01)


# -- comparisons ------------------------------------------------------------------------------------------


def as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return np.asarray(value.tolist() if hasattr(value, "tolist") else value).tolist()


def assert_same_episode(continued: Any, reference: Any, *, masked_before: int = 0) -> None:
    """``continued`` (cut and continued) is what ``reference`` (the same answers, straight through) is, token
    for token; the first ``masked_before`` response positions have loss mask 0 (off-policy masking)."""
    assert continued.status == reference.status
    assert continued.tokens == reference.tokens, "tokens differ from the uninterrupted episode"
    assert continued.response_length == reference.response_length
    assert continued.response == reference.response
    expected_mask = [0] * masked_before + list(reference.loss_mask[masked_before:])
    assert continued.loss_mask == expected_mask
    assert continued.rollout_log_probs == reference.rollout_log_probs, "logprobs differ (kept as sampled)"
    assert as_list(continued.rollout_top_p_token_ids) == as_list(reference.rollout_top_p_token_ids)
    assert as_list(continued.rollout_top_p_token_offsets) == as_list(reference.rollout_top_p_token_offsets)
    assert as_list(continued.rollout_routed_experts) == as_list(reference.rollout_routed_experts)
    ours, theirs = EpisodeRecord.of(continued), EpisodeRecord.of(reference)
    assert ours is not None and theirs is not None
    same = (
        "termination",
        "turns",
        "tool_iters",
        "tool_calls",
        "tool_errors",
        "response_tokens",
        "generated_tokens",
    )
    assert {k: getattr(ours, k) for k in same} == {k: getattr(theirs, k) for k in same}
    assert [dataclasses.replace(s, carried_tokens=0) for s in ours.segments] == list(theirs.segments)


# -- slime's real rollout module ----------------------------------------------------------------------------


_IMPORT_ONLY = ("ray", "pylatexenc")
"""Modules slime's rollout module imports at import time for code these tests never reach (Ray actors, one
reward's LaTeX parser): where they are not installed, empty placeholders let slime's real code import."""


@contextmanager
def real_slime() -> Iterator[types.ModuleType | None]:
    """slime's real ``slime.rollout.sglang_rollout`` (the source ``slime_source()`` finds), or None where slime's
    source is not at hand. On exit slime's modules (and the placeholders) leave ``sys.modules`` again, with its
    singletons (GenerateState, the HTTP client): other tests see no slime, and the next test a fresh one. A real
    package slime imported (Ray, where it is installed) stays: its compiled core cannot be imported twice in a
    process, and a second copy of its Python modules breaks every later use of Ray (tests/ray)."""
    modules, path = set(sys.modules), list(sys.path)
    source = slime_source()
    if source is not None:
        sys.path.append(str(source))
    placeholders = set()
    for name in _IMPORT_ONLY:
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            placeholder = types.ModuleType(name)
            placeholder.latex2text = None  # type: ignore[attr-defined]
            sys.modules[name] = placeholder
            placeholders.add(name)
    try:
        module: types.ModuleType | None = importlib.import_module("slime.rollout.sglang_rollout")
    except ImportError:
        module = None
    try:
        yield module
    finally:
        for name in set(sys.modules) - modules:
            if name.split(".")[0] in ("slime", *placeholders):
                del sys.modules[name]
        sys.path[:] = path
