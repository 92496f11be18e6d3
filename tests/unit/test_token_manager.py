"""TokenManager: append-only trajectory, masks, logprobs, segments."""

from __future__ import annotations

import pytest

from slime_strands import TokenManager, TurnInfo
from slime_strands.testing.invariants import assert_trajectory_invariants

STOP = TurnInfo(finish_reason="stop", prompt_tokens=3, cached_tokens=0, weight_version="1", rid="r1")


def build() -> TokenManager:
    tm = TokenManager()
    tm.add_prompt([1, 2, 3])
    tm.add_generation([4, 5], [-0.5, -0.25], STOP)
    tm.add_observation([6, 7, 8])
    tm.add_generation([9], [-1.0], TurnInfo(finish_reason="length"))
    return tm


def test_empty():
    tm = TokenManager()
    assert tm.token_ids == tm.loss_mask == tm.logprobs == tm.spans == []
    assert len(tm) == tm.prompt_length == tm.response_length == tm.generated_length == 0
    assert tm.last_span is None and tm.turns == []
    assert_trajectory_invariants(tm)


def test_trajectory_views():
    tm = build()
    assert tm.token_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert tm.loss_mask == [0, 0, 0, 1, 1, 0, 0, 0, 1]
    assert tm.logprobs == [0.0, 0.0, 0.0, -0.5, -0.25, 0.0, 0.0, 0.0, -1.0]
    assert [(s.kind, s.start, s.end) for s in tm.spans] == [
        ("prompt", 0, 3),
        ("generated", 3, 5),
        ("observation", 5, 8),
        ("generated", 8, 9),
    ]
    assert len(tm) == 9 and tm.prompt_length == 3 and tm.response_length == 6 and tm.generated_length == 3
    assert [t.finish_reason for t in tm.turns] == ["stop", "length"]
    assert tm.turns[0] == STOP
    assert tm.last_span.kind == "generated"
    assert_trajectory_invariants(tm)


def test_views_are_copies():
    tm = build()
    tm.token_ids.append(99)
    tm.loss_mask[0] = 1
    tm.logprobs.clear()
    tm.spans.pop()
    assert len(tm.token_ids) == len(tm.loss_mask) == len(tm.logprobs) == 9 and len(tm.spans) == 4
    with pytest.raises(AttributeError):
        tm.spans[0].kind = "generated"  # frozen


def test_slime_slicing():
    tm = build()
    prompt_len = len(tm.spans[0])
    response = tm.token_ids[prompt_len:]
    assert (
        len(response) == len(tm.loss_mask[prompt_len:]) == len(tm.logprobs[prompt_len:]) == tm.response_length
    )


def test_prompt_rules():
    tm = TokenManager()
    with pytest.raises(ValueError):
        tm.add_prompt([])
    with pytest.raises(ValueError):
        tm.add_observation([1])
    with pytest.raises(ValueError):
        tm.add_generation([1], [0.0], STOP)
    tm.add_prompt([1])
    with pytest.raises(ValueError):
        tm.add_prompt([2])
    with pytest.raises(ValueError):
        tm.add_observation([])


def test_generation_needs_one_logprob_per_token():
    tm = TokenManager()
    tm.add_prompt([1])
    with pytest.raises(ValueError, match="2 tokens but 1 logprobs"):
        tm.add_generation([2, 3], [-0.1], STOP)
    assert tm.token_ids == [1], "nothing half-appended"


def test_reset():
    tm = build()
    tm.reset()
    assert tm.token_ids == [] and tm.spans == []
    tm.add_prompt([7])
    assert tm.prompt_length == 1


def test_ids_are_ints():
    tm = TokenManager()
    tm.add_prompt((True, 2))
    assert tm.token_ids == [1, 2] and all(type(t) is int for t in tm.token_ids)


def test_invariant_checker_catches_a_trajectory_ending_on_an_observation():
    tm = TokenManager()
    tm.add_prompt([1])
    tm.add_generation([2], [-0.1], STOP)
    tm.add_observation([3])
    with pytest.raises(AssertionError, match="half turn"):
        assert_trajectory_invariants(tm)


def test_the_older_names_of_the_spans_still_work():
    from slime_strands import Segment, Span

    tm = TokenManager()
    tm.add_prompt([1, 2])
    tm.add_generation([3], [-0.5], TurnInfo("stop"))
    assert Segment is Span and tm.segments == tm.spans and tm.last_segment == tm.last_span == tm.spans[-1]
