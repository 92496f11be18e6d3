"""The context window of one SGLang server as its answers show it: what it reports, what its refusals name, and
the requests it has served, weighed against each other.

SGLang reports its window in ``GET /v1/models``; its context refusals (400) name a bound too, and its scheduler
refuses a few tokens before the smaller of its context and its KV pool (:data:`SGLANG_CONTEXT_MARGIN`). A
refusal can also be wrong for the server as a whole: a router in front of engines with different KV pools, a
proxy's stale error, an engine restarted with less memory. Taken at its word, one such answer shrinks every
later sample's budget for the rest of the process (issue 32: 471 of 512 samples TRUNCATED, the next batch
FAILED, nothing logged above INFO). So a named limit is evidence, weighed against the requests the server has
served:

- a served request proves the window holds more than its input plus the margin SGLang's scheduler keeps, and
  more than its whole sequence (input and output); a named limit below that is an **anomaly**: the window stays
  as it is, and one WARNING names the server, the limit and the request it contradicts (later refusals naming
  the same limit are counted at DEBUG); the refused request's sample ends as any refused turn does;
- a named limit below the window in use that nothing contradicts **changes** the window (a server that reports
  none, a KV pool smaller than the context);
- a window learned from a refusal that a request served later contradicts (it was sent before, sized for the
  window then) was an anomaly no evidence had yet contradicted: the window goes back to the one before it.

Every change of the window is logged once at WARNING (old -> new, and why); the window the server reports at first
(``/v1/models``, asked before any turn is sized) at INFO. :attr:`ContextWindow.tokens` is the window in
use (the rollout metrics log it, so a change shows in wandb).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

__all__ = ["SGLANG_CONTEXT_MARGIN", "ContextWindow"]

logger = logging.getLogger("slime_strands.provider.client")

SGLANG_CONTEXT_MARGIN = 6
"""Tokens of the context window a trajectory can never use: SGLang's scheduler rejects inputs of
``min(context_length - 1, kv_pool - 1) - 5`` tokens or more, so a request needs ``input <= context - 7``
and the trajectory stays within ``context - 6`` tokens (one generated token at least)."""


_KEPT_ANOMALIES = 256
"""Distinct contradicted limits counted at most (the oldest is forgotten first)."""


@dataclass(frozen=True)
class _Window:
    """A window in use, and whether a refusal named it (else the server reported it)."""

    tokens: int
    from_refusal: bool


class ContextWindow:
    """The window of one server as its answers show it (see the module docstring); safe from any thread."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._lock = threading.Lock()
        self._windows: list[_Window] = []
        """Windows in use, oldest first: the reported one, then each a refusal set below the one before."""
        self._proven = 0
        """The smallest window the served requests allow (0: none served yet)."""
        self._proof = ""
        """The served request that proves it, in words."""
        self._anomalies: dict[int, int] = {}
        """Each contradicted limit named, and how many times."""

    @property
    def tokens(self) -> int | None:
        """The window in use; None while none is known."""
        windows = self._windows
        return windows[-1].tokens if windows else None

    def reported(self, tokens: int) -> None:
        """The server reported its window (``/v1/models``, ``/server_info``, ``/model_info``)."""
        with self._lock:
            old = self.tokens
            if old is not None and tokens >= old:
                return
            self._windows.append(_Window(tokens, from_refusal=False))
        self._log_change(old, tokens, "the server reports it", warn=old is not None)

    def served(self, input_tokens: int, output_tokens: int) -> None:
        """The server ran a request of ``input_tokens`` and wrote ``output_tokens``: evidence of its window."""
        proven = max(input_tokens + SGLANG_CONTEXT_MARGIN + 1, input_tokens + output_tokens + 1)
        if proven <= self._proven:  # the common case, without the lock
            return
        with self._lock:
            if proven <= self._proven:
                return
            self._proven = proven
            proof = self._proof = (
                f"a request of {input_tokens} input tokens ({output_tokens} generated) it served"
            )
            old, dropped = self.tokens, None
            while self._windows and self._windows[-1].from_refusal and self._windows[-1].tokens < proven:
                dropped = self._windows.pop()
        if dropped is not None:
            why = f"{proof} contradicts the limit of {dropped.tokens} tokens a refusal named: an anomaly"
            self._log_change(old, self.tokens, why, warn=True)

    def refused(self, named: int | None, input_tokens: int, message: str) -> bool:
        """The server refused a request of ``input_tokens`` as too long (``message``: its text), naming the window
        ``named`` (None: the text names none). Returns whether the window in use changed."""
        with self._lock:
            old, proof, count = self.tokens, self._proof, 0
            if named is None or (old is not None and named >= old):
                return False  # nothing new: the refused request did not fit the window in use
            if named < self._proven:
                count = self._anomalies[named] = self._anomalies.get(named, 0) + 1
                if len(self._anomalies) > _KEPT_ANOMALIES:
                    del self._anomalies[next(iter(self._anomalies))]
            else:
                self._windows.append(_Window(named, from_refusal=True))
        if count:
            self._log_anomaly(named, proof, old, count, message)
            return False
        why = "the server reports none" if old is None else "nothing the server served contradicts it"
        self._log_change(old, named, f"a refusal of {input_tokens} input tokens named it; {why}", warn=True)
        return True

    def _log_anomaly(self, named: int, proof: str, window: int | None, count: int, message: str) -> None:
        """One WARNING the first time a contradicted limit is named; DEBUG with the count after."""
        logger.log(
            logging.WARNING if count == 1 else logging.DEBUG,
            "SGLang at %s named a context window of %d tokens, which %s contradicts: an anomaly (a router in "
            "front of engines with different KV pools, a stale error, a restarted engine), ignored: the window "
            "stays %s and only the refused request fails%s. The server said: %s",
            self.base_url,
            named,
            proof,
            "unknown" if window is None else f"{window} tokens",
            "" if count == 1 else f" (this limit named {count} times)",
            message,
        )

    def _log_change(self, old: int | None, new: int | None, why: str, *, warn: bool) -> None:
        logger.log(
            logging.WARNING if warn else logging.INFO,
            "SGLang at %s: context window %s -> %s: %s",
            self.base_url,
            "unknown" if old is None else f"{old} tokens",
            "unknown" if new is None else f"{new} tokens",
            why,
        )
