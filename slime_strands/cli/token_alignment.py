"""Which tokens of one sequence survive in another: a longest common subsequence of two token id lists.

Myers' greedy O((N + M) D) algorithm after stripping the common prefix and suffix, so sequences that differ in
a few places (the usual drift) align in milliseconds even at 30k tokens. ``difflib.SequenceMatcher`` is not
used: it matches longest blocks first, which on repetitive text (the same tool call twice) misaligns and
reports thousands of differences where there are a handful.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Alignment", "align"]


@dataclass(frozen=True)
class Alignment:
    """Which tokens of ``a`` and of ``b`` lie on one longest common subsequence of the two."""

    a_matched: list[bool]
    b_matched: list[bool]

    @property
    def trailing_b(self) -> int:
        """Tokens of ``b`` after the one matching ``a``'s last token (0 when that one is unmatched)."""
        if not self.a_matched or not self.a_matched[-1]:
            return 0
        last = len(self.b_matched) - 1
        while last >= 0 and not self.b_matched[last]:
            last -= 1
        return len(self.b_matched) - 1 - last


def align(a: Sequence[int], b: Sequence[int], *, max_edits: int | None = None) -> Alignment | None:
    """A longest common subsequence of ``a`` and ``b``; None when more than ``max_edits`` insertions and
    deletions would be needed (the work grows with their number)."""
    n, m = len(a), len(b)
    a_matched, b_matched = [False] * n, [False] * m
    lo = 0
    while lo < n and lo < m and a[lo] == b[lo]:
        a_matched[lo] = b_matched[lo] = True
        lo += 1
    end_a, end_b = n, m
    while end_a > lo and end_b > lo and a[end_a - 1] == b[end_b - 1]:
        end_a, end_b = end_a - 1, end_b - 1
        a_matched[end_a] = b_matched[end_b] = True
    middle_a, middle_b = a[lo:end_a], b[lo:end_b]
    trace = _shortest_edit(middle_a, middle_b, max_edits)
    if trace is None:
        return None
    for x, y in _matches(trace, len(middle_a), len(middle_b)):
        a_matched[lo + x] = b_matched[lo + y] = True
    return Alignment(a_matched, b_matched)


def _shortest_edit(a: Sequence[int], b: Sequence[int], max_edits: int | None) -> list[list[int]] | None:
    """Myers' forward pass; ``trace[d]`` holds the furthest x of diagonals k in [-d-1, d+1] before round d."""
    n, m = len(a), len(b)
    limit = n + m if max_edits is None else min(n + m, max_edits)
    offset = limit + 1
    v = [0] * (2 * limit + 3)
    trace: list[list[int]] = []
    for d in range(limit + 1):
        trace.append(v[offset - d - 1 : offset + d + 2])
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[offset + k - 1] < v[offset + k + 1]):
                x = v[offset + k + 1]  # down: an insertion from b
            else:
                x = v[offset + k - 1] + 1  # right: a deletion from a
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x, y = x + 1, y + 1
            v[offset + k] = x
            if x >= n and y >= m:
                return trace
    return None


def _matches(trace: list[list[int]], x: int, y: int) -> list[tuple[int, int]]:
    """Walk the trace back from the end: the (a, b) positions on the diagonal runs are the matches."""
    out = []
    for d in range(len(trace) - 1, -1, -1):
        row = trace[d]  # row[k + d + 1] is diagonal k
        k = x - y
        down = k == -d or (k != d and row[k + d] < row[k + d + 2])
        previous_k = k + 1 if down else k - 1
        previous_x = row[previous_k + d + 1]
        previous_y = previous_x - previous_k
        while x > previous_x and y > previous_y:
            x, y = x - 1, y - 1
            out.append((x, y))
        x, y = previous_x, previous_y
    return out
