"""Tools for partial-rollout tests (configured by dotted path, ``partial_tools.slow_add``): one that can be held
until slime's abort, one that raises slime's abort flag as it finishes, and a sandboxed one that can be held
in the sandbox."""

from __future__ import annotations

import asyncio
from typing import Any

from strands import tool

from slime_strands.sandbox import run_python

HOLD: dict[str, Any] = {"on": False, "started": 0, "finished": 0}
"""``on``: calls wait (slow_add) or sleep in the sandbox (python) until killed; the counters count calls."""
FLAG: dict[str, Any] = {"state": None}
"""The GenerateState whose ``aborted`` flag ``add_then_abort`` raises."""


@tool
async def slow_add(a: int, b: int) -> int:
    """Add two integers."""
    HOLD["started"] += 1
    if HOLD["on"]:
        await asyncio.sleep(600)
    HOLD["finished"] += 1
    return a + b


@tool
def add_then_abort(a: int, b: int) -> int:
    """Add two integers (and, as it returns, slime aborts the rollout)."""
    HOLD["started"] += 1
    state = FLAG["state"]
    if state is not None:
        state.aborted = True
    return a + b


@tool
async def python(code: str) -> str:
    """Run Python code in the sandbox and return its output."""
    HOLD["started"] += 1
    held = "\nimport time\ntime.sleep(600)\n" if HOLD["on"] else ""
    result = await run_python(code + held)
    HOLD["finished"] += 1
    return result.to_model_text()


def call(name: str, **arguments: Any) -> str:
    """A tool call as Qwen3 writes it."""
    import json

    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@tool
def plot_then_abort(expression: str) -> dict:
    """Plot an expression; returns the figure (and, as it returns the first time, slime aborts the rollout: a
    call the abort cut runs again when the episode goes on)."""
    import io

    from PIL import Image

    state, FLAG["state"] = FLAG["state"], None
    if state is not None:
        state.aborted = True
    out = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 120, 0)).save(out, format="PNG")
    return {
        "status": "success",
        "content": [{"text": "plotted"}, {"image": {"format": "png", "source": {"bytes": out.getvalue()}}}],
    }
