"""Process pools in the sandbox end with their output or a clear error, never a timeout.

Model-written code uses ``multiprocessing`` and ``concurrent.futures`` often. A run is forked from the
warm interpreter, and whatever of its state a run inherits, the run's pool workers inherit too: a pool's
``terminate()`` (leaving ``with Pool(...)``, or at exit) SIGTERMs its workers, and a worker that caught that
SIGTERM with the interpreter's inherited Python handler while it was still starting lost the signal and was
joined forever. So a run starts with the signal state of a freshly started interpreter, runs as its own
``__main__`` (pickle finds its functions by name; spawn and forkserver children import it), and ends as
Python ends a program (non-daemon threads joined, atexit functions called: pools left open are finalized).

The stress test loads the CPU itself (the race needs a worker that is slow to start) and runs 200 pools;
a hang shows as a run that timed out. ``HANG_S`` only bounds such a hang: every run here takes well under
a second, on a loaded machine too.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import signal
import subprocess
import sys

import pytest
import pytest_asyncio
from sandbox_isolation import start_or_skip

from slime_strands.sandbox import ExecutionResult, Sandbox
from slime_strands.sandbox._backends import BACKENDS, ISOLATING
from slime_strands.settings import SandboxSettings

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="module")]

HANG_S = 30.0
SETTINGS = SandboxSettings(timeout_s=HANG_S, cpu_seconds=30, memory_mb=1024, concurrency=4)


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=ISOLATING)
async def pool_sandbox(request):
    """Pools need the whole standard library: the backends that bind the interpreter's files (``limits``
    imports only preloaded modules where Python is installed under a private directory such as /root)."""
    box = Sandbox(dataclasses.replace(SETTINGS, backend=request.param))
    await start_or_skip(box)
    yield box
    await box.aclose()


async def _run_each(box: Sandbox, cases: dict[str, str]) -> dict[str, ExecutionResult]:
    """Run every program at once (each is a run of its own); results by case name."""
    results = await asyncio.gather(*(box.run(code) for code in cases.values()))
    return dict(zip(cases, results, strict=True))


def _report(name: str, result: ExecutionResult) -> str:
    return f"{name}: {result.to_model_text()!r} (timed out: {result.timed_out})"


# -- what a run inherits -----------------------------------------------------------------------------

_SIGNAL_STATE = (
    "import signal\n"
    "def caught(number):\n"
    "    handler = signal.getsignal(number)\n"
    "    return handler not in (signal.SIG_DFL, None) and getattr(handler, '__name__', str(handler))\n"
    "print(sorted((s.name, caught(s)) for s in signal.Signals if caught(s)))\n"
    "status = dict(line.split(':') for line in open('/proc/self/status'))\n"
    "print(int(status['SigBlk'], 16), int(status['SigIgn'], 16))\n"
)
# A child SIGTERMed as soon as it is forked (a pool worker its pool terminates while it starts) dies of it,
# whether it ran yet or not; so does the run. With a Python handler inherited, the child ran the handler
# (exit 0), or lost the signal (Python drops what its handler caught before the fork's bookkeeping in the
# child ended) and slept on.
_SIGTERM = (
    "import os, signal, time\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    time.sleep(60)\n"
    "    os._exit(0)\n"
    "os.kill(pid, signal.SIGTERM)\n"
    "_, status = os.waitpid(pid, 0)\n"
    "print('child', os.WIFSIGNALED(status) and signal.Signals(os.WTERMSIG(status)).name, flush=True)\n"
    "os.kill(os.getpid(), signal.SIGTERM)\n"
    "print('the run survived SIGTERM')\n"
)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_runs_start_with_a_fresh_interpreters_signal_state(backend):
    """What Python sets at start-up and nothing else: SIGINT raises KeyboardInterrupt, SIGPIPE and
    SIGXFSZ are ignored, every other signal has its default action, none is blocked."""
    box = Sandbox(dataclasses.replace(SETTINGS, backend=backend))
    try:
        await start_or_skip(box)
        state, sigterm = await asyncio.gather(box.run(_SIGNAL_STATE), box.run(_SIGTERM))
    finally:
        await box.aclose()
    ignored = (1 << signal.SIGPIPE - 1) | (1 << signal.SIGXFSZ - 1)
    ignore = str(signal.SIG_IGN)
    expected = f"[('SIGINT', 'default_int_handler'), ('SIGPIPE', {ignore!r}), ('SIGXFSZ', {ignore!r})]\n"
    assert state.stdout == f"{expected}0 {ignored}\n", state
    assert sigterm.stdout == "child SIGTERM\n" and sigterm.signal == signal.SIGTERM, sigterm


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_program_is_its_own_main_module(backend):
    """Pickle and typing look the program's names up in ``sys.modules['__main__']``: the
    program's own module, not the interpreter's. Its working directory stays empty, its temp dir is that
    directory, and preloaded modules hold no state computed once for every run (a random seed, a key)."""
    settings = dataclasses.replace(
        SETTINGS, backend=backend, preload_modules=("numpy.random", "multiprocessing")
    )
    code = (
        "import os, pickle, sys, tempfile, typing, numpy, multiprocessing\n"
        "class Point(typing.NamedTuple):\n    x: 'Coordinate'\n"
        "Coordinate = int\n"
        "main = sys.modules['__main__']\n"
        "print(main.__dict__ is globals(), sorted(n for n in vars(main) if not n.startswith('__')))\n"
        "print(pickle.loads(pickle.dumps(Point(3))), typing.get_type_hints(Point))\n"
        "print(os.listdir('.'), tempfile.gettempdir() == os.getcwd() == os.environ['TMPDIR'])\n"
        "print(numpy.random.randint(2**62), multiprocessing.current_process().authkey.hex())\n"
    )
    box = Sandbox(settings)
    try:
        await start_or_skip(box)
        first, second = await asyncio.gather(box.run(code), box.run(code))
    finally:
        await box.aclose()
    lines, again = first.stdout.splitlines(), second.stdout.splitlines()
    assert lines[:3] == [
        "True ['Coordinate', 'Point', 'main', 'multiprocessing', 'numpy', 'os', 'pickle', 'sys', 'tempfile', "
        "'typing']",
        "Point(x=3) {'x': <class 'int'>}",
        "[] True",
    ], first
    assert again[:3] == lines[:3], second
    (seed, key), (other_seed, other_key) = lines[3].split(), again[3].split()
    assert seed != other_seed and key != other_key, (first, second)


# -- pools end with their output or a clear error ----------------------------------------------------

_SQUARE = "import multiprocessing as mp\nfrom concurrent.futures import ProcessPoolExecutor\ndef sq(x):\n    return x * x\n"
_GUARD = "if __name__ == '__main__':\n"
_POOLS = {  # name -> program printing [1, 4, 9] (indented: under the guard; not: without it)
    "fork Pool": "with mp.Pool(2) as p:\n    print(p.map(sq, [1, 2, 3]))\n",
    "ProcessPoolExecutor": "with ProcessPoolExecutor(2) as ex:\n    print(list(ex.map(sq, [1, 2, 3])))\n",
    "spawn Pool": "with mp.get_context('spawn').Pool(2) as p:\n    print(p.map(sq, [1, 2, 3]))\n",
    "forkserver Pool": "with mp.get_context('forkserver').Pool(2) as p:\n    print(p.map(sq, [1, 2, 3]))\n",
    "spawn ProcessPoolExecutor": (
        "with ProcessPoolExecutor(2, mp_context=mp.get_context('spawn')) as ex:\n"
        "    print(list(ex.map(sq, [1, 2, 3])))\n"
    ),
    "forkserver ProcessPoolExecutor": (
        "with ProcessPoolExecutor(2, mp_context=mp.get_context('forkserver')) as ex:\n"
        "    print(list(ex.map(sq, [1, 2, 3])))\n"
    ),
    "Pool left open": "p = mp.Pool(2)\nprint(p.map(sq, [1, 2, 3]))\n",
    "spawn Pool left open": "p = mp.get_context('spawn').Pool(2)\nprint(p.map(sq, [1, 2, 3]))\n",
    "ProcessPoolExecutor left open": "ex = ProcessPoolExecutor(2)\nprint(list(ex.map(sq, [1, 2, 3])))\n",
}


def _indent(body: str) -> str:
    return "".join(f"    {line}\n" for line in body.splitlines())


async def test_pools_end_with_their_output(pool_sandbox):
    """Each start method, a pool and an executor, left open or not, with a function the program defines,
    with and without ``if __name__ == '__main__':``."""
    cases = {f"{name}, guarded": _SQUARE + _GUARD + _indent(body) for name, body in _POOLS.items()}
    cases.update({f"{name}, unguarded": _SQUARE + body for name, body in _POOLS.items()})
    results = await _run_each(pool_sandbox, cases)
    wrong = [_report(name, r) for name, r in results.items() if (r.stdout, r.exit_code) != ("[1, 4, 9]\n", 0)]
    assert not wrong, wrong


async def test_a_program_ends_as_python_ends_it(pool_sandbox):
    """Work a program leaves running at its end is finished, as Python finishes it: non-daemon threads and
    processes are joined, executors complete what was submitted, atexit functions run, the standard streams
    are flushed. (The work waits a little so that a run that ended without it would not see it finish.)"""
    late = "import time\ndef late(text):\n    time.sleep(0.3)\n    print(text, flush=True)\n"
    cases = {
        "thread": late + "import threading\nthreading.Thread(target=late, args=('thread',)).start()",
        "process": late + "import multiprocessing as mp\nmp.Process(target=late, args=('process',)).start()",
        "executor": late + "from concurrent.futures import ProcessPoolExecutor as Executor\n"
        "Executor(1).submit(late, 'executor')",
        "spawn process": late + "import multiprocessing as mp\n"
        "mp.get_context('spawn').Process(target=late, args=('spawn process',)).start()",
        "atexit": late + "import atexit\natexit.register(late, 'atexit')\nraise SystemExit(3)",
        "sys.__stdout__": "import sys\nsys.__stdout__.write('sys.__stdout__\\n')",  # flushed like sys.stdout
    }
    results = await _run_each(pool_sandbox, cases)
    outputs = {name: (r.stdout, r.exit_code) for name, r in results.items()}
    assert outputs == {name: (f"{name}\n", 3 if name == "atexit" else 0) for name in cases}, results


async def test_pool_failures_are_clear_errors(pool_sandbox):
    """A task that raises, a function pickle cannot send, a worker that dies: the program's traceback
    names what went wrong, in the main process, at once."""
    cases = {
        "raises": _SQUARE
        + "def bad(x):\n    raise ValueError(f'bad input {x}')\n"
        + _GUARD
        + "    with mp.get_context('spawn').Pool(2) as p:\n        p.map(bad, [1, 2, 3])",
        "lambda": _SQUARE + "with mp.get_context('forkserver').Pool(2) as p:\n    p.map(lambda x: x, [1])",
        "dies": _SQUARE + "import os\nwith ProcessPoolExecutor(2) as ex:\n    list(ex.map(os._exit, [1, 2]))",
    }
    results = await _run_each(pool_sandbox, cases)
    expected = {
        "raises": "ValueError: bad input",
        "lambda": "PicklingError",
        "dies": "BrokenProcessPool",
    }
    for name, result in results.items():
        assert result.exit_code == 1 and expected[name] in result.stderr, _report(name, result)


# -- the stress test -----------------------------------------------------------------------------------

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


def _burn_cpu(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` busy-looping processes: a loaded machine, whatever else runs on it."""
    return [subprocess.Popen([sys.executable, "-c", "while True:\n    pass"]) for _ in range(count)]


async def test_pools_under_load_never_hang(pool_sandbox):
    """200 pool runs, four at a time, with two busy loops on the CPU: each prints its result and exits 0."""
    programs = [code for code, count in _STRESS.items() for _ in range(count)]
    burners = _burn_cpu(2)
    try:
        results = await asyncio.gather(*(pool_sandbox.run(code) for code in programs))
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()
    failed = [
        (code, r)
        for code, r in zip(programs, results, strict=True)
        if (r.stdout, r.exit_code) != ("[1, 2, 3]\n", 0)
    ]
    outcomes = collections.Counter("timed out" if r.timed_out else f"exit {r.exit_code}" for _, r in failed)
    assert not failed, (f"{len(failed)} of {len(programs)} runs failed: {dict(outcomes)}", failed[:3])


async def test_runs_at_once_each_get_max_processes(pool_sandbox):
    """Four runs at once each hold ``max_processes - 4`` children for a while: with a uid of its own (root)
    each run has its own count; runs that share the interpreter's uid share one count, which must hold all
    of them (a count of ``max_processes`` for all made pools fail with "can't start new thread")."""
    children = SETTINGS.max_processes - 4
    code = (  # each child waits until the parent has started all of them and held them for a while
        "import os, time\nr, w = os.pipe()\nstarted = 0\n"
        f"for _ in range({children}):\n"
        "    try:\n        pid = os.fork()\n    except OSError as exc:\n        print(exc)\n        break\n"
        "    if pid == 0:\n        os.close(w)\n        os.read(r, 1)\n        os._exit(0)\n"
        "    started += 1\n"
        "time.sleep(1.5)\nos.close(w)\nfor _ in range(started):\n    os.wait()\nprint(started)"
    )
    results = await asyncio.gather(*(pool_sandbox.run(code) for _ in range(SETTINGS.concurrency)))
    assert [(r.stdout, r.exit_code) for r in results] == [(f"{children}\n", 0)] * SETTINGS.concurrency, (
        results
    )
