"""The numbers an eval ends with: accuracy, unbiased pass@k, how the agent behaved, per dataset.

Every figure is computed from the trajectory rows (fresh or resumed alike), so a resumed eval reports
exactly what one uninterrupted run would have:

* accuracy: mean reward (eval rewards are 1.0 / 0.0; a FAILED trajectory counts as wrong, as in slime);
* pass@k for k = 1, 2, 4, ... and n (the samples per prompt): the unbiased estimator
  ``1 - C(n - c, k) / C(n, k)`` per prompt, averaged over the prompts with at least k samples
  (:func:`slime_strands.metrics.mean_pass_at_k`);
* mean turns and tool calls per trajectory;
* parse errors: share of trajectories with at least one malformed tool call;
* truncated / failed: share of trajectories whose status is TRUNCATED / FAILED.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ...metrics import mean_pass_at_k
from ...trajectories.file import TrajectoryRow
from ..text_table import format_columns

__all__ = ["ALL", "DatasetSummary", "TrajectoryTally", "format_table", "pass_k_values", "summarize"]

ALL = "all"
"""The name of the row over every dataset (shown when the data has several)."""


@dataclass(frozen=True)
class TrajectoryTally:
    """The few figures of one trajectory the summary and the progress bar count (rows hold megabytes of
    tokens; a tally holds a few fields)."""

    key: str
    prompt_index: int
    dataset: str
    correct: bool
    status: str
    turns: int
    tool_calls: int
    parse_errors: int
    generated_tokens: int
    error: str | None = None
    """Why the episode FAILED (the row's ``error``)."""

    @classmethod
    def of(cls, row: TrajectoryRow) -> TrajectoryTally:
        record = row.record
        return cls(
            key=row.key,
            prompt_index=row.prompt_index,
            dataset=row.dataset,
            correct=row.correct,
            status=row.status,
            turns=record.turns,
            tool_calls=record.tool_calls,
            parse_errors=sum(record.parse_errors.values()),
            generated_tokens=record.generated_tokens,
            error=row.error,
        )

    @property
    def failed(self) -> bool:
        return self.status == "FAILED"


@dataclass(frozen=True)
class DatasetSummary:
    dataset: str
    prompts: int
    samples: int
    accuracy: float
    pass_at: dict[int, float]
    mean_turns: float
    mean_tool_calls: float
    parse_error_rate: float
    truncation_rate: float
    failure_rate: float


def pass_k_values(n: int) -> list[int]:
    """1, 2, 4, ... below ``n``, then ``n`` itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n] if n > 0 else []


def summarize(outcomes: Iterable[TrajectoryTally]) -> list[DatasetSummary]:
    """One summary per dataset (in order of first appearance), plus ``all`` when there are several."""
    by_dataset: dict[str, list[TrajectoryTally]] = defaultdict(list)
    every: list[TrajectoryTally] = []
    for outcome in outcomes:
        by_dataset[outcome.dataset].append(outcome)
        every.append(outcome)
    rows = [_summary(name, group) for name, group in by_dataset.items()]
    if len(rows) > 1:
        rows.append(_summary(ALL, every))
    return rows


def _summary(name: str, outcomes: Sequence[TrajectoryTally]) -> DatasetSummary:
    groups: dict[tuple[str, int], list[bool]] = defaultdict(list)
    for o in outcomes:
        groups[(o.dataset, o.prompt_index)].append(o.correct)
    largest = max(len(g) for g in groups.values())
    pass_at = {k: mean_pass_at_k(groups.values(), k) for k in pass_k_values(largest)}
    n = len(outcomes)
    return DatasetSummary(
        dataset=name,
        prompts=len(groups),
        samples=n,
        accuracy=sum(o.correct for o in outcomes) / n,
        pass_at=pass_at,
        mean_turns=sum(o.turns for o in outcomes) / n,
        mean_tool_calls=sum(o.tool_calls for o in outcomes) / n,
        parse_error_rate=sum(o.parse_errors > 0 for o in outcomes) / n,
        truncation_rate=sum(o.status == "TRUNCATED" for o in outcomes) / n,
        failure_rate=sum(o.failed for o in outcomes) / n,
    )


def format_table(summaries: Sequence[DatasetSummary]) -> str:
    """A plain-text table (no colour codes: it is meant for logs and pasting as much as for terminals)."""
    ks = sorted({k for s in summaries for k in s.pass_at})
    header = [
        "dataset",
        "prompts",
        "samples",
        "accuracy",
        *(f"pass@{k}" for k in ks),
        "turns",
        "tool calls",
        "parse errors",
        "truncated",
        "failed",
    ]
    body = [
        [
            s.dataset,
            str(s.prompts),
            str(s.samples),
            f"{s.accuracy:.3f}",
            *(f"{s.pass_at[k]:.3f}" if k in s.pass_at else "-" for k in ks),
            f"{s.mean_turns:.2f}",
            f"{s.mean_tool_calls:.2f}",
            f"{s.parse_error_rate:.1%}",
            f"{s.truncation_rate:.1%}",
            f"{s.failure_rate:.1%}",
        ]
        for s in summaries
    ]
    return format_columns(header, body)
