"""ModelStats: the counters an ``SGLangModel`` keeps for its trajectory (the episode record sums them), and
TurnCut, the bound that cut a turn, in a module of their own so that a partial-rollout checkpoint can save them
without importing the model."""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["ModelStats", "TurnCut"]


class TurnCut(enum.Enum):
    """Which bound cut a turn that finished with ``length`` (the values are the episode terminations they
    become: ``Termination(cut.value)``)."""

    MAX_TOKENS = "max_tokens"  # the per-turn max_new_tokens
    CONTEXT_FULL = "context_full"  # the context window: here, or silently on the server
    RESPONSE_BUDGET = "response_budget"  # the whole-trajectory response budget


@dataclass
class ModelStats:
    """Per-trajectory counters kept by the model (reset with :meth:`SGLangModel.reset`)."""

    turns: int = 0
    generation_time_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    tool_calls_parsed: int = 0
    parse_errors: Counter[str] = field(default_factory=Counter)
    tool_outputs_truncated: int = 0
    overhead_s: float = 0.0
    """Client-side time of the turns (rendering, tokenizing, decoding, parsing), request time excluded."""
    last_finish_reason: str | None = None
    last_cut: TurnCut | None = None
    """How the last turn ends the episode when it finished with ``length``: ``MAX_TOKENS`` (it hit the
    per-turn ``max_new_tokens``), ``CONTEXT_FULL`` (the context window clamped it: here, or silently on the
    server) or ``RESPONSE_BUDGET`` (the whole-trajectory budget clamped it); None after other finishes."""
