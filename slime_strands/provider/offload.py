"""Tokenizer, template and parsing work of a turn: on the event loop when small, in a small pool when large.

A thread hop (submit, wake-up, GIL hand-over) costs more than rendering and encoding a few KB, so small inputs
stay on the loop; only LARGE ones leave it (a 1 MB tool output or a 100k-token response must not stall the
other agents). A dedicated pool keeps this work off the default executor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["offload"]

T = TypeVar("T")

_TOKENIZER_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="slime-strands-tokenizer")
_INLINE_CHARS = 32_768
"""Work on at most this many characters (about 8k tokens, ~2 ms of tokenizer time) runs on the loop."""


async def offload(size: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, work on ``size`` characters: off the event loop when it is large."""
    if size <= _INLINE_CHARS:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(_TOKENIZER_POOL, fn, *args)
