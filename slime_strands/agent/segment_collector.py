"""The trajectory segments of one episode, collected in the order they close.

Token-in/token-out needs an append-only history, so an episode whose history is rewritten is split: a
compaction (``slime_strands.agent.compaction``) closes the main agent's current segment and the next one starts from
the re-rendered, compacted conversation; a sub-agent run by a tool (``slime_strands.subagents``) finishes
with a trajectory of its own; the episode's end closes the main agent's last segment. Each segment is exact
token-in/token-out on its own and becomes one slime sample (siblings sharing one ``rollout_id``).

One :class:`SegmentCollector` per episode is the state those parties share: the compactor and the sub-agent
tools find it in Strands' ``invocation_state`` under :data:`COLLECTOR_KEY`.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Sequence

from ..provider.checkpoint import TrajectoryCheckpoint
from ..provider.model import SGLangModel
from ..provider.model_stats import ModelStats
from ..provider.token_manager import TokenManager
from .checkpoint import SegmentCheckpoint
from .record import TREATMENTS, SegmentRecord, Termination

__all__ = ["COLLECTOR_KEY", "SegmentCollector"]

COLLECTOR_KEY = "slime_strands_segments"
"""Key of the episode's :class:`SegmentCollector` in Strands' ``invocation_state``."""


class SegmentCollector:
    """Closed segments of one episode, in closing order, and the collected sub-agents' counters."""

    def __init__(self, *, collect_subagents: bool) -> None:
        self.collect_subagents = collect_subagents
        self.subagent_stats: list[ModelStats] = []
        """Counters of the collected sub-agents' models (their turns and token counters add to the episode's)."""
        self._closed: list[SegmentRecord] = []
        self._main: list[TokenManager] = []  # the main agent's closed segments, for tokens_saved
        self._opened_by = "prompt"
        self._carried: dict[int, int] = {}  # id(trajectory) -> its tokens from before the last continuation

    @property
    def opened_by(self) -> str:
        """How the main agent's current segment was opened (``prompt`` or a compaction strategy)."""
        return self._opened_by

    @property
    def compactions(self) -> int:
        """Compactions so far: main segments closed by one."""
        return len(self._main)

    def close_main(self, trajectory: TokenManager, *, next_opened_by: str) -> None:
        """The main agent's current segment was closed by a compaction (``next_opened_by`` names it)."""
        self._closed.append(_segment("main", trajectory, self._opened_by, "compaction", "COMPLETED"))
        self._main.append(trajectory)
        self._opened_by = next_opened_by

    def add_subagent(self, name: str, model: SGLangModel, termination: Termination) -> None:
        """A sub-agent finished; its trajectory is a segment when collecting and slime can train on it."""
        outcome = TREATMENTS[termination]
        if not self.collect_subagents or not outcome.trains or not model.token_manager.response_length:
            return
        self.subagent_stats.append(model.stats)
        self._closed.append(
            _segment(
                "subagent", model.token_manager, "subagent", termination.value, outcome.status, name=name
            )
        )

    def finish(self, trajectory: TokenManager, termination: Termination) -> list[SegmentRecord]:
        """All segments once the main agent ended with ``termination`` on ``trajectory``; segments without a
        generated token (a compacted prompt that no longer fit) are left out."""
        last = _segment(
            "main", trajectory, self._opened_by, termination.value, TREATMENTS[termination].status
        )
        segments = [*self._closed, last]
        saved = self._tokens_saved(trajectory)
        return [
            dataclasses.replace(
                s,
                tokens_saved=saved.get(id(s.trajectory), 0),
                carried_tokens=self._carried.get(id(s.trajectory), 0),
            )
            for s in segments
            if s.response_length > 0
        ]

    def _tokens_saved(self, last: TokenManager) -> dict[int, int]:
        """For each main segment opened by a compaction: what the previous one held minus its own prompt."""
        mains = [*self._main, last]
        return {
            id(after): len(before) - after.prompt_length
            for before, after in itertools.pairwise(mains)
            if after.prompt_length
        }

    # -- partial rollout ------------------------------------------------------------------------------

    def checkpoint(self) -> tuple[SegmentCheckpoint, ...]:
        """The closed segments as a checkpoint saves them."""
        out = []
        for s in self._closed:
            assert s.trajectory is not None
            out.append(
                SegmentCheckpoint(
                    s.kind, s.opened_by, s.closed_by, s.status, s.name, TrajectoryCheckpoint.of(s.trajectory)
                )
            )
        return tuple(out)

    def restore(
        self,
        closed: Sequence[tuple[SegmentCheckpoint, TokenManager]],
        opened_by: str,
        subagents: Sequence[ModelStats],
        *,
        open_trajectory: TokenManager,
    ) -> None:
        """Continue from a checkpoint: its closed segments (with their rebuilt trajectories) are closed here
        too, and every token they and ``open_trajectory`` hold was written before this continuation."""
        for saved, tm in closed:
            self._closed.append(
                _segment(saved.kind, tm, saved.opened_by, saved.closed_by, saved.status, name=saved.name)
            )
            if saved.kind == "main":
                self._main.append(tm)
        self._opened_by = opened_by
        self.subagent_stats = [copy.deepcopy(s) for s in subagents]
        self._carried = {id(tm): len(tm) for tm in [*(tm for _, tm in closed), open_trajectory]}


def _segment(
    kind: str, tm: TokenManager, opened_by: str, closed_by: str, status: str, *, name: str = ""
) -> SegmentRecord:
    return SegmentRecord(
        kind=kind,
        opened_by=opened_by,
        closed_by=closed_by,
        status=status,
        prompt_length=tm.prompt_length,
        response_length=tm.response_length,
        generated_tokens=tm.generated_length,
        turns=tm.turn_count,
        name=name,
        trajectory=tm,
    )
