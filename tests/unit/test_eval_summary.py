"""Eval summary figures computed by hand: accuracy, unbiased pass@k, agent figures, per-dataset rows."""

from __future__ import annotations

import math

import pytest

from slime_strands.cli.eval.summary import ALL, TrajectoryTally, format_table, pass_k_values, summarize


def outcome(
    prompt, sample, correct, *, dataset="d", status="COMPLETED", turns=1, tool_calls=0, parse_errors=0
):
    return TrajectoryTally(
        key=f"{prompt}:{sample}",
        prompt_index=prompt,
        dataset=dataset,
        correct=correct,
        status=status,
        turns=turns,
        tool_calls=tool_calls,
        parse_errors=parse_errors,
        generated_tokens=10,
    )


def test_k_values():
    assert pass_k_values(1) == [1]
    assert pass_k_values(4) == [1, 2, 4]
    assert pass_k_values(6) == [1, 2, 4, 6]
    assert pass_k_values(16) == [1, 2, 4, 8, 16]
    assert pass_k_values(0) == []


def test_pass_at_k_by_hand_with_three_samples():
    # prompt 0: 2 of 3 right; prompt 1: 1 of 3.
    rows = [outcome(0, s, s < 2) for s in range(3)] + [outcome(1, s, s == 0) for s in range(3)]
    (summary,) = summarize(rows)
    assert summary.accuracy == pytest.approx(3 / 6)
    assert summary.pass_at[1] == pytest.approx((2 / 3 + 1 / 3) / 2)
    # pass@2 = 1 - C(n-c, 2) / C(3, 2): prompt 0 -> 1 - 0/3 = 1; prompt 1 -> 1 - C(2,2)/3 = 2/3.
    assert summary.pass_at[2] == pytest.approx((1 + 2 / 3) / 2)
    assert summary.pass_at[3] == pytest.approx(1.0)
    assert sorted(summary.pass_at) == [1, 2, 3]


def test_prompts_with_fewer_samples_count_only_for_small_k():
    rows = [outcome(0, s, True) for s in range(4)] + [outcome(1, 0, False), outcome(1, 1, False)]
    (summary,) = summarize(rows)
    assert summary.pass_at[2] == pytest.approx((1 + 0) / 2)
    assert summary.pass_at[4] == pytest.approx(1.0), "only prompt 0 has 4 samples"
    assert summary.prompts == 2 and summary.samples == 6


def test_agent_figures_and_datasets():
    rows = [
        outcome(0, 0, True, dataset="aime", turns=3, tool_calls=2),
        outcome(0, 1, False, dataset="aime", status="TRUNCATED", turns=5, tool_calls=4, parse_errors=2),
        outcome(1, 0, False, dataset="math", status="FAILED", turns=0),
        outcome(1, 1, True, dataset="math", turns=2, tool_calls=1),
    ]
    aime, math_, every = summarize(rows)
    assert (aime.dataset, math_.dataset, every.dataset) == ("aime", "math", ALL)
    assert aime.mean_turns == 4 and aime.mean_tool_calls == 3
    assert aime.parse_error_rate == 0.5 and aime.truncation_rate == 0.5 and aime.failure_rate == 0
    assert math_.failure_rate == 0.5 and math_.accuracy == 0.5
    assert every.samples == 4 and every.prompts == 2
    assert every.mean_turns == pytest.approx(10 / 4) and every.accuracy == 0.5
    table = format_table([aime, math_, every]).splitlines()
    assert table[0].split() == [
        "dataset", "prompts", "samples", "accuracy", "pass@1", "pass@2", "turns", "tool", "calls", "parse",
        "errors", "truncated", "failed",
    ]  # fmt: skip
    assert table[2].split()[:6] == ["aime", "1", "2", "0.500", "0.500", "1.000"]
    assert table[4].split()[-3:] == ["25.0%", "25.0%", "25.0%"]


def test_unbiased_estimator_matches_the_binomial_formula():
    n, c = 8, 3
    rows = [outcome(0, s, s < c) for s in range(n)]
    (summary,) = summarize(rows)
    for k in (1, 2, 4, 8):
        assert summary.pass_at[k] == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))
