"""``summarize`` compaction always leaves room for the summary (issue 28, section 2), through real HTTP, the real
Qwen3 tokenizer and a real Strands agent.

One tool result can jump a segment from under ``trigger_share`` to the window's edge. The scripted policy
below fills a segment with small tool calls up to a chosen level, then calls a tool whose result has a chosen
size, then finishes the task with a few more calls: every such episode must compact (>= 2 segments) and
end with the answer, never ``max_tokens`` / ``context_full`` for want of room for the summary; a summary is
only ever asked with its whole budget free, and one cut at that budget is never used. The trajectory
invariants are checked on every segment against its own requests."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from fanout_kit import SUMMARY_MARK, add_call, assert_segments
from rollout_tools import add, huge_output

from slime_strands import SGLangClient
from slime_strands.agent.compaction import SUMMARY_HEADER
from slime_strands.agent.episode import EpisodeSpec, run_episode
from slime_strands.agent.record import EpisodeRecord, Termination
from slime_strands.errors import ConfigurationError
from slime_strands.provider.client import SGLANG_CONTEXT_MARGIN
from slime_strands.settings import PluginSettings
from slime_strands.testing import SGLangTestServer, Turn

pytestmark = pytest.mark.timeout(120)

WINDOW = 1800  # the window
TRIGGER = 0.8  # the default trigger_share
LINE = "line {}: " + "x" * 40  # one line of rollout_tools.huge_output
CAP = 256  # the policy's per-turn max_new_tokens


SUMMARY = (
    "Summary {n}: the task is to add numbers with the add tool, print lines with huge_output, then add a few "
    "more. The additions so far are done and checked, the lines were printed as asked, and what remains is "
    "the last few additions and the final answer on its own line."
)  # ~60 tokens: within the default budget of an 1,800-token window (112)
SAY = "The lines are printed; the running total is checked. Next I add one more.\n"


def huge_call(n: int) -> str:
    return f'<tool_call>\n{{"name": "huge_output", "arguments": {{"n": {n}}}}}\n</tool_call>'


@dataclasses.dataclass(frozen=True)
class Limit:
    """Which limit the episode runs into: the window the client discovers from the server, one configured
    below it, or the response budget."""

    name: str
    served: int
    context: int | None = None
    budget: int | None = None

    @property
    def size(self) -> int:
        """Tokens a segment may hold (or respond with, for the budget)."""
        if self.budget is not None:
            return self.budget
        return self.context if self.context is not None else self.served - SGLANG_CONTEXT_MARGIN


LIMITS = [
    Limit("served window", served=WINDOW),
    Limit("configured window", served=32768, context=WINDOW - SGLANG_CONTEXT_MARGIN),
    Limit("response budget", served=32768, budget=WINDOW),
]


class JumpPolicy:
    """The server's responder: ``add`` calls while the segment would then still hold under ``level`` tokens
    (of the window, or of the response budget), then one turn that says enough (`` ok`` tokens) before its
    ``huge_output`` call for the segment to hold exactly ``level`` tokens, whose result is about ``result``
    tokens; then ``after`` more ``add`` calls and the answer. A request ending with the summary request gets
    ``summary``."""

    def __init__(
        self,
        server: SGLangTestServer,
        tokenizer: Any,
        *,
        level: int,
        result: int,
        response: bool,
        after: int = 3,
        summary: str = SUMMARY,
    ) -> None:
        self.tokenizer = tokenizer
        self.level, self.response, self.after, self.summary = level, response, after, summary
        per_line = len(tokenizer.encode(LINE.format(100) + "\n", add_special_tokens=False))
        self.lines = max(1, math.ceil(result / per_line))
        self.result_tokens = len(tokenizer.encode(huge_text(self.lines), add_special_tokens=False))
        self.call_ids = tokenizer.encode(huge_call(self.lines), add_special_tokens=False)
        self.pad_unit = tokenizer.encode(" ok", add_special_tokens=False)
        self.summaries: list[str] = []
        self.prompt = 0  # the current segment's prompt (a request shorter than the last opens a segment)
        self.last_input = 0
        self.jump_at: int | None = None  # what the segment held once huge_output was called
        self.adds = 0
        self.answered = False
        server.responder = self

    def __call__(self, body: dict[str, Any], headers: dict[str, str]) -> Turn:
        ids = body["input_ids"]
        if SUMMARY_MARK in self.tokenizer.decode(ids[-120:]):
            self.summaries.append(self.summary.format(n=len(self.summaries) + 1))
            return Turn(self.summaries[-1])
        if len(ids) < self.last_input or not self.last_input:
            self.prompt = len(ids)
        self.last_input = len(ids)
        if self.jump_at is None:
            held = len(ids) - (self.prompt if self.response else 0)
            call = len(self.call_ids) + 1  # with the end-of-turn token
            if held + 48 + call < self.level:  # an add turn and its result take fewer than 48 tokens
                self.adds += 1
                return Turn(add_call(self.adds))
            pad = self.level - held - call
            assert pad >= 0
            self.jump_at = held + pad + call
            return Turn(token_ids=(self.pad_unit * pad)[:pad] + self.call_ids)
        if self.after:  # a turn that says something before its call, as policies do
            self.after -= 1
            self.adds += 1
            return Turn(SAY + add_call(self.adds))
        self.answered = True
        return Turn("All done.\nAnswer: \\boxed{7}")


def huge_text(n: int) -> str:
    return "\n".join(LINE.format(i) for i in range(n))


async def run(server, tokenizer, limit: Limit, **compaction: Any) -> EpisodeRecord:
    config = PluginSettings.from_mapping(
        {
            "tools": [],
            "system_prompt": "Add numbers with the add tool; print lines with huge_output.",
            "max_tool_iters": None,
            "context_management": "summarize",
            "compaction": compaction,
        }
    )
    spec = EpisodeSpec(
        prompt="Add some numbers, print the lines, then add a few more.",
        sampling_params={"max_new_tokens": CAP},
        max_context_tokens=limit.context,
        max_response_tokens=limit.budget,
    )
    client = SGLangClient(server.base_url, retry_delay=0.01, max_retries=1)
    return await run_episode(tokenizer, client, config, spec, tools=[add, huge_output])


def generated_turns(record: EpisodeRecord) -> list[Any]:
    return [s for seg in record.segments for s in seg.trajectory.spans if s.kind == "generated"]


def summary_requests(server: SGLangTestServer, tokenizer: Any) -> list[Any]:
    return [
        r for r in server.generate_requests if SUMMARY_MARK in tokenizer.decode(r.body["input_ids"][-120:])
    ]


def summary_budget(limit: Limit, summary_max_tokens: int | None) -> int:
    """``summary_max_tokens``, or its documented default: 1024, or a sixteenth of the context window or of
    the response budget when smaller."""
    if summary_max_tokens is not None:
        return summary_max_tokens
    window = limit.context if limit.context is not None else limit.served - SGLANG_CONTEXT_MARGIN
    return min(1024, window // 16, *([limit.budget // 16] if limit.budget is not None else []))


def assert_summaries_had_room(
    server, tokenizer, limit: Limit, summary_max_tokens: int | None, closing: list[Any]
) -> None:
    """Every summary was asked with its whole budget as ``max_new_tokens``, and the segment it closes (window,
    or response budget) held the request and that whole budget."""
    budget = summary_budget(limit, summary_max_tokens)
    requests = summary_requests(server, tokenizer)
    assert len(requests) == len(closing)
    for request, tm in zip(requests, closing, strict=True):
        assert request.body["sampling_params"]["max_new_tokens"] == budget
        sent = len(request.body["input_ids"])
        held = sent - tm.prompt_length if limit.budget is not None else sent
        assert held + budget <= limit.size, "the summary had its whole budget"


# (segment level before the jump, result tokens): a small and a large jump over the trigger, the issue's
# 1,415 -> 1,765, a jump from half full to the edge or past it, and results that alone fill most of the
# window, or more than it.
JUMPS = {
    "small jump over the trigger": (int(TRIGGER * WINDOW) - 20, 40),
    "the issue's 1,415 -> 1,765": (1416, 350),
    "from half full to the edge": (900, 830),
    "past the window": (1200, 900),
    "results fill most of the window": (500, int(0.75 * WINDOW)),
    "a result larger than the window": (700, int(1.4 * WINDOW)),
}


@pytest.mark.parametrize("limit", LIMITS, ids=lambda limit: limit.name)
@pytest.mark.parametrize("jump", JUMPS, ids=str)
@pytest.mark.parametrize("summary_max_tokens", [None, 160], ids=["default budget", "160-token budget"])
async def test_a_jumping_tool_result_compacts_and_the_episode_goes_on(
    tokenizer, limit, jump, summary_max_tokens
):
    level, result = JUMPS[jump]
    knobs = {} if summary_max_tokens is None else {"summary_max_tokens": summary_max_tokens}
    with SGLangTestServer(tokenizer, context_length=limit.served) as server:
        policy = JumpPolicy(server, tokenizer, level=level, result=result, response=limit.budget is not None)
        record = await run(server, tokenizer, limit, **knobs)

        trajectories = [s.trajectory for s in record.segments]
        assert_segments(server, trajectories)
        # The task is done: the jump compacted the history instead of ending the episode.
        assert record.termination is Termination.END_TURN, (record.termination, record.error)
        assert policy.answered and "\\boxed{7}" in record.response
        assert len(record.segments) >= 2 and record.compactions == len(record.segments) - 1
        assert all(s.kind == "main" for s in record.segments)
        assert [s.status for s in record.segments] == ["COMPLETED"] * len(record.segments)
        # No turn was cut, the summaries least of all; each compaction used a summary the policy wrote.
        assert {t.info.finish_reason for t in generated_turns(record)} == {"stop"}
        assert [s.opened_by for s in record.segments[1:]] == ["summarize"] * record.compactions
        assert len(policy.summaries) == record.compactions
        for before, after, summary in zip(
            record.segments, record.segments[1:], policy.summaries, strict=False
        ):
            last = before.trajectory.spans[-1]  # the summary: the closing segment's last, whole turn
            assert last.kind == "generated" and tokenizer.decode(last.token_ids[:-1]) == summary
            prompt = tokenizer.decode(after.trajectory.token_ids[: after.trajectory.prompt_length])
            assert SUMMARY_HEADER in prompt and summary in prompt
        assert_summaries_had_room(server, tokenizer, limit, summary_max_tokens, trajectories[:-1])
        for tm in trajectories:
            held = tm.response_length if limit.budget is not None else len(tm)
            assert held <= limit.size

        # The premise: the segment was below the trigger when the result arrived, and the result crossed it.
        assert policy.jump_at is not None
        assert policy.jump_at < TRIGGER * limit.size < policy.jump_at + policy.result_tokens
        # The result is read whole (in the closing segment before its summary, or after the summary in the
        # next one): it is cut only where it alone would leave no room to work and then summarise.
        reader = next(
            tm for tm in trajectories if LINE.format(policy.lines - 1) in tokenizer.decode(tm.token_ids)
        )
        seen = tokenizer.decode(reader.token_ids)
        if "tool output truncated" in seen:
            assert limit.budget is None, "a new segment's prompt is not response: the budget never cuts it"
            assert record.tool_outputs_truncated >= 1 and reader is not trajectories[0]
            assert policy.result_tokens > 0.5 * limit.size, (
                "only a result that fills most of the window is cut"
            )
        else:
            assert LINE.format(0) in seen and record.tool_outputs_truncated == 0


@pytest.mark.parametrize("limit", LIMITS, ids=lambda limit: limit.name)
async def test_a_result_arriving_over_the_trigger_follows_a_summary_asked_before_it(tokenizer, limit):
    # The segment is over the trigger when a ~350-token result arrives: the summary cannot be asked after the
    # result with its whole budget (the model refuses that request before sending it), so it is asked
    # before, and the result follows it whole in the next segment.
    with SGLangTestServer(tokenizer, context_length=limit.served) as server:
        policy = JumpPolicy(server, tokenizer, level=1460, result=350, response=limit.budget is not None)
        record = await run(server, tokenizer, limit)
        trajectories = [s.trajectory for s in record.segments]
        assert_segments(server, trajectories)
        assert policy.jump_at is not None and policy.jump_at >= TRIGGER * limit.size, "the premise"
        assert record.termination is Termination.END_TURN and policy.answered
        assert record.compactions >= 1 and record.tool_outputs_truncated == 0
        closing, following = (tokenizer.decode(tm.token_ids) for tm in trajectories[:2])
        assert LINE.format(0) not in closing and SUMMARY_MARK in closing
        assert following.index(policy.summaries[0]) < following.index(LINE.format(0))
        assert LINE.format(policy.lines - 1) in following
        assert_summaries_had_room(server, tokenizer, limit, None, trajectories[:-1])


LONG_SUMMARY = "Summary {n}: " + " ".join(f"step {i} added one to the running total;" for i in range(30))


async def test_a_summary_cut_at_its_budget_is_never_used(tokenizer):
    # The policy's summary is ~300 tokens, its budget 48: the summary is cut, so the compaction keeps the
    # task and the newest messages (sliding_window) instead of a truncated summary; the episode goes on.
    with SGLangTestServer(tokenizer, context_length=WINDOW) as server:
        policy = JumpPolicy(server, tokenizer, level=1415, result=350, response=False, summary=LONG_SUMMARY)
        record = await run(server, tokenizer, LIMITS[0], summary_max_tokens=48, window_size=4)
        trajectories = [s.trajectory for s in record.segments]
        assert_segments(server, trajectories)
        assert record.termination is Termination.END_TURN and policy.answered
        assert len(record.segments) >= 2 and policy.summaries
        for before, after in zip(record.segments, record.segments[1:], strict=False):
            assert after.opened_by == "sliding_window" and before.closed_by == "compaction"
            last = before.trajectory.spans[-1]
            assert last.kind == "generated" and last.info.finish_reason == "length" and len(last) == 48
            assert tokenizer.decode(last.token_ids).startswith("Summary ")
            prompt = tokenizer.decode(after.trajectory.token_ids[: after.trajectory.prompt_length])
            assert SUMMARY_HEADER not in prompt and "Summary " not in prompt, (
                "no truncated summary as context"
            )
            calls = prompt.count('"name": "add", "arguments"') + prompt.count(
                '"name": "huge_output", "arguments"'
            )
            assert calls <= 2, "the task and the newest window_size=4 messages (two calls and their results)"
        assert "\\boxed{7}" in record.response


async def test_a_summary_budget_the_window_cannot_hold_stops_the_run(tokenizer):
    with SGLangTestServer(tokenizer, context_length=WINDOW) as server:
        JumpPolicy(server, tokenizer, level=1415, result=350, response=False)
        with pytest.raises(ConfigurationError, match=r"compaction\.summary_max_tokens to at most \d+"):
            await run(server, tokenizer, LIMITS[0], summary_max_tokens=1000)
        assert not server.generate_requests, "refused before the first turn"


async def test_a_task_that_leaves_no_room_for_a_summary_still_runs(tokenizer):
    # A task of ~1,400 tokens (with the system prompt and tools ~1,600) in the 1,800-token window leaves less than the summary's room and a turn's: its
    # turns run as without context management (the room kept for a summary is never what ends an episode).
    with SGLangTestServer(tokenizer, context_length=WINDOW) as server:
        server.script("Answer: \\boxed{7}")
        task = "Add numbers. Notes: " + " ".join(f"note {i} says nothing new;" for i in range(160))
        record = await run_episode(
            tokenizer,
            SGLangClient(server.base_url, retry_delay=0.01, max_retries=1),
            PluginSettings.from_mapping({"tools": [], "context_management": "summarize"}),
            EpisodeSpec(prompt=task, sampling_params={"max_new_tokens": CAP}),
            tools=[add],
        )
        assert record.termination is Termination.END_TURN, (record.termination, record.error)
        (segment,) = record.segments
        assert_segments(server, [segment.trajectory])
        assert segment.trajectory.prompt_length > WINDOW - 400, (
            "the premise: the task fills most of the window"
        )
        assert record.termination is Termination.END_TURN and "\\boxed{7}" in record.response
