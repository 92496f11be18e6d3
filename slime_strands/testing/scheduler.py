"""The stand-in server's request bookkeeping, as SGLang 0.5.23's tokenizer manager and scheduler keep it.

Read from SGLang 0.5.23's source (``tokenizer_manager.py``: ``_init_req_state``, ``abort_request``,
``_stream_one_response``; ``scheduler.py``: ``abort_request``):

- every request being answered is known by its rid: a second one with the same rid is refused;
- requests wait in a FIFO queue until the token pool (``--max-total-tokens``) has room for them; a request holds
  ``len(input_ids) + max_new_tokens`` of it from its start to its answer (SGLang reserves what a request may
  still write); a waiting request is never overtaken;
- ``/abort_request {"rid": R}`` acts only when ``R`` is a known rid (the tokenizer manager drops the others),
  then ends EVERY request, waiting or running, whose rid starts with ``R`` (the scheduler's
  ``req.rid.startswith(recv_req.rid)``); ``abort_all`` ends them all;
- a client that hung up has its request aborted the same way, by its rid (so by prefix): SGLang notices it every
  4 s without output (``SGLANG_REQUEST_STATE_WAIT_TIMEOUT``); the stand-in checks every ``disconnect_check_s``,
  and also when a request arrives whose rid extends the hung-up one (so a retry named ``{rid}-retry1`` that
  arrives before the check is aborted with its original, deterministically, as on the real server).
"""

from __future__ import annotations

import collections
import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Phase", "Scheduler", "Ticket"]


class Phase(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    ABORTED_WAITING = "aborted in the waiting queue"
    ABORTED_RUNNING = "aborted while running"
    DONE = "done"


@dataclass(eq=False)
class Ticket:
    """One ``/generate`` request the server knows, from its arrival to its answer."""

    rid: str
    hung_up: Callable[[], bool]
    """True once the client closed its connection (checked without consuming anything)."""
    tokens: int = 0
    phase: Phase = Phase.WAITING
    disconnected: bool = False
    """Aborted because its client hung up: nobody reads an answer."""
    arrived: float = field(default_factory=time.monotonic)

    @property
    def active(self) -> bool:
        return self.phase in (Phase.WAITING, Phase.RUNNING)


class Scheduler:
    """Known rids, the waiting queue, the token pool and aborts; see the module docstring. Thread-safe: every
    handler thread of the server calls it."""

    def __init__(self, pool_tokens: int | None, disconnect_check_s: float) -> None:
        if disconnect_check_s <= 0:
            raise ValueError("disconnect_check_s must be > 0")
        self.pool_tokens = pool_tokens
        self.disconnect_check_s = disconnect_check_s
        self.aborted: list[str] = []
        """rid of every request an abort ended (by rid prefix, ``abort_all``, a hang-up or the server's stop)."""
        self.disconnected: list[str] = []
        """rid of every request whose client hung up before its answer."""
        self._cond = threading.Condition()
        self._known: dict[str, Ticket] = {}
        self._waiting: collections.deque[Ticket] = collections.deque()
        self._used = 0
        self._closed = False

    # -- views -------------------------------------------------------------------------------------

    def rids(self, *phases: Phase) -> list[str]:
        """rid of every known request (in one of ``phases``, when given), in arrival order."""
        with self._cond:
            return [t.rid for t in self._known.values() if not phases or t.phase in phases]

    @property
    def used_tokens(self) -> int:
        with self._cond:
            return self._used

    # -- one request's life ------------------------------------------------------------------------

    def register(self, rid: str, hung_up: Callable[[], bool]) -> Ticket | None:
        """A new request (None: ``rid`` is already known, the duplicate SGLang refuses)."""
        with self._cond:
            if rid in self._known:
                return None
            ticket = self._known[rid] = Ticket(rid, hung_up)
            return ticket

    def enqueue(self, ticket: Ticket, tokens: int) -> None:
        """Queue a checked request that will hold ``tokens`` of the pool while it runs."""
        if self.pool_tokens is not None and tokens > self.pool_tokens:
            raise ValueError(f"a request of {tokens} tokens never fits a pool of {self.pool_tokens}")
        with self._cond:
            ticket.tokens = tokens
            if ticket.phase is not Phase.WAITING:  # aborted (by a prefix) while it was being checked
                return
            if self._closed:
                self._end(ticket)
                return
            self._waiting.append(ticket)
            self._admit()
            self._check_prefixes_of(ticket.rid)
            self._cond.notify_all()

    def wait_to_run(self, ticket: Ticket) -> bool:
        """Block while ``ticket`` waits in the queue; True once it runs, False if it was aborted waiting."""
        self._wait(ticket, Phase.WAITING, deadline=None)
        return ticket.phase is not Phase.ABORTED_WAITING

    def hold(self, ticket: Ticket, seconds: float) -> None:
        """Keep a running request running for ``seconds`` (an abort or a hang-up ends it sooner)."""
        self._wait(ticket, Phase.RUNNING, deadline=time.monotonic() + seconds)

    def release(self, ticket: Ticket) -> None:
        """The request is answered (or refused): forget its rid and give its tokens back to the pool."""
        with self._cond:
            if ticket.phase in (Phase.RUNNING, Phase.ABORTED_RUNNING):
                self._used -= ticket.tokens
            if ticket in self._waiting:
                self._waiting.remove(ticket)
            ticket.phase = Phase.DONE
            if self._known.get(ticket.rid) is ticket:
                del self._known[ticket.rid]
            self._admit()
            self._cond.notify_all()

    # -- aborts ------------------------------------------------------------------------------------

    def abort(self, rid: str | None) -> None:
        """``/abort_request``: every request whose rid starts with ``rid`` when ``rid`` is known; all when None."""
        with self._cond:
            if rid is None:
                targets = [t for t in self._known.values() if t.active]
            elif rid in self._known:
                targets = [t for t in self._known.values() if t.active and t.rid.startswith(rid)]
            else:
                targets = []  # the tokenizer manager does not forward an abort of an unknown rid
            for ticket in targets:
                self._end(ticket)
            self._cond.notify_all()

    def close(self) -> None:
        """The server stops: every request is ended, and any later one is ended as it arrives."""
        with self._cond:
            self._closed = True
            for ticket in list(self._known.values()):
                if ticket.active:
                    self._end(ticket)
            self._cond.notify_all()

    def wait_idle(self) -> None:
        """Block until every known request is answered (after :meth:`close`, each ends at once)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._known)

    def reopen(self) -> None:
        with self._cond:
            self._closed = False

    # -- internals (called with the lock held) -----------------------------------------------------

    def _wait(self, ticket: Ticket, phase: Phase, deadline: float | None) -> None:
        check_at = time.monotonic() + self.disconnect_check_s
        with self._cond:
            while ticket.phase is phase:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return
                if now >= check_at:
                    self._check_hung_up(ticket)
                    check_at = now + self.disconnect_check_s
                    continue
                self._cond.wait(min(check_at, deadline if deadline is not None else check_at) - now)

    def _admit(self) -> None:
        while self._waiting and (
            self.pool_tokens is None or self._used + self._waiting[0].tokens <= self.pool_tokens
        ):
            ticket = self._waiting.popleft()
            ticket.phase = Phase.RUNNING
            self._used += ticket.tokens

    def _end(self, ticket: Ticket) -> None:
        if ticket.phase is Phase.WAITING:
            if ticket in self._waiting:
                self._waiting.remove(ticket)
            ticket.phase = Phase.ABORTED_WAITING
        elif ticket.phase is Phase.RUNNING:
            ticket.phase = Phase.ABORTED_RUNNING
        self.aborted.append(ticket.rid)

    def _check_hung_up(self, ticket: Ticket) -> None:
        """A hung-up client's request is aborted by its rid: by prefix, like an ``/abort_request``."""
        if not ticket.active or ticket.disconnected or not ticket.hung_up():
            return
        ticket.disconnected = True
        self.disconnected.append(ticket.rid)
        for other in [t for t in self._known.values() if t.active and t.rid.startswith(ticket.rid)]:
            self._end(other)
        self._cond.notify_all()

    def _check_prefixes_of(self, rid: str) -> None:
        """A known request whose rid is a prefix of ``rid`` and whose client hung up is aborted now, before the
        new request can finish: SGLang's periodic check would have caught the new one in flight."""
        for end in range(1, len(rid)):
            other = self._known.get(rid[:end])
            if other is not None:
                self._check_hung_up(other)
