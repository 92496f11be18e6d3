"""Resuming ``slime-strands eval --out FILE``: which rows of the file a rerun keeps, and the refusals when the
file holds trajectories of other data or of another configuration.

A row is keyed ``<prompt index>:<sample>``; the later line of a key wins. Rows of this run's plan (within its
``--limit`` and ``--n``) whose episode did not FAIL or ABORT are kept and skipped; FAILED and ABORTED ones run
again. Rows outside the plan stay in the file, uncounted (a smaller ``--n`` reuses part of a larger run, a
larger one adds samples). Every row must hold the same data (its ``prompt_digest``) and every row of the file
the same configuration (its ``config`` digests, :mod:`slime_strands.cli.eval.digest`) as the run: otherwise the
old results would be reported as the new run's.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...agent.record import Termination
from ...trajectories.config_digest import ConfigDigest
from ...trajectories.file import TrajectoryRow, iter_rows
from ..errors import CommandError
from .data import EvalPrompt

__all__ = ["ResumedRows", "check_writable", "read_resumable"]

_RETRIED = frozenset({Termination.FAILED.value, Termination.ABORTED.value})
_NEW_OUT = "or write to a new --out file"


@dataclass(frozen=True)
class ResumedRows:
    """What an existing ``--out`` file brings to a rerun."""

    path: str | None = None
    kept: dict[str, TrajectoryRow] = field(default_factory=dict)
    """The rows of this run's plan that are not run again, by key, without their tokens (rows are large)."""
    configs: dict[ConfigDigest | None, int] = field(default_factory=dict)
    """Every configuration the file's rows were written with, and the first line of each."""

    def check_config(self, digest: ConfigDigest) -> None:
        """CommandError (one line: what differs, and the two ways out) when a row of the file was written with
        another configuration than ``digest``."""
        for config, line in self.configs.items():
            if config == digest:
                continue
            if config is None:
                what = "has rows without a configuration digest (written by an older slime-strands)"
            else:
                what = f"was written with other settings: {'; '.join(digest.differences(config))} differ"
            raise CommandError(
                f"{self.path}:{line}: {what}",
                hint=f"rerun with the settings that wrote it to resume, {_NEW_OUT}",
            )


def check_writable(out: str) -> None:
    """Before any work: a typo in the folder must not surface after the first trajectory."""
    path = Path(out)
    folder = path.parent
    if path.is_dir():
        problem = "is a folder"
    elif not folder.is_dir() or not os.access(folder, os.W_OK):
        problem = f"its folder {folder} does not exist or is not writable"
    else:
        return
    raise CommandError(f"--out {out} {problem}", hint="give a file path in an existing, writable folder")


def read_resumable(out: str, prompts: Sequence[EvalPrompt], n: int) -> ResumedRows:
    """The rows of ``out`` this plan keeps (last line per key) and the configurations the file holds;
    CommandError when it holds trajectories of other data."""
    if not Path(out).exists():
        return ResumedRows(out)
    kept: dict[str, TrajectoryRow] = {}
    configs: dict[ConfigDigest | None, int] = {}
    for line, row in iter_rows(out):
        configs.setdefault(row.config, line)
        if row.prompt_index >= len(prompts) or row.sample >= n:
            continue  # outside this run's --limit / --n: left in the file, not counted
        expected = prompts[row.prompt_index]
        if row.prompt_digest != expected.digest:
            raise CommandError(
                f"{out}:{line}: holds a trajectory of another prompt at index {row.prompt_index} "
                f"(data line {expected.line} differs)",
                hint=f"resume with the same --data, {_NEW_OUT}",
            )
        if row.termination in _RETRIED:
            kept.pop(row.key, None)
        else:
            kept[row.key] = dataclasses.replace(row, segments=[], messages=[])
    return ResumedRows(out, kept, configs)
