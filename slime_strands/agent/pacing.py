"""InvocationPacer: a long agent loop as several Strands invocations, so that Strands' nesting stays bounded.

Strands runs the tool rounds of one invocation recursively: the model call after a round happens inside that
round's async generator (``recurse_event_loop``), so after N rounds every event of a turn passes through N
levels of nested generators. Strands' own cost per turn then grows with the rounds already run (a model that
does nothing costs ~1.7 ms a turn early on and ~24 ms after 200 rounds on the benchmark's machine), and after
about 245 rounds (Python 3.12; ~320 on 3.11) the nesting passes Python's recursion limit: the episode fails with a ``RecursionError``.

The pacer asks Strands to stop once every ``rounds`` tool rounds, after the round's results are in the history
(``Agent.cancel(after_current_tools=True)``, the cooperative stop of Strands' own ``stop`` tool: no message
is added), and :func:`slime_strands.agent.episode.run_agent` invokes the same agent again with no prompt and the
same ``invocation_state``. The next model call sees exactly the history it would have seen, so the
trajectory is the same token for token; what changes is what hooks and traces see: ``BeforeInvocationEvent``
/ ``AfterInvocationEvent`` and the agent span once per invocation instead of once per episode.
"""

from __future__ import annotations

from typing import Any

from strands.hooks import AfterToolsEvent, HookProvider, HookRegistry

__all__ = ["InvocationPacer"]


class InvocationPacer(HookProvider):
    """Stop the invocation after every ``rounds`` tool rounds; :meth:`resumes` says when to invoke again."""

    def __init__(self, rounds: int) -> None:
        if rounds < 1:
            raise ValueError(f"rounds per invocation must be >= 1, got {rounds!r}")
        self.rounds = rounds
        self._rounds_run = 0
        self._paused = False
        self._finished = False

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(AfterToolsEvent, self._after_tools)

    def _after_tools(self, event: AfterToolsEvent) -> None:
        if self._finished:
            return
        self._rounds_run += 1
        if self._rounds_run >= self.rounds and not _stopping(event.agent):
            self._rounds_run = 0
            self._paused = True
            event.agent.cancel(after_current_tools=True)

    def resumes(self, stop_reason: str) -> bool:
        """Whether the invocation that just ended with ``stop_reason`` stopped for a pause: invoke again.

        Anything else that ended it (a hook's ``end_turn`` such as a tool limit, which Strands honours before
        a deferred cancel; the model's answer; an error) ends the loop, and the pause request lapses with the
        invocation."""
        paused, self._paused = self._paused, False
        self._rounds_run = 0
        return paused and stop_reason == "cancelled"

    def finish(self) -> None:
        """The loop it paced is over: pause nothing more (Strands cannot unregister a hook, and an agent run
        again would otherwise be stopped at this pacer's count too)."""
        self._finished = True


def _stopping(agent: Any) -> bool:
    """Whether something else already asked this loop to stop (Strands' ``stop`` tool, ``agent.cancel()``):
    then the stop is theirs, not a pause to resume from. ``_deferred_cancel`` is the flag
    ``cancel(after_current_tools=True)`` sets; Strands has no public reader of it."""
    return bool(agent.cancel_signal.is_set() or getattr(agent, "_deferred_cancel", False))
