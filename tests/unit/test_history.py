"""AgentHistory: a deep copy of it is exactly what ``copy.deepcopy`` gives, and the agents slime-strands builds
keep one through a real Strands loop (so Strands' two deep copies per model call take the C path)."""

from __future__ import annotations

import asyncio
import copy
import enum
from typing import Any

from helpers import Call, ModelTurn, final, make_model
from rollout_tools import add, helper

from slime_strands import SGLangClient
from slime_strands.agent.episode import EpisodeSpec, build_agent, run_episode
from slime_strands.agent.history import AgentHistory
from slime_strands.settings import PluginSettings
from slime_strands.testing import SGLangTestServer
from slime_strands.testing.invariants import assert_trajectory_invariants


def _history() -> AgentHistory:
    shared = {"text": "the same block twice"}
    call = {
        "toolUse": {"toolUseId": "call_1", "name": "add", "input": {"a": 2, "b": 3.5, "tags": ("x", "y")}}
    }
    return AgentHistory(
        [
            {"role": "user", "content": [{"text": "What is 2 + 3.5?"}, shared]},
            {
                "role": "assistant",
                "content": [{"reasoningContent": {"reasoningText": {"text": "add"}}}, call],
            },
            {
                "role": "user",
                "content": [
                    {
                        "toolResult": {
                            "toolUseId": "call_1",
                            "status": "success",
                            "content": [
                                {"text": "5.5"},
                                {"json": {"nan": float("nan"), "none": None, "ok": True}},
                            ],
                        }
                    },
                    {"image": {"format": "png", "source": {"bytes": b"\x89PNG"}}},
                    {
                        "document": {
                            "source": {"bytes": bytearray(b"%PDF")},
                            "set": {1, 2},
                            "frozen": frozenset("ab"),
                        }
                    },
                    shared,
                ],
            },
        ]
    )


def _shape(value: Any) -> Any:
    """Types and values all the way down (NaN compared by its text)."""
    if isinstance(value, dict):
        return (type(value), [(k, _shape(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value), [_shape(v) for v in value])
    if isinstance(value, float):
        return (float, repr(value))
    return (type(value), value)


def test_a_deep_copy_equals_copy_deepcopy_and_shares_nothing_mutable():
    history = _history()
    fast = copy.deepcopy(history)
    reference = copy.deepcopy(list(history))
    assert type(fast) is AgentHistory
    assert _shape(list(fast)) == _shape(reference)
    # shared references inside the history stay shared in the copy, as deepcopy keeps them
    assert fast[0]["content"][1] is fast[2]["content"][-1]
    # independent: editing the copy leaves the history alone
    fast[1]["content"][1]["toolUse"]["input"]["a"] = 99
    fast[2]["content"][2]["document"]["source"]["bytes"][0] = 0
    fast.append({"role": "user", "content": []})
    assert history[1]["content"][1]["toolUse"]["input"]["a"] == 2
    assert history[2]["content"][2]["document"]["source"]["bytes"] == bytearray(b"%PDF")
    assert len(history) == 3
    # the copy's copy is fast too, and equal
    assert _shape(list(copy.deepcopy(fast))) == _shape(list(fast))


def test_a_cycle_is_copied_as_a_cycle():
    block: dict[str, Any] = {"text": "loop"}
    block["self"] = block
    fast = copy.deepcopy(AgentHistory([{"role": "user", "content": [block]}]))
    copied = fast[0]["content"][0]
    assert copied["self"] is copied and copied is not block


class _Color(enum.Enum):
    RED = 1


class _Counted:
    copies = 0

    def __deepcopy__(self, memo: dict[int, Any]) -> _Counted:
        _Counted.copies += 1
        return _Counted()


class _Tagged(dict):
    pass


def test_values_that_are_not_plain_data_get_copy_deepcopy_semantics():
    _Counted.copies = 0
    marker = _Counted()
    history = AgentHistory(
        [{"role": "user", "content": [{"text": "hi", "meta": _Tagged(color=_Color.RED), "obj": marker}]}]
    )
    fast = copy.deepcopy(history)
    block = fast[0]["content"][0]
    assert type(fast) is AgentHistory
    assert type(block["meta"]) is _Tagged and block["meta"] == {"color": _Color.RED}
    assert block["meta"]["color"] is _Color.RED  # an enum member is copied as itself, as deepcopy does
    assert _Counted.copies == 1 and type(block["obj"]) is _Counted and block["obj"] is not marker


def _count_copies(monkeypatch) -> list[int]:
    """The length of every history AgentHistory deep-copies from now on."""
    copies: list[int] = []
    original = AgentHistory.__deepcopy__

    def counted(self: AgentHistory, memo: dict[int, Any]) -> AgentHistory:
        copies.append(len(self))
        return original(self, memo)

    monkeypatch.setattr(AgentHistory, "__deepcopy__", counted)
    return copies


def test_the_agents_we_build_keep_an_agent_history_through_a_real_loop(tokenizer, monkeypatch):
    copies = _count_copies(monkeypatch)
    script = [ModelTurn(reasoning="add", calls=[Call("add", {"a": 2, "b": 3})]), final("The sum is 5.")]
    with SGLangTestServer(tokenizer) as server:
        server.script(*(turn.text() for turn in script))
        model = make_model(tokenizer, server)
        agent = build_agent(model, tools=[add], system_prompt="You add numbers.")
        result = asyncio.run(agent.invoke_async("What is 2 + 3?"))
        assert "The sum is 5." in str(result)
        assert_trajectory_invariants(model.token_manager, server=server)
    assert type(agent.messages) is AgentHistory
    assert [m["role"] for m in agent.messages] == ["user", "assistant", "user", "assistant"]
    # Strands' copies of the history, two per model call, all went through AgentHistory
    assert len(copies) >= 4 and copies[0] == 1 and max(copies) == 3


def test_sub_agents_are_built_the_same_way(tokenizer, monkeypatch):
    copies = _count_copies(monkeypatch)
    script = [
        ModelTurn(reasoning="ask", calls=[Call("helper", {"task": "Add 2 and 3."})]),  # the main agent
        ModelTurn(reasoning="add", calls=[Call("add", {"a": 2, "b": 3})]),  # the helper
        final("The sum is 5."),  # the helper's answer
        final("Answer: \\boxed{5}"),  # the main agent's
    ]
    with SGLangTestServer(tokenizer) as server:
        server.script(*(turn.text() for turn in script))
        record = asyncio.run(
            run_episode(
                tokenizer,
                SGLangClient(server.base_url, max_retries=0),
                PluginSettings.from_mapping({"tools": [], "collect_subagents": True}),
                EpisodeSpec(prompt="What is 2+3?", sampling_params={"max_new_tokens": 256}),
                tools=[add, helper],
            )
        )
        for segment in record.segments:
            assert segment.trajectory is not None
            assert_trajectory_invariants(segment.trajectory)
    assert record.termination.value == "end_turn" and record.subagents == 1
    # each agent's first model call sees its one-message history, copied twice: the main agent and the helper
    assert copies.count(1) == 4 and len(copies) == 8
