"""Paced invocations (``slime_strands.agent.pacing``): an episode of many tool rounds runs as several Strands
invocations of one agent. Through real HTTP, the real Qwen3 tokenizer and a real Strands agent: the episode
outlives Strands' recursion limit, its trajectory is the one a single invocation gives, and tool limits and
slime's abort hold across invocations."""

from __future__ import annotations

import pytest
from fanout_kit import ScriptedPolicy, add_call, assert_segments
from rollout_tools import CALLS, add
from strands.hooks import BeforeInvocationEvent, HookProvider, HookRegistry
from strands.vended_tools.stop import stop

from slime_strands import SGLangClient, SGLangModel
from slime_strands.agent.episode import EpisodeSpec, build_agent, run_agent, run_episode
from slime_strands.agent.limits import ToolLimiter
from slime_strands.agent.record import Termination
from slime_strands.settings import PluginSettings
from slime_strands.testing import SGLangTestServer

pytestmark = pytest.mark.timeout(300)
ANSWER = "All done.\nAnswer: \\boxed{1}"


class InvocationCounter(HookProvider):
    def __init__(self) -> None:
        self.count = 0

    def register_hooks(self, registry: HookRegistry, **kwargs) -> None:
        registry.add_callback(BeforeInvocationEvent, self._count)

    def _count(self, event: BeforeInvocationEvent) -> None:
        self.count += 1


async def paced_episode(
    server, tokenizer, rounds: int, *, abort_signal=None, then: tuple[str, ...] = (), tools=(add,), **settings
):
    """``rounds`` add calls, the ``then`` turns, the answer; returns (record, invocations, add calls run)."""
    policy = ScriptedPolicy(server, tokenizer)
    policy.script(None, *(add_call(i) for i in range(rounds)), *then, ANSWER)
    config = PluginSettings.from_mapping(
        {"tools": [], "system_prompt": "Add numbers with the add tool.", "max_tool_iters": None, **settings}
    )
    client = SGLangClient(server.base_url, retry_delay=0.01, max_retries=1)
    spec = EpisodeSpec(prompt="Add 1, many times.", sampling_params={"max_new_tokens": 64})
    counter = InvocationCounter()
    calls_before = CALLS["add"]
    record = await run_episode(
        tokenizer, client, config, spec, tools=list(tools), abort_signal=abort_signal, hooks=[counter]
    )
    return record, counter.count, CALLS["add"] - calls_before


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer) as srv:
        yield srv


async def test_an_episode_past_strands_recursion_limit_ends_with_its_answer(server, tokenizer):
    # One Strands invocation nests every tool round one level deeper: ~245 rounds on Python 3.12 and ~320 on
    # 3.11 exceed Python's recursion limit (the agent fails with RecursionError). Paced by 16, 400 rounds are
    # 26 shallow invocations (the last pause comes after round 400, before the answer).
    record, invocations, calls = await paced_episode(server, tokenizer, 400)
    assert record.termination is Termination.END_TURN, record.error
    assert (record.turns, calls, invocations) == (401, 400, 26)
    assert record.response.endswith(ANSWER + "<|im_end|>")
    assert_segments(server, [record.segments[0].trajectory])


async def test_pacing_leaves_the_trajectory_unchanged(tokenizer):
    trajectories = []
    for rounds_per_invocation, expected_invocations in ((3, 4), (None, 1)):
        with SGLangTestServer(tokenizer) as server:
            record, invocations, calls = await paced_episode(
                server, tokenizer, 10, tool_rounds_per_invocation=rounds_per_invocation
            )
            assert record.termination is Termination.END_TURN, record.error
            assert (calls, invocations) == (10, expected_invocations)
            tm = record.segments[0].trajectory
            assert_segments(server, [tm])
            trajectories.append((tm.token_ids, tm.loss_mask, [s.kind for s in tm.spans]))
    assert trajectories[0] == trajectories[1]


async def test_tool_limits_count_across_invocations(server, tokenizer):
    record, invocations, calls = await paced_episode(
        server, tokenizer, 30, max_tool_iters=10, tool_rounds_per_invocation=3
    )
    assert record.termination is Termination.TOOL_LIMIT
    # Pauses after rounds 3, 6 and 9; the 11th batch is refused by the limiter in the fourth invocation.
    assert (calls, invocations, record.turns) == (10, 4, 11)
    assert_segments(server, [record.segments[0].trajectory])


async def test_an_abort_during_a_paused_round_ends_the_episode_before_the_next_model_call(server, tokenizer):
    calls_before = CALLS["add"]
    record, invocations, calls = await paced_episode(
        server,
        tokenizer,
        30,
        abort_signal=lambda: CALLS["add"] - calls_before >= 3,  # turns true during the third round's tool
        tool_rounds_per_invocation=3,
    )
    assert record.termination is Termination.ABORTED
    # The third round's call ended once the abort had begun: it is dropped (it runs again when the episode
    # continues) and the abort guard ends the loop there, before the pause could start another invocation.
    assert (calls, invocations, record.turns) == (3, 1, 3)
    assert len(server.generate_requests) == 3
    assert record.checkpoint is not None and record.checkpoint.tools.tool_iters == 2


async def test_strands_stop_tool_on_a_pause_round_ends_the_episode(server, tokenizer):
    # The stop tool asks for the same cooperative stop a pause uses; on the third round, paced by 3, the stop
    # is the tool's: no further invocation, no further model call.
    stop_call = '<tool_call>\n{"name": "stop", "arguments": {"message": "Stopping here."}}\n</tool_call>'
    record, invocations, calls = await paced_episode(
        server, tokenizer, 2, then=(stop_call,), tools=(add, stop), tool_rounds_per_invocation=3
    )
    assert (calls, invocations, record.turns) == (2, 1, 3)
    assert len(server.generate_requests) == 3
    assert record.termination is Termination.END_TURN, record.error
    assert_segments(server, [record.segments[0].trajectory])


async def test_an_agent_invoked_again_after_its_paced_run_is_not_paced(server, tokenizer):
    # Strands cannot remove a hook: once run_agent is over, the pacer must stop pausing, or a caller invoking
    # the same agent again would see it stop ("cancelled") after the pacer's count of rounds.
    policy = ScriptedPolicy(server, tokenizer)
    policy.script(None, add_call(0), add_call(1), ANSWER, *(add_call(i) for i in range(3)), ANSWER)
    model = SGLangModel(tokenizer=tokenizer, base_url=server.base_url, sampling_params={"max_new_tokens": 64})
    counter = InvocationCounter()
    agent = build_agent(model, tools=[add], hooks=[counter], system_prompt="Add numbers with the add tool.")
    termination, error = await run_agent(
        agent, "Add twice.", limiter=ToolLimiter(), tool_rounds_per_invocation=2
    )
    assert (termination, error, counter.count) == (Termination.END_TURN, None, 2)
    result = await agent.invoke_async("Add three more times.")
    assert (result.stop_reason, counter.count) == ("end_turn", 3)
    assert_segments(server, [model.token_manager])
