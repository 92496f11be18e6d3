"""Simple Strands tools (and a reward function) the rollout tests configure by dotted path (``rollout_tools.add``)."""

from __future__ import annotations

import asyncio

from strands import tool

from slime_strands.agent.subagents import subagent_tool

ABORT_FLAG: dict[str, object] = {"state": None}
CALLS: dict[str, int] = {"add": 0}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    CALLS["add"] += 1
    return a + b


@tool
def huge_output(n: int) -> str:
    """Return n lines of output."""
    return "\n".join(f"line {i}: " + "x" * 40 for i in range(n))


@tool
async def abort_now(reason: str) -> str:
    """Sets slime's abort flag (stands for slime aborting the rollout while a tool runs)."""
    state = ABORT_FLAG["state"]
    assert state is not None
    state.aborted = True
    await asyncio.sleep(0)
    return "ok"


@tool
def echo(text: str) -> str:
    """Return the text unchanged (lets tests put answer-like text in a tool response)."""
    return text


helper = subagent_tool(
    "helper",
    "Ask a helper agent to do an addition; give it the numbers.",
    system_prompt="You add numbers with the add tool, then say the sum.",
    tools=[add],
)


async def broken_reward(args, sample, **kwargs):
    """A reward function that fails (a grading service down)."""
    raise RuntimeError("grader down")


FIGURE_SIZE = (64, 64)


@tool
def plot(expression: str) -> dict:
    """Plot an expression; returns the figure."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", FIGURE_SIZE, (30, 90, 200)).save(out, format="PNG")
    return {
        "status": "success",
        "content": [
            {"text": f"plotted {expression}"},
            {"image": {"format": "png", "source": {"bytes": out.getvalue()}}},
        ],
    }
