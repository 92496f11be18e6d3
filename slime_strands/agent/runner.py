"""Where an episode runs, behind one small interface: in this process, or on a pool of rollout workers.

``generate`` builds an :class:`EpisodeJob` (what the episode needs beyond the runtime: small, typed and
picklable, so it can cross a process hop) and hands it to an :class:`EpisodeRunner`, which returns the
episode's :class:`~slime_strands.agent.record.EpisodeRecord`. :data:`IN_PROCESS` runs it here, on the caller's
loop, with the caller's runtime (the default); ``slime_strands.workers`` holds the Ray pool's runner, which runs
the same :meth:`InProcess.run` inside each worker.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .checkpoint import EpisodeCheckpoint
from .episode import EpisodeSpec, run_episode
from .record import EpisodeRecord
from .runtime import Runtime

__all__ = ["IN_PROCESS", "EpisodeJob", "EpisodeRunner", "InProcess"]


@dataclass(frozen=True)
class EpisodeJob:
    """One episode to run: its spec and, for a continued one, its checkpoint."""

    spec: EpisodeSpec
    resume: EpisodeCheckpoint | None = None
    """The checkpoint an aborted attempt left (partial rollout): the episode continues from it."""
    keep_checkpoint: bool = True
    """Capture a checkpoint when the abort stops it (false: nobody will continue it)."""


class EpisodeRunner(abc.ABC):
    """Runs episodes; a configuration error (every episode would fail the same way) and a cancel propagate,
    anything else ends the episode FAILED in its record."""

    @abc.abstractmethod
    async def run(
        self,
        runtime: Runtime,
        job: EpisodeJob,
        *,
        tokenizer: Any,
        vision: Any,
        abort: Callable[[], bool] | None,
    ) -> EpisodeRecord:
        """Run ``job``; ``runtime`` / ``tokenizer`` / ``vision`` are the caller's, ``abort`` slime's flag."""


class InProcess(EpisodeRunner):
    """The episode on this loop, with this process's runtime (its preflight first: cheap after the first)."""

    async def run(
        self,
        runtime: Runtime,
        job: EpisodeJob,
        *,
        tokenizer: Any,
        vision: Any,
        abort: Callable[[], bool] | None,
    ) -> EpisodeRecord:
        await runtime.preflight(tokenizer, job.spec.chat_template_kwargs)
        return await run_episode(
            tokenizer,
            runtime.client,
            runtime.settings,
            job.spec,
            tools=runtime.tools(),
            abort_signal=abort,
            vision=vision,
            resume=job.resume,
            keep_checkpoint=job.keep_checkpoint,
            mcp=runtime.mcp,
        )


IN_PROCESS = InProcess()
