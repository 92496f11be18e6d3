"""The token alignment drift counts on: a longest common subsequence, checked against dynamic programming."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from slime_strands.cli.token_alignment import align

tokens = st.lists(st.integers(min_value=0, max_value=4), max_size=40)


def _lcs_length(a: list[int], b: list[int]) -> int:
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


@settings(max_examples=400, deadline=None)
@given(tokens, tokens)
def test_alignment_is_a_longest_common_subsequence(a, b):
    alignment = align(a, b)
    assert alignment is not None
    kept_a = [x for x, ok in zip(a, alignment.a_matched, strict=True) if ok]
    kept_b = [y for y, ok in zip(b, alignment.b_matched, strict=True) if ok]
    assert kept_a == kept_b, "the matched tokens are the same subsequence of both"
    assert len(kept_a) == _lcs_length(a, b), "and no longer one exists"


@settings(max_examples=200, deadline=None)
@given(tokens, tokens, st.integers(min_value=0, max_value=10))
def test_edit_limit_gives_up_or_is_exact(a, b, limit):
    alignment = align(a, b, max_edits=limit)
    edits = len(a) + len(b) - 2 * _lcs_length(a, b)
    if alignment is None:
        assert edits > limit
    else:
        assert sum(alignment.a_matched) == _lcs_length(a, b)


def test_trailing_tokens_after_the_last_match():
    assert align([1, 2, 3], [1, 2, 3, 9, 9]).trailing_b == 2  # a template's newline after the last turn
    assert align([1, 2, 3], [1, 5, 2, 3]).trailing_b == 0
    assert align([1, 2, 4], [1, 2, 3]).trailing_b == 0, "a's last token unmatched: nothing is trailing"
    assert align([], [7]).trailing_b == 0


def test_long_sequences_with_few_differences_align_exactly():
    a = [i % 50 for i in range(30000)]
    b = list(a)
    for position in (10, 9000, 29990):
        b[position] = 999
    alignment = align(a, b, max_edits=100)
    assert alignment is not None
    assert [i for i, ok in enumerate(alignment.a_matched) if not ok] == [10, 9000, 29990]
