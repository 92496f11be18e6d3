"""The values SGLang accepts for its numeric sampling params, checked before the first request.

SGLang refuses a request whose sampling params are out of range (``SamplingParams.verify``: a 400 for that
request), so a ``--temperature -1`` would fail every turn of every episode after the run started. The ranges
below are the ones SGLang's ``sglang.srt.sampling.sampling_params.SamplingParams.verify`` enforces (read
from its source); a key not listed here is left to the server.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..strict_reader import is_number

__all__ = ["SAMPLING_RANGES", "range_problem", "range_problems"]


@dataclass(frozen=True)
class _Range:
    """A closed or half-open interval of numbers (``integer``: whole numbers only; ``also``: one more value
    allowed outside it, e.g. top_k's -1)."""

    low: float
    high: float = math.inf
    low_open: bool = False
    integer: bool = False
    also: int | None = None
    note: str = ""

    def holds(self, value: float) -> bool:
        if self.also is not None and value == self.also:
            return True
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.high == math.inf:
            text = f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
        else:
            text = f"{kind} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
        if self.also is not None:
            text = f"{self.also} or {text}"
        return text + (f" ({self.note})" if self.note else "")


SAMPLING_RANGES: dict[str, _Range] = {
    "temperature": _Range(0.0, note="0 is greedy"),
    "top_p": _Range(0.0, 1.0, low_open=True),
    "top_k": _Range(1, integer=True, also=-1, note="-1 is the whole vocabulary"),
    "min_p": _Range(0.0, 1.0),
    "frequency_penalty": _Range(-2.0, 2.0),
    "presence_penalty": _Range(-2.0, 2.0),
    "repetition_penalty": _Range(0.0, 2.0, low_open=True, note="1 is no penalty"),
    "min_new_tokens": _Range(0, integer=True),
}
"""Sampling param -> the values SGLang accepts for it."""


def range_problem(key: str, value: Any) -> str | None:
    """Why SGLang would refuse ``value`` for ``key`` ("must be a number in (0, 1], got 1.5"), or None."""
    bounds = SAMPLING_RANGES.get(key)
    if bounds is None or value is None:
        return None
    number = is_number(value)
    if (
        not number
        or not math.isfinite(value)
        or (bounds.integer and not float(value).is_integer())
        or not bounds.holds(value)
    ):
        return f"must be {bounds.describe()}, got {value!r}"
    return None


def range_problems(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(key, problem)`` for every value of ``params`` SGLang would refuse, in key order; and a
    ``min_new_tokens`` above ``max_new_tokens``."""
    found = [(key, problem) for key in sorted(params) if (problem := range_problem(key, params[key]))]
    low, high = params.get("min_new_tokens"), params.get("max_new_tokens")
    if not found and isinstance(low, int) and isinstance(high, int) and low > high:
        found.append(("min_new_tokens", f"must be at most max_new_tokens ({high}), got {low}"))
    return found
