"""Helpers for long-horizon episodes (compaction, sub-agents): a scripted policy that writes a summary when asked
for one, and the per-segment trajectory invariants against the server's records."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from slime_strands.provider.token_manager import TokenManager
from slime_strands.settings import DEFAULT_SUMMARY_PROMPT
from slime_strands.testing import RecordedRequest, SGLangTestServer, Turn
from slime_strands.testing.invariants import assert_trajectory_invariants

SUMMARY = "Summary: the task is to add numbers; {n} additions are done; keep adding."
SUMMARY_MARK = DEFAULT_SUMMARY_PROMPT[:60]


def add_call(a: int, b: int = 1) -> str:
    return f'<tool_call>\n{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'


class ScriptedPolicy:
    """The server's responder: per routing key, the scripted turns in order, except that a request ending with
    the summary request is answered with a summary (as a policy asked for one would)."""

    def __init__(self, server: SGLangTestServer, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.queues: dict[str | None, collections.deque[str]] = collections.defaultdict(collections.deque)
        self.summaries: list[str] = []
        server.responder = self

    def script(self, key: str | None, *turns: str) -> None:
        self.queues[key].extend(turns)

    def __call__(self, body: dict[str, Any], headers: dict[str, str]) -> Turn:
        tail = self.tokenizer.decode(body["input_ids"][-120:])
        if SUMMARY_MARK in tail:
            self.summaries.append(SUMMARY.format(n=len(self.summaries) + 1))
            return Turn(self.summaries[-1])
        return Turn(self.queues[headers.get("x-smg-routing-key")].popleft())

    def left(self, key: str | None = None) -> int:
        return len(self.queues[key])


def forty_turns() -> list[str]:
    """39 tool calls, then the answer: a 40-turn episode."""
    return [add_call(i) for i in range(39)] + ["All 39 additions are done.\nAnswer: \\boxed{40}"]


def requests_by_segment(
    server: SGLangTestServer, trajectories: Sequence[TokenManager], *, routing_key: str | None = None
) -> list[list[RecordedRequest]]:
    """The /generate requests of each segment: those whose input starts with the segment's prompt and is a
    prefix of its tokens. Every answered request must belong to exactly one segment."""
    requests = [
        r
        for r in server.generate_requests
        if routing_key is None or r.headers.get("x-smg-routing-key") == routing_key
    ]
    out: list[list[RecordedRequest]] = [[] for _ in trajectories]
    for request in requests:
        sent = request.body["input_ids"]
        owners = [
            i
            for i, tm in enumerate(trajectories)
            if tm.prompt_length <= len(sent) <= len(tm) and tm.token_ids[: len(sent)] == sent
        ]
        if request.body.get("rid") in server.answers:
            assert len(owners) == 1, f"an answered request belongs to segments {owners}"
        for i in owners[:1]:
            out[i].append(request)
    return out


def assert_segments(
    server: SGLangTestServer, trajectories: Sequence[TokenManager], *, routing_key: str | None = None
) -> None:
    """Trajectory invariants on every segment against its own requests and the server's answers, and every
    answered request accounted for by one segment."""
    assert trajectories, "no segment"
    for tm, requests in zip(
        trajectories, requests_by_segment(server, trajectories, routing_key=routing_key), strict=True
    ):
        assert requests, "a segment without requests"
        assert_trajectory_invariants(tm, server, requests=requests)
        generated = [s for s in tm.spans if s.kind == "generated"]
        assert len(generated) == sum(r.body.get("rid") in server.answers for r in requests)
