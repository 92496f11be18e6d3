"""Stop an agent episode at slime's abort so that it can continue later, token for token.

slime's partial rollout aborts the episodes still running once a step has enough samples and hands them back
at a later step. Where the abort lands decides what is left, and :class:`AbortGuard` leaves every case
consistent:

* **a turn generating**: the server answers ``abort`` with the partial output (kept: it was sampled); the
  model keeps the turn pending (``SGLangModel`` continues it on the next call with the same messages);
* **a turn queued**: the same, with no output yet;
* **tools running**: every running call is cancelled (the sandbox kills its run) and the batch's results are
  dropped: on continue ALL calls of that batch run again (a synchronous tool running in a thread cannot be
  stopped; its result is discarded). The limiter's counters are the ones from before the batch;
* **after a turn, before its tools** / **before a model call**: the guard cancels, and what Strands appends
  for a cancel (error results, an assistant message with the reason) is cut off;
* **a compaction's summary turn**: the compaction is pending and completes on continue.

:func:`capture` turns the parts of an aborted episode into an
:class:`~slime_strands.agent.checkpoint.EpisodeCheckpoint`; :func:`restore` puts one back into freshly built parts,
after which the agent is invoked with no prompt: Strands runs the tools of a trailing tool-use message, or
calls the model (which continues a pending turn).

slime's abort flag is a plain attribute polled by an :class:`~slime_strands.provider.abort_signal.AbortSignal`
(the model waits on it too): one poller per event loop serves every running tool call, every 50 ms, only while
calls are running.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from strands.hooks import AfterToolsEvent, BeforeModelCallEvent, BeforeToolsEvent
from strands.middleware import ExecuteToolContext, ToolResultEvent

from ..provider.abort_signal import AbortSignal
from ..provider.checkpoint import MalformedCheckpointError, PendingTurn, TrajectoryCheckpoint, check_plain
from ..provider.token_manager import TokenManager
from ..settings import COMPACTION_STRATEGIES
from .checkpoint import EpisodeCheckpoint, ToolCounters, plain_message
from .history import AgentHistory
from .limits import StopWhen, ToolLimiter
from .record import TREATMENTS, MalformedRecordError, SegmentRecord

if TYPE_CHECKING:
    from strands import Agent

    from ..provider.model import SGLangModel
    from .compaction import ContextCompactor
    from .segment_collector import SegmentCollector

__all__ = ["AbortGuard", "capture", "restore"]

logger = logging.getLogger(__name__)

_ABORT_REASON = "slime aborted the rollout"
_KILLED_TOOL_TEXT = (
    "Error: the rollout was aborted while this call ran; it runs again when the episode continues."
)
_END = object()


class _ToolTime(Protocol):
    seconds: float
    errors: int


class AbortGuard(StopWhen):
    """End the episode at slime's abort (before a model call or a tool batch, or by killing running tool
    calls) and remember where its conversation is consistent: ``cut`` messages, with the tool counters from
    before a dropped batch (``counters_at_cut``).

    Register it BEFORE the :class:`ToolLimiter` (it notes the counters before the limiter counts a batch), and
    :meth:`kill_on_abort` as the agent's ``ExecuteToolStage`` middleware."""

    def __init__(self, abort_signal: AbortSignal, limiter: ToolLimiter, tool_time: _ToolTime) -> None:
        super().__init__(abort_signal, _ABORT_REASON)
        self.abort_signal = abort_signal
        self._limiter = limiter
        self._tool_time = tool_time
        self.cut: int | None = None
        self.counters_at_cut: ToolCounters | None = None
        self._batch: tuple[int, ToolCounters] | None = None
        self._killed = False

    def counters(self) -> ToolCounters:
        limiter, time = self._limiter, self._tool_time
        return ToolCounters(limiter.tool_iter_count, limiter.tool_call_count, time.errors, time.seconds)

    def _cut_at(self, messages: int, counters: ToolCounters | None = None) -> None:
        if self.cut is None or messages < self.cut:
            self.cut, self.counters_at_cut = messages, counters

    def _before_model(self, event: BeforeModelCallEvent) -> None:
        if self._check():
            self._cut_at(len(event.agent.messages))  # before the message Strands adds for the cancel
            event.cancel = self.reason

    def _before_tools(self, event: BeforeToolsEvent) -> None:
        self._batch = (len(event.agent.messages), self.counters())
        self._killed = False
        if self._check():
            self._cut_at(*self._batch)
            event.cancel = self.reason

    def _after_tools(self, event: AfterToolsEvent) -> None:
        if self._killed and self._batch is not None:
            self.triggered = True
            self._cut_at(*self._batch)
        if self.triggered:
            event.end_turn = True
        self._batch, self._killed = None, False

    async def kill_on_abort(
        self, context: ExecuteToolContext, next_fn: Callable[[ExecuteToolContext], AsyncGenerator[Any, None]]
    ) -> AsyncGenerator[Any, None]:
        """``ExecuteToolStage`` middleware: run the call, and cancel it when slime aborts. A call slime's abort
        cut, or one that ended once the abort had begun (its result may be the abort's doing: a sub-agent's
        request the server aborted), gets an error result the checkpoint drops: it runs again when the
        episode continues."""
        events: asyncio.Queue[Any] = asyncio.Queue()

        async def drain() -> None:  # the call's whole stream in one task: its context stays its own
            try:
                async for item in next_fn(context):
                    events.put_nowait(item)
            finally:
                events.put_nowait(_END)

        runner = asyncio.ensure_future(drain())
        aborted = asyncio.ensure_future(self.abort_signal.wait())
        result = None  # held back until the call ends: it is only the result if slime has not aborted by then
        try:
            while True:
                getter = asyncio.ensure_future(events.get())
                done, _ = await asyncio.wait({getter, aborted}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    break
                item = getter.result()
                if item is _END:
                    if self.abort_signal():
                        break
                    await runner  # the call's own exception, if it raised
                    if result is not None:
                        yield result
                    return
                if isinstance(item, ToolResultEvent):
                    result = item
                else:
                    yield item
            runner.cancel()
            with contextlib.suppress(BaseException):
                await runner
            self._killed = True
            tool_use_id = str(context.tool_use.get("toolUseId"))
            yield ToolResultEvent(
                {"toolUseId": tool_use_id, "status": "error", "content": [{"text": _KILLED_TOOL_TEXT}]}
            )
        finally:
            aborted.cancel()
            if not runner.done():
                runner.cancel()


# -- capture and restore ------------------------------------------------------------------------------


def capture(
    *,
    model: SGLangModel,
    agent: Agent,
    guard: AbortGuard,
    segments: SegmentCollector,
    compactor: ContextCompactor | None,
    continuations: int,
    turns_saved: int,
) -> EpisodeCheckpoint | None:
    """The checkpoint of an episode the abort ended; None (with a warning) when what is left cannot be
    continued (the sample then starts again from its prompt)."""
    cut = len(agent.messages) if guard.cut is None else guard.cut
    messages = list(agent.messages)[:cut]
    state = model.checkpoint_state()
    pending_compaction = None if compactor is None else compactor.compacting
    problem = _inconsistency(model.token_manager, state.pending, messages, pending_compaction)
    if problem is None:
        try:
            for message in messages:
                check_plain(plain_message(message), "a message")
        except MalformedCheckpointError as exc:
            problem = str(exc)
    if problem is not None:
        logger.warning(
            "slime-strands: the aborted episode cannot be continued (%s): it will start again", problem
        )
        return None
    counters = guard.counters_at_cut or guard.counters()
    return EpisodeCheckpoint(
        system_prompt=agent.system_prompt,
        messages=tuple(copy.deepcopy(messages)),
        trajectory=TrajectoryCheckpoint.of(model.token_manager),
        opened_by=segments.opened_by,
        closed=segments.checkpoint(),
        model=state,
        tools=dataclasses.replace(counters, tool_time_s=guard.counters().tool_time_s),
        subagents=tuple(copy.deepcopy(s) for s in segments.subagent_stats),
        compaction_pending=pending_compaction,
        continuations=continuations,
        turns_saved=turns_saved,
    )


def _inconsistency(
    trajectory: TokenManager, pending: PendingTurn | None, messages: Sequence[Any], compacting: bool | None
) -> str | None:
    """Why the main trajectory, the model's pending turn and the kept messages do not describe one continuable
    state, or None. :func:`capture` asks it of a live episode, :func:`restore` of a saved one."""
    if not messages:
        return "no messages: the episode had not begun"
    last = trajectory.last_span
    if compacting is not None:
        # the summary request follows the messages it summarises: all, or those up to the last answer (the
        # turn after them overflowed, or the summary's room is before the newest results)
        answered = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1) + 1
        if pending is None or pending.messages not in (len(messages) + 1, answered + 1):
            return "a compaction was cut outside its summary turn"
    elif pending is not None:
        if pending.messages != len(messages):
            return f"the cut turn rendered {pending.messages} messages, {len(messages)} are kept"
    elif last is not None and last.kind != "generated":
        return "the trajectory ends on tokens no turn answered"
    elif last is not None and (last.info is None or last.info.finish_reason != "stop"):
        return "the trajectory ends on a turn that did not finish, and none is pending"
    return None


_STATUSES = frozenset(t.status for t in TREATMENTS.values())


def _segment_problem(checkpoint: EpisodeCheckpoint) -> str | None:
    """Why the checkpoint's segment labels are not ones an episode writes, or None (the records' own checks:
    a bad label would otherwise fail the episode when it is summarised)."""
    if checkpoint.opened_by not in ("prompt", *COMPACTION_STRATEGIES):
        return f"the open segment was opened by {checkpoint.opened_by!r:.40}"
    for segment in checkpoint.closed:
        if segment.status not in _STATUSES:
            return f"a closed segment has status {segment.status!r:.40}"
        try:
            SegmentRecord(
                kind=segment.kind,
                opened_by=segment.opened_by,
                closed_by=segment.closed_by,
                status=segment.status,
                prompt_length=0,
                response_length=0,
                generated_tokens=0,
                turns=0,
            )
        except MalformedRecordError as exc:
            return f"a closed segment: {exc}"
    return None


def restore(
    checkpoint: EpisodeCheckpoint,
    *,
    model: SGLangModel,
    agent: Agent,
    limiter: ToolLimiter,
    tool_time: _ToolTime,
    segments: SegmentCollector,
    compactor: ContextCompactor | None,
) -> None:
    """Put ``checkpoint`` back into freshly built parts of an episode; raises MalformedCheckpointError, before
    changing anything, when it is not a state :func:`capture` leaves (its trajectories do not rebuild, its
    parts contradict each other, or it does not fit the episode)."""
    trajectory = checkpoint.trajectory.rebuild()
    closed = [(segment, segment.trajectory.rebuild()) for segment in checkpoint.closed]
    if checkpoint.compaction_pending is not None and compactor is None:
        raise MalformedCheckpointError(
            "the checkpoint has a pending compaction but the episode compacts nothing"
        )
    pending = checkpoint.model.pending
    problem = _inconsistency(trajectory, pending, checkpoint.messages, checkpoint.compaction_pending)
    problem = problem or _segment_problem(checkpoint)
    if problem is not None:
        raise MalformedCheckpointError(f"the checkpoint contradicts itself: {problem}")
    model.restore_state(trajectory, checkpoint.model)
    agent.messages[:] = copy.deepcopy(AgentHistory(checkpoint.messages))
    agent.system_prompt = checkpoint.system_prompt
    limiter.tool_iter_count = checkpoint.tools.tool_iters
    limiter.tool_call_count = checkpoint.tools.tool_calls
    tool_time.errors = checkpoint.tools.tool_errors
    tool_time.seconds = checkpoint.tools.tool_time_s
    segments.restore(closed, checkpoint.opened_by, checkpoint.subagents, open_trajectory=trajectory)
    if compactor is not None:
        compactor.restore(pending=checkpoint.compaction_pending)
