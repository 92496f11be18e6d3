"""Process pools in the sandbox end with their output or a clear error, never a timeout.

Model-written code uses ``multiprocessing`` and ``concurrent.futures`` often. A run is forked from the
warm interpreter, so whatever of its state the run inherits, the run's pool workers inherit too: a pool's
``terminate()`` (``with Pool(...)`` on exit, or at interpreter exit) SIGTERMs its workers, and a worker that
caught SIGTERM with an inherited Python handler while it was still starting lost that signal and was joined
forever. Every test here runs on both isolating backends; the stress test loads the CPU itself (the race
needs a worker that is slow to start) and a hang shows as a run that timed out, its stderr in the message.
"""

from __future__ import annotations

import asyncio
import collections
import subprocess
import sys

import pytest
import pytest_asyncio
from sandbox_isolation import start_or_skip

from slime_strands.sandbox import Sandbox
from slime_strands.sandbox._backends import ISOLATING
from slime_strands.settings import SandboxSettings

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="module")]

# Bounds a hang only: a pool run takes well under a second here, even on a loaded machine.
HANG_S = 30.0


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=ISOLATING)
async def pool_sandbox(request):
    box = Sandbox(
        SandboxSettings(
            backend=request.param, timeout_s=HANG_S, cpu_seconds=30, memory_mb=1024, concurrency=4
        )
    )
    await start_or_skip(box)
    yield box
    await box.aclose()


def _burn_cpu(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` busy-looping processes: a loaded machine, whatever else runs on it."""
    return [subprocess.Popen([sys.executable, "-c", "while True:\n    pass"]) for _ in range(count)]


def _stop(burners: list[subprocess.Popen[bytes]]) -> None:
    for proc in burners:
        proc.kill()
    for proc in burners:
        proc.wait()


_STRESS = {  # program -> runs of it; each prints [1, 2, 3]. More workers than tasks: some still start
    "from multiprocessing import Pool\nwith Pool(2) as p:\n    print(p.map(abs, [-1, -2, 3]))": 60,
    "from multiprocessing import Pool\nwith Pool(4) as p:\n    print(p.map(abs, [-1, -2, 3]))": 80,
    "from multiprocessing import Pool\np = Pool(4)\nprint(p.map(abs, [-1, -2, 3]))": 20,  # left open
    "from concurrent.futures import ProcessPoolExecutor\n"
    "with ProcessPoolExecutor(2) as ex:\n    print(list(ex.map(abs, [-1, -2, 3])))": 20,
    "import multiprocessing as mp\nwith mp.get_context('spawn').Pool(2) as p:\n"
    "    print(p.map(abs, [-1, -2, 3]))": 10,
    "import multiprocessing as mp\nwith mp.get_context('forkserver').Pool(2) as p:\n"
    "    print(p.map(abs, [-1, -2, 3]))": 10,
}


async def test_pools_under_load_never_hang(pool_sandbox):
    """200 pool runs, four at a time, with the CPU kept busy: each prints its result and exits 0."""
    programs = [code for code, count in _STRESS.items() for _ in range(count)]
    burners = _burn_cpu(2)
    try:
        results = await asyncio.gather(*(pool_sandbox.run(code) for code in programs))
    finally:
        _stop(burners)
    failed = [
        (code, r)
        for code, r in zip(programs, results, strict=True)
        if (r.stdout, r.exit_code) != ("[1, 2, 3]\n", 0)
    ]
    outcomes = collections.Counter("timed out" if r.timed_out else f"exit {r.exit_code}" for _, r in failed)
    assert not failed, (f"{len(failed)} of {len(programs)} failed: {dict(outcomes)}", failed[:3])
