"""``slime-strands eval --wandb-project P``: the summary figures and a table of every trajectory in wandb.

The run starts before the first episode (a missing login fails the command at once, not after an hour of
generation) and is finished with the figures and the table at the end. Keys follow slime's eval logging:
``eval/<dataset>/accuracy``, ``eval/<dataset>/pass@k``, then the agent figures of the summary table. Offline
mode (``WANDB_MODE=offline``) works as everywhere in wandb.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from data_prep.install_hints import install_command

from ...trajectories.file import TrajectoryRow
from ..errors import CommandError
from .summary import DatasetSummary

__all__ = ["TABLE_COLUMNS", "WandbEvalLog", "require_wandb", "summary_metrics"]

TABLE_COLUMNS = (
    "key",
    "dataset",
    "prompt",
    "label",
    "response",
    "reward",
    "status",
    "termination",
    "turns",
    "tool_calls",
    "generated_tokens",
)


def require_wandb() -> Any:
    """The wandb module, or a CommandError saying how to install it."""
    try:
        import wandb
    except ImportError as exc:
        raise CommandError(
            "--wandb-project needs wandb, which is not installed",
            hint=f"{install_command('wandb')} (or drop --wandb-project)",
        ) from exc
    return wandb


def summary_metrics(summaries: Sequence[DatasetSummary]) -> dict[str, float]:
    """``eval/<dataset>/<figure>`` for every row of the summary table."""
    out: dict[str, float] = {}
    for s in summaries:
        prefix = f"eval/{s.dataset}/"
        out[prefix + "accuracy"] = s.accuracy
        out.update({f"{prefix}pass@{k}": v for k, v in s.pass_at.items()})
        out[prefix + "turns_mean"] = s.mean_turns
        out[prefix + "tool_calls_mean"] = s.mean_tool_calls
        out[prefix + "parse_error_rate"] = s.parse_error_rate
        out[prefix + "truncated_ratio"] = s.truncation_rate
        out[prefix + "failure_rate"] = s.failure_rate
        out[prefix + "samples"] = float(s.samples)
    return out


class WandbEvalLog:
    """One wandb run per eval: rows are collected as they come (resumed ones included), logged at the end."""

    def __init__(self, wandb: Any, project: str, config: Mapping[str, Any]) -> None:
        self._wandb = wandb
        try:
            self._run = wandb.init(project=project, job_type="eval", config=dict(config))
        except Exception as exc:
            raise CommandError(
                f"wandb could not start a run in project {project!r}: {type(exc).__name__}: {exc}",
                hint="run `wandb login`, or set WANDB_MODE=offline to log locally and `wandb sync` later",
            ) from exc
        self._rows: dict[tuple[int, int], list[Any]] = {}

    def add(self, row: TrajectoryRow) -> None:
        """Keep the row's table entry (a key seen again, a retried trajectory, replaces the earlier one)."""
        prompt = row.prompt[-1].get("content", "") if row.prompt else ""
        self._rows[(row.prompt_index, row.sample)] = [
            row.key,
            row.dataset,
            prompt,
            row.label,
            row.response,
            row.reward,
            row.status,
            row.termination,
            row.record.turns,
            row.record.tool_calls,
            row.record.generated_tokens,
        ]

    def finish(self, summaries: Sequence[DatasetSummary], *, exit_code: int = 0) -> None:
        figures = summary_metrics(summaries)
        rows = [self._rows[key] for key in sorted(self._rows)]  # prompt by prompt, sample by sample
        table = self._wandb.Table(columns=list(TABLE_COLUMNS), data=rows)
        self._run.log({**figures, "eval/trajectories": table})
        self._run.summary.update(figures)
        self._run.finish(exit_code=exit_code)

    def abandon(self, exit_code: int) -> None:
        """End the run without figures (the eval was interrupted or failed)."""
        self._run.finish(exit_code=exit_code)
