"""Tools for the rollout-worker tests, importable inside Ray workers (tests/ is on their PYTHONPATH): ``hold``
stays in the middle of its run, on whichever worker runs it, until the test opens its gate."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from strands import tool

GATE_ENV = "SLIME_STRANDS_TEST_GATE"


@tool
async def hold(key: str) -> str:
    """Wait until the test lets this call go (writes ``started-<key>-<pid>`` in the gate first)."""
    gate = Path(os.environ[GATE_ENV])
    (gate / f"started-{key}-{os.getpid()}").touch()
    while not (gate / "open").exists():
        await asyncio.sleep(0.02)
    return f"released {key}"
