"""How many tokens a turn may add and write: the context window, the whole-trajectory response budget, the
per-turn cap, and what context management keeps free.

The window is the configured one and the server's less the margin SGLang's scheduler keeps (it refuses inputs a
few tokens before its window is full); the response budget counts every token after the prompt (generated, tool
and template tokens). A turn's ``max_new_tokens`` is the smallest bound, and that bound says how the turn ends
the episode if it finishes ``length`` (:class:`~slime_strands.provider.model_stats.TurnCut`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from strands.types.exceptions import ContextWindowOverflowException

from ..errors import SlimeStrandsError
from .checkpoint import PendingTurn
from .client import SGLANG_CONTEXT_MARGIN, SGLangClient
from .model_stats import TurnCut
from .token_manager import TokenManager

__all__ = ["MIN_GENERATION_ROOM", "ResponseBudgetExhaustedError", "TurnBudget", "TurnBudgets"]

MIN_GENERATION_ROOM = 1
"""Fewest tokens a turn may be left to write by default (``min_turn_tokens``)."""


class ResponseBudgetExhaustedError(SlimeStrandsError, ContextWindowOverflowException, RuntimeError):
    """The whole-trajectory response budget leaves no room for another turn.

    A ``ContextWindowOverflowException`` for Strands: the agent hands it to its conversation manager, so
    context management can start a new segment (with a budget of its own) instead of ending the episode."""


@dataclass(frozen=True)
class TurnBudget:
    """A turn's ``max_new_tokens`` (of a turn an abort cut: the whole turn's, its continuations included) and
    how a turn cut at that length ends the episode: the bound that set it."""

    max_new_tokens: int
    bound: TurnCut


class TurnBudgets:
    """The budgets of one model's turns, read from its live config (``context_length``, ``max_response_tokens``,
    ``reserved_tokens``, ``min_turn_tokens``, ``params['max_new_tokens']``) and its client's window."""

    def __init__(self, config: Mapping[str, Any], client: SGLangClient) -> None:
        self._config = config
        self._client = client

    async def context_window(self) -> int | None:
        """Tokens a trajectory segment may hold: the configured window, and the server's less the margin
        SGLang's scheduler keeps; None while neither is known."""
        configured = self._config["context_length"] or self._config.get("context_window_limit")
        served = await self._client.context_length()
        limits = [configured, None if served is None else served - SGLANG_CONTEXT_MARGIN]
        known = [limit for limit in limits if limit is not None]
        return min(known) if known else None

    async def fill_ratio(self, tm: TokenManager) -> float:
        """How full the segment ``tm`` is: the larger of its tokens over the context window and its response
        tokens over the response budget (0.0 for what is not bounded)."""
        ratios = [0.0]
        context = await self.context_window()
        if context:
            ratios.append(len(tm) / context)
        budget = self._config["max_response_tokens"]
        if budget:
            ratios.append(tm.response_length / budget)
        return max(ratios)

    async def room(self, tm: TokenManager, *, prompt: bool = False) -> int | None:
        """Tokens that may still be appended to ``tm`` (observation + generation) short of ``reserved_tokens``,
        or None when unbounded; for a segment's ``prompt`` only the context window counts (the response budget
        does not count prompt tokens)."""
        rooms = []
        context = await self.context_window()
        if context is not None:
            rooms.append(context - len(tm))
        budget = self._config["max_response_tokens"]
        if budget is not None and not prompt:
            rooms.append(budget - tm.response_length)
        return min(rooms) - self._config["reserved_tokens"] if rooms else None

    async def for_turn(self, tm: TokenManager, delta_len: int) -> TurnBudget:
        """``max_new_tokens`` for a turn adding ``delta_len`` tokens to ``tm``: the per-turn cap clamped to the
        context and response budgets, short of ``reserved_tokens``, and the bound that set it (the cap on a
        tie). Raises ``ContextWindowOverflowException`` / :class:`ResponseBudgetExhaustedError` when fewer than
        ``min_turn_tokens`` are left to write."""
        config = self._config
        reserved, floor = config["reserved_tokens"], config["min_turn_tokens"]
        context = await self.context_window()
        context_room = None if context is None else context - len(tm) - delta_len - reserved
        budget = config["max_response_tokens"]
        response_room = None if budget is None else budget - tm.response_length - delta_len - reserved
        kept = f" ({reserved} kept free, {floor} needed to write)"
        if (reserved, floor) == (0, MIN_GENERATION_ROOM):
            kept = ""
        if context_room is not None and context_room < floor:
            raise ContextWindowOverflowException(
                f"the context window ({context} tokens) is full: the trajectory has {len(tm)} tokens and the new "
                f"messages {delta_len}{kept}"
            )
        if response_room is not None and response_room < floor:
            raise ResponseBudgetExhaustedError(
                f"the response budget ({budget} tokens) is spent: {tm.response_length} used, the new messages "
                f"need {delta_len}{kept}"
            )
        bounds = [
            (int(room), cut)
            for room, cut in (
                (config["params"].get("max_new_tokens"), TurnCut.MAX_TOKENS),
                (context_room, TurnCut.CONTEXT_FULL),
                (response_room, TurnCut.RESPONSE_BUDGET),
            )
            if room is not None
        ]
        if not bounds:
            raise ValueError(
                "set params['max_new_tokens'], context_length or max_response_tokens: none is known"
            )
        return TurnBudget(*min(bounds, key=lambda bound: bound[0]))

    async def rest_of_turn(self, tm: TokenManager, turn: PendingTurn, spent: int) -> TurnBudget:
        """The budget of a turn an abort cut after ``spent`` tokens: the one it was sent with (the rooms have
        not moved: they hold the cut turn's input and output), clamped to a window learned since."""
        context = await self.context_window()
        if context is not None and context - len(tm) < turn.max_new_tokens - spent:
            return TurnBudget(spent + max(0, context - len(tm)), TurnCut.CONTEXT_FULL)
        return TurnBudget(turn.max_new_tokens, turn.bound)
