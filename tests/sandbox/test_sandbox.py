"""The sandbox against hostile code, on every backend; plus normal use and the tool.

Containment differs by backend and the tests say so: ``bwrap`` and ``unshare`` hide host files (the host's
``/tmp``, home and project included) and the network; ``limits`` isolates by uid and rlimits only. Whatever
the backend, the caller keeps working and nothing outlives a run. A backend that fails here FAILS its
tests; only a machine that provably refuses its namespaces skips them (never on CI: see
``sandbox_isolation``). No test depends on how fast the machine is: they assert outcomes (killed, timed
out, the marker, what survived), and wait for events, not for durations.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path

import pytest
import pytest_asyncio
from sandbox_isolation import ROOT, fail_or_skip, start_or_skip

from slime_strands.sandbox import Sandbox, _host, _placements, _sandbox, execute_python_code, run_python
from slime_strands.sandbox._backends import BACKENDS
from slime_strands.settings import SandboxSettings

# One event loop for the module: each backend's warm interpreter then starts once, not once per test.
pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

PROJECT_FILE = Path(__file__).resolve().parents[2] / "pyproject.toml"
SHORT_TIMEOUT_S = 3.0  # the sandbox whose runs are meant to time out


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def shared_sandbox(request):
    box = Sandbox(SandboxSettings(backend=request.param, timeout_s=60, cpu_seconds=5, memory_mb=512))
    yield box
    await box.aclose()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_short_sandbox(shared_sandbox):
    box = Sandbox(dataclasses.replace(shared_sandbox.settings, timeout_s=SHORT_TIMEOUT_S))
    yield box
    await box.aclose()


@pytest_asyncio.fixture(loop_scope="module")
async def sandbox(shared_sandbox):
    """The backend's sandbox with a live interpreter (a test before may have killed or closed it)."""
    assert await start_or_skip(shared_sandbox) == shared_sandbox.settings.backend
    first = await shared_sandbox.run("print('ready')")
    assert first.stdout == "ready\n", first
    return shared_sandbox


@pytest_asyncio.fixture(loop_scope="module")
async def short_sandbox(sandbox, shared_short_sandbox):
    """The same backend with a short timeout (for runs that must be killed by it)."""
    await start_or_skip(shared_short_sandbox)
    return shared_short_sandbox


# -- what is left of a run ---------------------------------------------------------------------------


def _processes() -> dict[int, tuple[int, str, int]]:
    """Every host process: pid -> (parent pid, state, real uid). The host sees every namespace's."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError, StopIteration):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            status = (entry / "status").read_text().splitlines()
            uid = int(next(line for line in status if line.startswith("Uid:")).split()[1])
            found[int(entry.name)] = (int(fields[1]), fields[0], uid)
    return found


def _live_descendants(pid: int) -> set[int]:
    """Live (not zombie) processes below ``pid``, however deep, whatever their session or uid."""
    table = _processes()
    children = collections.defaultdict(list)
    for child, (parent, _, _) in table.items():
        children[parent].append(child)
    found, level = set(), [pid]
    while level:
        level = [child for parent in level for child in children[parent]]
        found.update(child for child in level if table[child][1] != "Z")
    return found


def _zygote_pid(box: Sandbox) -> int:
    """Host pid of the warm interpreter: the outermost descendant of the started process running Python."""
    table = _processes()
    level, found = [box._interp.proc.pid], []
    while level and not found:
        level = [pid for pid, (parent, _, _) in table.items() if parent in level]
        for pid in level:
            with contextlib.suppress(OSError):
                if (Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:1]) == [sys.executable.encode()]:
                    found.append(pid)
    assert len(found) == 1, found
    return found[0]


def _spawned(box: Sandbox) -> set[int]:
    """What the warm interpreter has below it now: its runs and whatever they started (its reaper too)."""
    return _live_descendants(_zygote_pid(box))


async def _wait_for(condition, what: str, limit_s: float = 60.0) -> None:
    """Wait for an event (not a duration): ``limit_s`` only bounds a test that would otherwise hang."""
    for _ in range(int(limit_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


async def _nothing_left(box: Sandbox, before: set[int]) -> None:
    """Nothing the run started survives: checked by ancestry (every process a run starts, daemons
    included, stays below the interpreter, their subreaper), and as root by uid as well."""
    await _wait_for(lambda: not (_spawned(box) - before), f"processes left by runs: {_spawned(box) - before}")
    if ROOT:
        uids = set(box._interp.uids)
        assert uids
        survivors = [pid for pid, (_, state, uid) in _processes().items() if uid in uids and state != "Z"]
        assert not survivors, survivors


def _zombie_children() -> list[int]:
    return [pid for pid, (parent, state, _) in _processes().items() if state == "Z" and parent == os.getpid()]


# -- normal use -------------------------------------------------------------------------------------


async def test_print_traceback_and_model_text(sandbox):
    result = await sandbox.run("print('hello')\nprint(21 * 2)")
    assert result.ok and result.stdout == "hello\n42\n" and result.to_model_text() == "hello\n42"
    result = await sandbox.run("x = 1\ny = x / 0")
    assert result.exit_code == 1 and not result.ok
    text = result.to_model_text()
    assert 'File "<code>", line 2' in text and "y = x / 0" in text and "ZeroDivisionError" in text
    assert "[exit code 1]" in text and "_zygote" not in text and "<string>" not in text
    assert (await sandbox.run("x = 1")).to_model_text().startswith("[no output")
    assert (await sandbox.run("import sys; sys.exit(3)")).exit_code == 3


async def test_numpy_and_sympy(sandbox):
    code = "import numpy as np, sympy as sp\nprint(int(np.arange(10).sum()), sp.factorint(2**32 + 1))"
    result = await sandbox.run(code)
    assert result.stdout.strip() == "45 {641: 1, 6700417: 1}", result


async def test_runs_do_not_share_state(sandbox):
    await sandbox.run(
        "import json, os\njson.leak = 1\nos.environ['LEAK'] = '1'\nopen('mine.txt', 'w').write('x')"
    )
    result = await sandbox.run(
        "import json, os\nprint(hasattr(json, 'leak'), 'LEAK' in os.environ, sorted(os.listdir('.')))"
    )
    assert result.stdout.strip() == "False False []", result
    assert "mine.txt" not in result.stdout


async def test_shared_places_are_emptied_after_each_run(sandbox):
    """Files in the shared writable dirs and IPC objects outlive processes: a run's are removed with it."""
    if not ROOT:
        pytest.skip("without root, runs share the interpreter's uid: their leftovers cannot be told apart")
    leave = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "open('/dev/shm/left-behind', 'w').write('x')\n"
        "try:\n    open('/tmp/left-behind', 'w').write('x')\nexcept OSError:\n    pass\n"
        "print(libc.shmget(4242, 4096, 0o1666) >= 0, libc.msgget(4243, 0o1666) >= 0,"
        " libc.semget(4244, 1, 0o1666) >= 0, libc.mq_open(b'/left-behind', 0o102, 0o666, None) >= 0)\n"
    )
    find = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(os.path.exists('/dev/shm/left-behind'), os.path.exists('/tmp/left-behind'),"
        " libc.shmget(4242, 0, 0) >= 0, libc.msgget(4243, 0) >= 0, libc.semget(4244, 0, 0) >= 0,"
        " libc.mq_open(b'/left-behind', 2) >= 0)\n"
    )
    left = await sandbox.run(leave)
    assert left.stdout == "True True True False\n", left  # POSIX queues: RLIMIT_MSGQUEUE is 0
    found = await sandbox.run(find)
    assert found.stdout == "False False False False False False\n", found
    if os.uname().machine == "x86_64":  # keys in the uid's keyrings and the session keyring
        add_key = "ctypes.CDLL(None).syscall(248, b'user', b'left-behind', b'x', 1, ctypes.c_long({}))"
        leave = "import ctypes\n" + "\n".join(add_key.format(ring) for ring in (-3, -4, -5))
        await sandbox.run(leave)
        search = "ctypes.CDLL(None).syscall(250, 10, ctypes.c_long({}), b'user', b'left-behind', 0) > 0"
        find = "import ctypes\nprint([" + ", ".join(search.format(ring) for ring in (-3, -4, -5)) + "])"
        assert (await sandbox.run(find)).stdout == "[False, False, False]\n"
    assert not Path("/dev/shm/left-behind").exists() and not Path("/tmp/left-behind").exists()


# -- hostile code -----------------------------------------------------------------------------------


async def test_host_files(sandbox):
    host_tmp = Path(tempfile.mkdtemp(prefix="slime-strands-host-"))  # in the host's /tmp
    try:
        host_tmp.chmod(0o755)
        (host_tmp / "secret.txt").write_text("host secret")
        (host_tmp / "secret.txt").chmod(0o644)
        paths = ["/etc/shadow", "/root/.bashrc", str(PROJECT_FILE), str(host_tmp / "secret.txt")]
        code = (
            "import os\n"
            f"for path in {paths!r}:\n"
            "    try:\n"
            "        open(path).read(1); print(path, 'READ')\n"
            "    except OSError as exc:\n"
            "        print(path, type(exc).__name__)\n"
            "try:\n"
            "    print('/root', os.listdir('/root'))\n"
            "except OSError as exc:\n"
            "    print('/root', type(exc).__name__)\n"
        )
        out = (await sandbox.run(code)).stdout
    finally:
        (host_tmp / "secret.txt").unlink()
        host_tmp.rmdir()
    assert "/etc/shadow READ" not in out and "/root/.bashrc READ" not in out, out
    # The host's /root is hidden or unreadable (at most the directory holding this Python is visible).
    visible = {"PermissionError", "FileNotFoundError", "[]", "['.pyenv']"}
    assert any(f"/root {v}" in out for v in visible), out
    if sandbox.backend != "limits":  # not even mounted: the project, the host's /tmp
        assert f"{PROJECT_FILE} FileNotFoundError" in out, out
        assert f"{host_tmp / 'secret.txt'} FileNotFoundError" in out, out


async def test_every_run_has_its_limits_and_no_privileges(sandbox):
    """Capabilities none, no_new_privs set (setuid binaries such as mount or passwd give nothing)."""
    names = ["CPU", "AS", "FSIZE", "NPROC", "NOFILE", "MSGQUEUE", "CORE"]
    code = (
        "import os, resource\n"
        f"print([resource.getrlimit(getattr(resource, 'RLIMIT_' + n)) for n in {names!r}])\n"
        "print(os.getuid() != 0, os.geteuid() != 0, os.getgroups())\n"
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith(('NoNewPrivs', 'CapEff'))])\n"
    )
    lines = (await sandbox.run(code)).stdout.splitlines()
    mib = 1 << 20
    # NPROC: the run's own uid as root; without root the runs share one uid and one count
    nproc = 32 if ROOT else 32 * sandbox.concurrency + _sandbox._INTERPRETER_PROCESSES
    limits = [(5, 6), *((v, v) for v in (512 * mib, 16 * mib, nproc, 1024, 0, 0))]
    assert lines[0] == str(limits), lines
    if ROOT:
        assert lines[1] == "True True []", lines
    assert lines[2] == "['0000000000000000', '1']", lines


async def test_writes_outside_the_run_dir(sandbox):
    targets = ["/pwned", "/usr/pwned", "/etc/pwned"]
    if sandbox.backend != "limits" or ROOT:  # limits without root: the code has the user's own rights
        targets.append(str(PROJECT_FILE.parent / "pwned"))
    if sandbox.backend != "limits" and ROOT:
        targets.append("/tmp/pwned")  # private /tmp: runs of their own uid may only write their own directory
    code = "import os\n" + "".join(
        f"try:\n    open({t!r}, 'w').write('x'); print('WROTE', {t!r})\nexcept OSError as e:\n    print('denied')\n"
        for t in targets
    )
    result = await sandbox.run(code)
    assert "WROTE" not in result.stdout and result.stdout.count("denied") == len(targets), result
    assert not any(Path(t).exists() for t in targets if not t.startswith("/tmp/")), targets


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "limits"])  # limits: no network namespace
async def test_network(backend):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        code = (
            "import socket\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5); print('CONNECTED')\n"
            "except OSError as exc:\n    print('blocked', type(exc).__name__)\n"
            "try:\n    socket.getaddrinfo('pypi.org', 443); print('RESOLVED')\n"
            "except OSError as exc:\n    print('blocked', type(exc).__name__)\n"
        )
        box = Sandbox(SandboxSettings(backend=backend, timeout_s=60))
        try:
            await start_or_skip(box)
            result = await box.run(code)
        finally:
            await box.aclose()
    finally:
        listener.close()
    assert result.stdout.count("blocked") == 2, result


async def test_fork_bomb(short_sandbox):
    if not ROOT and short_sandbox.backend == "limits":
        pytest.skip("without root there is no per-run uid or pid namespace to bound a fork bomb")
    before = _spawned(short_sandbox)
    result = await short_sandbox.run(
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    )
    assert result.timed_out, result
    await _nothing_left(short_sandbox, before)
    assert (await short_sandbox.run("print('alive')")).stdout == "alive\n"
    if ROOT:  # max_processes (32) binds: RLIMIT_NPROC of the run's own uid
        result = await short_sandbox.run(  # the children wait for the parent to be done forking
            "import os\nr, w = os.pipe()\nstarted = 0\nfor _ in range(40):\n    try:\n"
            "        if os.fork() == 0:\n            os.close(w)\n            os.read(r, 1)\n            os._exit(0)\n"
            "        started += 1\n    except OSError:\n        pass\nprint(started)"
        )
        assert 20 <= int(result.stdout) < 32, result


async def test_memory_bomb(sandbox):
    result = await sandbox.run("x = bytearray(4 * 1024**3)")
    assert result.memory_exceeded and "[memory limit exceeded (512 MiB)]" in result.to_model_text()
    result = await sandbox.run("chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024**2))")
    assert result.memory_exceeded, result
    assert (await sandbox.run("print('alive')")).stdout == "alive\n"


async def test_infinite_loop_and_cpu_limit(short_sandbox):
    loop = "while True:\n    pass"
    stubborn = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n" + loop
    # CPU seconds run out long before this wall clock, however loaded the machine.
    tight = SandboxSettings(
        backend=short_sandbox.settings.backend, timeout_s=100, cpu_seconds=1, prewarm=False
    )
    result, cpu, killed = await asyncio.gather(  # at once: the whole test takes one timeout
        short_sandbox.run(loop), run_python(loop, tight), run_python(stubborn, tight)
    )
    assert result.timed_out and result.exit_code is None and result.signal is None, result
    assert result.to_model_text() == f"[timeout: killed after {SHORT_TIMEOUT_S:.1f} s]"
    assert not cpu.timed_out  # CPU seconds ran out before the wall clock
    assert cpu.to_model_text() == "[killed by SIGXCPU: CPU time limit]", cpu
    # Ignoring SIGXCPU: SIGKILL at the hard limit, a second later.
    assert not killed.timed_out and killed.to_model_text() == "[killed by SIGKILL]", killed


_SPAWN_AND_REPORT = (  # a background child and a setsid + double-fork daemon; both report when alive
    "import os, time\n"
    "r, w = os.pipe()\n"
    "if os.fork() == 0:\n"
    "    os.write(w, b'c')\n"
    "    time.sleep(100)\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        os.write(w, b'd')\n"
    "        time.sleep(100)\n"
    "    os._exit(0)\n"
    "alive = b''\n"
    "while len(alive) < 2:\n"
    "    alive += os.read(r, 2)\n"
    "print('spawned', bytes(sorted(alive)).decode(), flush=True)\n"
)


async def test_background_child_and_escapes_die_with_the_run(sandbox, short_sandbox):
    before = _spawned(sandbox)
    result = await sandbox.run(_SPAWN_AND_REPORT)  # the run ends; its child and daemon are alive
    assert result.stdout == "spawned cd\n", result
    await _nothing_left(sandbox, before)
    # Killed while running (an aborted rollout): once all three are seen alive.
    before = _spawned(sandbox)
    running = asyncio.create_task(sandbox.run(_SPAWN_AND_REPORT + "time.sleep(100)\n"))
    await _wait_for(lambda: len(_spawned(sandbox) - before) >= 3, "the run, its child and its daemon")
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    await _nothing_left(sandbox, before)
    # And on timeout.
    before = _spawned(short_sandbox)
    result = await short_sandbox.run(_SPAWN_AND_REPORT + "time.sleep(100)\n")
    assert result.timed_out and result.stdout == "spawned cd\n", result
    await _nothing_left(short_sandbox, before)


async def test_killing_the_parent_does_not_break_the_sandbox(sandbox):
    pid = sandbox._interp.proc.pid
    # limits without root: the code runs as the caller, in the caller's pid namespace, and kill(-1) would
    # kill every process of the caller's user, this test's included (documented).
    targets = "os.getppid(), 1" + ("" if sandbox.backend == "limits" and not ROOT else ", -1")
    code = (
        "import os, signal\n"
        f"for target in ({targets}):\n"
        "    try:\n        os.kill(target, signal.SIGKILL)\n    except OSError as exc:\n        print(type(exc).__name__)\n"
    )
    await sandbox.run(code)
    assert (await sandbox.run("print('alive')")).stdout == "alive\n"
    if ROOT:  # its own uid cannot signal the interpreter: the same one still serves
        assert sandbox._interp.proc.pid == pid


async def test_a_run_cannot_forge_results(sandbox):
    """Fake reply lines written to every fd, and to the fds of the interpreter and of every process above it that
    the run can see, reach no other run. Above it in a pid namespace is the namespace's init: bwrap's own init
    held the host's control pipes on fds 0-2 (dumpable, and without root of the runs' uid), until the
    interpreter became that init (``--as-pid-1``). Without root or a pid namespace (``limits``) the host itself
    is above, of the same uid: only the interpreter's own fds are tried there (that backend does not isolate)."""
    above = "os.getppid()" if sandbox.backend == "limits" and not ROOT else "1"
    forger = (
        "import json, os\n"
        "fake = ''.join(json.dumps({'id': i, 'stdout': 'FORGED', 'exit_code': 0}) + '\\n' for i in range(10**4))\n"
        "hits = []\n"
        "for fd in range(3, 256):\n"
        "    try:\n        os.write(fd, fake.encode()); hits.append(fd)\n    except OSError:\n        pass\n"
        "chain, pid = [], os.getppid()\n"
        "while pid > 0:\n"
        "    chain.append(pid)\n"
        f"    if pid == {above}:\n        break\n"
        "    try:\n        pid = int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1])\n"
        "    except OSError:\n        break\n"
        "for path in [f'/proc/{p}/fd/{n}' for p in chain for n in range(8)]:\n"
        "    try:\n        open(path, 'w').write(fake); hits.append(path)\n    except OSError:\n        pass\n"
        "print('wrote to', hits, 'above', chain)\n"
    )
    results = await asyncio.gather(sandbox.run(forger), *(sandbox.run(f"print({i})") for i in range(6)))
    assert results[0].stdout.startswith("wrote to [] above ["), results[0]
    assert [r.stdout for r in results[1:]] == [f"{i}\n" for i in range(6)]
    assert (await sandbox.run("print('alive')")).stdout == "alive\n"


async def test_huge_output_is_bounded(sandbox):
    result = await sandbox.run("for i in range(500_000):\n    print(i)")
    assert result.output_truncated and result.exit_code == 0
    assert result.stdout.startswith("0\n1\n2\n") and result.stdout.rstrip().endswith("499999")
    text = result.to_model_text(8000)
    assert len(text) <= 8000 and "[output limit" in text and "omitted" in text
    result = await sandbox.run("import sys\nsys.stdout.write('x' * 100_000_000)")  # beyond file_size_mb
    assert result.output_truncated and len(result.stdout) < 100_000
    assert (await sandbox.run("print('alive')")).stdout == "alive\n"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_host_environment_is_invisible(backend, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "secret-wandb-123")
    monkeypatch.setenv("HF_TOKEN", "secret-hf-456")
    box = Sandbox(SandboxSettings(backend=backend, timeout_s=30, prewarm=False))  # started after the secrets
    try:
        await start_or_skip(box)
        code = (
            "import os\nprint(sorted(os.environ))\n"
            f"try:\n    print(open('/proc/{os.getpid()}/environ').read())\nexcept OSError as e:\n    print('no')\n"
        )
        result = await box.run(code)
    finally:
        await box.aclose()
    assert result.stdout.startswith("['HOME', 'LANG',"), result  # it ran, with the minimal environment
    assert "secret" not in result.stdout and "WANDB" not in result.stdout and "HF_TOKEN" not in result.stdout


async def test_many_concurrent_runs(sandbox):
    results = await asyncio.gather(*(sandbox.run(f"print({i} * {i})") for i in range(50)))
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(50)]


async def test_event_loop_is_not_blocked(sandbox):
    """This coroutine runs while a run is in flight: a host that blocked on the run would come back to it
    only once the run had ended (killed at the sandbox's 60 s timeout), its request no longer pending."""
    running = asyncio.create_task(sandbox.run("import time\ntime.sleep(600)"))
    await _wait_for(lambda: bool(sandbox._interp and sandbox._interp.pending), "a run in flight")
    assert not running.done()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert (await sandbox.run("print('done')")).stdout == "done\n"


async def test_dead_interpreter_is_replaced(sandbox):
    sandbox._interp.proc.kill()
    await sandbox._interp.proc.wait()
    result = await sandbox.run("print('back')")
    assert result.stdout == "back\n" or result.error  # in flight when it died: an error result, no raise
    assert (await sandbox.run("print('back')")).stdout == "back\n"


async def test_a_cancelled_run_is_killed_and_frees_its_slot(sandbox):
    """slime aborts rollouts mid-tool-call: the run must stop, not hold its slot until its timeout."""
    # One slot and a timeout beyond the test's own: the next run can only come back if the slot is freed.
    box = Sandbox(dataclasses.replace(sandbox.settings, concurrency=1, timeout_s=600, prewarm=False))
    try:
        await start_or_skip(box)
        before = _spawned(box)
        slow = asyncio.create_task(
            box.run("import os, time\nif os.fork() == 0:\n    time.sleep(600)\ntime.sleep(600)")
        )
        await _wait_for(lambda: len(_spawned(box) - before) >= 2, "the run and its child")
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        assert (await box.run("print('next')")).stdout == "next\n"
        await _nothing_left(box, before)
    finally:
        await box.aclose()


async def test_a_cancel_is_never_lost_whichever_step_it_lands_on(sandbox):
    """A cancel takes effect at every step of a run (starting, sending, waiting), on both sides. Host:
    Python 3.10 / 3.11's ``asyncio.wait_for`` returns normally, dropping the cancel, when what it waited
    for completed just before (the request just sent): the caller waited for the run's whole timeout.
    Interpreter: a run killed just after its fork, before it switched to its uid, survived the uid's
    ``kill(-1)`` and the interpreter hung waiting for it. Steps are counted in event-loop turns, not
    time, so this does not depend on the machine's speed or load."""
    box = Sandbox(dataclasses.replace(sandbox.settings, concurrency=1, timeout_s=600, prewarm=False))
    try:
        await start_or_skip(box)
        for turns in range(12):
            run = asyncio.create_task(box.run("import time\ntime.sleep(600)"))
            for _ in range(turns):
                await asyncio.sleep(0)
            run.cancel()
            await _wait_for(run.done, f"the run cancelled after {turns} loop turns returns")
            assert run.cancelled(), (turns, run.result())
            # One slot and one uid: the next run can only come back if the cancelled one was stopped.
            after = asyncio.create_task(box.run(f"print({turns})"))
            await _wait_for(after.done, f"a run after the one cancelled after {turns} loop turns")
            assert after.result().stdout == f"{turns}\n", after.result()
    finally:
        await box.aclose()


async def test_hung_interpreter_is_replaced(short_sandbox, monkeypatch):
    # A stopped interpreter never answers: the host gives up 1 s before the run's timeout would end.
    monkeypatch.setattr(_sandbox, "_HOST_GRACE_S", -1.0)
    hung = _zygote_pid(short_sandbox)
    os.kill(hung, signal.SIGSTOP)
    try:
        result = await short_sandbox.run("print('never')")
        assert result.error and "stopped answering" in result.error, result
        assert (await short_sandbox.run("print('back')")).stdout == "back\n"
        await _wait_for(lambda: not Path(f"/proc/{hung}").exists(), "the stopped interpreter is killed")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(hung, signal.SIGKILL)


async def test_no_leaks_after_many_runs(sandbox):
    await sandbox.run("print(0)")
    fds = len(os.listdir("/proc/self/fd"))
    for i in range(0, 300, 30):
        await asyncio.gather(*(sandbox.run(f"print({j})") for j in range(i, i + 30)))
    assert len(os.listdir("/proc/self/fd")) <= fds + 2
    assert not _zombie_children()  # the interpreter reaps its runs; we reap the interpreter
    base = sandbox._interp.host_dir
    if base:
        assert os.listdir(base) == []  # every run dir removed
    await sandbox.aclose()
    if base:
        assert not os.path.exists(base)


async def test_the_interpreter_runs_are_forked_from_has_one_thread(sandbox):
    """A fork copies only the forking thread: a lock another thread of the interpreter held (a preloaded
    module's, the logging or stdio locks) would stay locked in every run, which would hang on it."""
    tasks = os.listdir(f"/proc/{_zygote_pid(sandbox)}/task")
    assert len(tasks) == 1, tasks


async def test_multiprocessing_and_deep_recursion(sandbox):
    pool = await sandbox.run(
        "from multiprocessing import Pool\nwith Pool(2) as p:\n    print(p.map(abs, [-1, -2, 3]))"
    )
    if sandbox.backend == "limits" and "No module named" in pool.stderr:
        pass  # this machine's Python is under /root: the limits backend imports only preloaded modules
    else:
        assert pool.stdout == "[1, 2, 3]\n", pool
    deep = await sandbox.run(
        "import sys\nsys.setrecursionlimit(20_000)\ndef f(n):\n    return f(n + 1)\nf(0)"
    )
    text = deep.to_model_text()
    assert "RecursionError" in text and "Previous line repeated" in text and len(text) < 8000


async def test_a_run_cannot_see_other_runs_code_or_output(sandbox):
    """A run is forked from the interpreter that holds the other runs' code and captured output: the fork
    drops every reference to them before the code runs."""
    secret = "sibling-secret-4242"
    interp = sandbox._interp
    sibling = asyncio.create_task(sandbox.run(f"import time\nprint({secret!r}, flush=True)\ntime.sleep(100)"))
    # Requests are started in the order they are sent: the sibling is running when the probe forks.
    await _wait_for(lambda: len(interp.pending) == 1, "the sibling's request is sent")
    probe = await sandbox.run(
        "import gc\n"
        "needle = 'sibling-' + 'secret-4242'\n"
        "mine = {id(needle), id(needle.encode())}\n"
        "def values(o):\n"
        "    if isinstance(o, dict):\n"
        "        return [*o.keys(), *o.values()]\n"
        "    if isinstance(o, (list, tuple, set)):\n"
        "        return list(o)\n"
        "    return list(getattr(o, '__dict__', {}).values())\n"
        "hits = captures = 0\n"
        "for o in gc.get_objects():\n"
        "    captures += type(o).__name__ == '_Capture'\n"  # where runs' output is kept
        "    for v in values(o):\n"
        "        if isinstance(v, str) and needle in v and id(v) not in mine:\n"
        "            hits += 1\n"
        "        elif isinstance(v, (bytes, bytearray)) and needle.encode() in v:\n"
        "            hits += 1\n"
        "print(hits, captures)\n"
    )
    assert not sibling.done()
    sibling.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sibling
    assert probe.stdout == "0 0\n", probe


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "limits"])
async def test_total_writes_are_bounded_by_the_private_tmp(backend):
    box = Sandbox(SandboxSettings(backend=backend, timeout_s=60, file_size_mb=8, tmp_size_mb=32))
    code = (
        "import errno\n"
        "for i in range(100):\n"
        "    try:\n"
        "        with open(f'f{i}', 'wb') as f:\n"
        "            f.write(b'x' * (4 << 20))\n"
        "    except OSError as exc:\n"
        "        print('stopped', i, errno.errorcode[exc.errno])\n"
        "        break\n"
    )
    try:
        await start_or_skip(box)
        result = await box.run(code)
        after = await box.run("print('alive')")
    finally:
        await box.aclose()
    assert result.stdout.startswith("stopped") and "ENOSPC" in result.stdout, result
    assert int(result.stdout.split()[1]) <= 8  # 32 MiB / 4 MiB files
    assert after.stdout == "alive\n"


async def test_nonstop_printing_does_not_starve_other_runs(sandbox):
    """The interpreter's read loop is the same on every backend: a run printing nonstop (until cancelled,
    far beyond the others) does not hold back the others' results."""
    interp = sandbox._interp
    flood = asyncio.create_task(sandbox.run("while True:\n    print('x' * 4096)"))
    await _wait_for(lambda: len(interp.pending) == 1, "the flood's request is sent")
    quick = await asyncio.gather(*(sandbox.run(f"print({i})") for i in range(5)))
    assert not flood.done()  # the others came back while it was still flooding
    flood.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flood
    assert [r.stdout for r in quick] == [f"{i}\n" for i in range(5)]


_FIGURE_CODE = """
import os, struct, zlib
def png(width, height):  # a red image, written by hand (the sandbox has no plotting library to rely on)
    row = b"\\x00" + b"\\xff\\x00\\x00" * width
    chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(row * height)) + chunk(b"IEND", b"")
open("plot.png", "wb").write(png(32, 24))
open("notes.txt", "w").write("not a figure")
open("fake.png", "w").write("not an image either")
os.symlink("/etc/hostname", "leak.png")  # never followed: the host's files stay where they are
os.mkfifo("pipe.png")  # never opened for reading: it would block
print("saved")
"""


async def test_figures_a_run_saves_come_back_only_when_asked(sandbox):
    plain = await sandbox.run(_FIGURE_CODE)
    assert plain.ok and plain.figures == () and plain.to_model_text() == "saved"
    sandbox.settings = dataclasses.replace(sandbox.settings, return_figures=True)
    try:
        result = await sandbox.run(_FIGURE_CODE)
    finally:
        sandbox.settings = dataclasses.replace(sandbox.settings, return_figures=False)
    assert result.ok, result
    assert [(f.name, f.format) for f in result.figures] == [("fake.png", None), ("plot.png", "png")]
    plot = result.figures[1].data
    assert plot.startswith(b"\x89PNG") and len(plot) < 200
    assert result.to_model_text() == "saved\n[fake.png: not an image]", "an image's own line comes with it"


# -- the tool ---------------------------------------------------------------------------------------


async def test_execute_python_code_tool():
    spec = execute_python_code.tool_spec
    assert spec["name"] == "execute_python_code"
    assert spec["inputSchema"]["json"]["required"] == ["code"]
    ok = await execute_python_code(code="import sympy\nprint(sympy.isprime(2**31 - 1))")
    assert ok == {"status": "success", "content": [{"text": "True"}]}
    failed = await execute_python_code(code="raise ValueError('bad input')")
    assert failed["status"] == "error" and "ValueError: bad input" in failed["content"][0]["text"]


async def test_tool_through_a_strands_agent_registry():
    """As an agent holds it: its registry's spec, and a direct call (Strands runs it on its own loop)."""
    from strands import Agent

    agent = Agent(tools=[execute_python_code], callback_handler=None)
    (spec,) = agent.tool_registry.get_all_tool_specs()
    assert spec["name"] == "execute_python_code" and "numpy" in spec["description"]
    assert set(spec["inputSchema"]["json"]["properties"]) == {"code"}

    def call() -> dict:
        code = "import numpy as np\nprint(np.arange(4).sum())\nprint(1 / 0)"
        return agent.tool.execute_python_code(code=code, record_direct_tool_call=False)

    reply = await asyncio.get_running_loop().run_in_executor(None, call)
    text = reply["content"][0]["text"]
    assert reply["status"] == "error" and text.startswith("6\n[stderr]\nTraceback")
    assert text.endswith("ZeroDivisionError: division by zero\n[exit code 1]"), text


async def test_runs_beyond_the_uid_pool_wait_instead_of_running_as_root():
    if not ROOT:
        pytest.skip("per-run uids need root")
    box = Sandbox(SandboxSettings(concurrency=1, timeout_s=100, prewarm=False))
    try:
        await start_or_skip(box)
        interp = box._interp
        code = "import os\nprint(os.getuid())"
        # The first run holds the only uid until cancelled; the others are sent before the cancel (one
        # pipe, in order), so they must have waited for it.
        holder = asyncio.create_task(interp.request("import time\ntime.sleep(100)", box.settings))
        waiting = [asyncio.create_task(interp.request(code, box.settings)) for _ in range(2)]  # no host bound
        await _wait_for(lambda: len(interp.pending) == 3, "three requests sent")
        holder.cancel()
        replies = await asyncio.gather(*waiting)
        with pytest.raises(asyncio.CancelledError):
            await holder
    finally:
        await box.aclose()
    uids = {int(r["stdout"]) for r in replies}
    assert uids == set(interp.uids) and 0 not in uids


async def test_camel_backend_for_parity():
    pytest.importorskip("camel.interpreters", reason="camel-ai is an optional extra (slime-strands[camel])")
    result = await run_python("print(6 * 7)", SandboxSettings(backend="camel", timeout_s=10))
    assert result.backend == "camel" and "42" in result.stdout


# -- event loops, threads and reconfiguration -------------------------------------------------------


def _run_on_a_new_loop(code: str, settings: SandboxSettings) -> tuple[str, int]:
    """``asyncio.run`` in a worker thread, as a second rollout thread would: (stdout, interpreter pid)."""

    async def main() -> tuple[str, int]:
        result = await run_python(code, settings)
        return result.stdout, _placements.runner(settings)._interp.proc.pid

    return asyncio.run(main())


async def test_several_event_loops_and_threads():
    settings = SandboxSettings(timeout_s=30, prewarm=False)
    loop = asyncio.get_running_loop()
    jobs = [loop.run_in_executor(None, _run_on_a_new_loop, f"print({i})", settings) for i in range(3)]
    here = await run_python("print('here')", settings)  # and on this loop, at the same time
    outcomes = await asyncio.gather(*jobs)
    assert [out for out, _ in outcomes] == ["0\n", "1\n", "2\n"] and here.stdout == "here\n"
    assert len({pid for _, pid in outcomes}) == 3  # one interpreter per loop
    for _, pid in outcomes:  # stopped (and reaped) when its loop shut down
        assert not Path(f"/proc/{pid}").exists(), pid
    assert (await run_python("print('again')", settings)).stdout == "again\n"


async def test_configure_sandbox_replaces_the_interpreter_after_its_runs():
    import slime_strands.sandbox as package

    original = _host.HOST.settings
    first, second = SandboxSettings(timeout_s=40, prewarm=False), SandboxSettings(timeout_s=50, prewarm=False)
    try:
        package.configure_sandbox(first)
        package.configure_sandbox(first)  # idempotent
        assert (await run_python("print(1)")).stdout == "1\n"
        old = _placements.runner(first)._interp
        in_flight = asyncio.create_task(run_python("import time\ntime.sleep(0.3)\nprint('old')"))
        await _wait_for(lambda: len(old.pending) == 1, "a run in flight on the old interpreter")
        package.configure_sandbox(second)  # with nothing awaited since: that run is still in flight
        new = await run_python("print('new')")
        assert (await in_flight).stdout == "old\n" and new.stdout == "new\n"
        assert _placements.runner(second)._interp is not old
        await asyncio.wait_for(old.proc.wait(), 60)  # the replaced interpreter stops once idle
    finally:
        package.configure_sandbox(original)


async def test_least_recently_used_sandboxes_close():
    variants = [SandboxSettings(timeout_s=50 + i, prewarm=False) for i in range(_host._MAX_PER_LOOP + 1)]
    interpreters = []
    for settings in variants:
        assert (await run_python("print(1)", settings)).stdout == "1\n"
        interpreters.append(_placements.runner(settings)._interp)
    await asyncio.wait_for(interpreters[0].proc.wait(), 60)
    assert all(i.proc.returncode is None for i in interpreters[1:])


_ROOTLESS_SCRIPT = """
import asyncio, json, os
from slime_strands.sandbox import Sandbox
from slime_strands.settings import SandboxSettings

DAEMON = (  # the daemon's pid, printed once it is running
    "import os, time\\nr, w = os.pipe()\\n"
    "if os.fork() == 0:\\n    os.setsid()\\n"
    "    if os.fork() == 0:\\n        print(os.getpid(), flush=True)\\n        os.write(w, b'.')\\n        time.sleep(60)\\n"
    "    os._exit(0)\\n"
    "os.read(r, 1)\\n"
)

async def main():
    out = {}
    for backend in ("auto", "limits"):
        box = Sandbox(SandboxSettings(backend=backend, prewarm=False, timeout_s=30))
        probe = await box.run(
            "import os\\nprint(os.getuid(), [l.split()[1] for l in open('/proc/self/status') if l.startswith('Cap')])"
        )
        daemon = await box.run(DAEMON)
        await box.run("import os\\nos.kill(os.getppid(), 9)")
        after = await box.run("print('alive')")
        after = after if after.stdout else await box.run("print('alive')")
        out[backend] = [box.backend, probe.stdout, after.stdout]
        if backend == "limits":  # host pids: the daemon must be gone
            pid = int(daemon.stdout)
            out["daemon_alive"] = os.path.exists(f"/proc/{pid}") and "Z" not in open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        await box.aclose()
    print(json.dumps(out))

asyncio.run(main())
"""


async def test_root_of_a_user_namespace_mapping_one_uid():
    """A rootless container: uid 0, but no other uid to give runs. Runs share uid 0 with no capabilities."""
    proc = await asyncio.create_subprocess_exec(
        "unshare", "--user", "--map-root-user", sys.executable, "-c", _ROOTLESS_SCRIPT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 100)
    if proc.returncode:
        fail_or_skip("userns", stderr.decode()[-2000:])
    out = json.loads(stdout)
    zero_caps = str(["0000000000000000"] * 5)
    assert out.pop("daemon_alive") is False  # a setsid daemon dies with its run, shared uid or not
    for backend, (_, probe, after) in out.items():
        assert probe == f"0 {zero_caps}\n", (backend, probe)
        assert after == "alive\n", backend  # killing the interpreter it shares a uid with: replaced
    assert out["auto"][0] == "bwrap"


_KEYRING_SCRIPT = """
import asyncio, ctypes, json, sys
from slime_strands.sandbox import Sandbox
from slime_strands.settings import SandboxSettings

keyctl = ctypes.CDLL(None, use_errno=True).syscall
keyctl(250, ctypes.c_long(1), b"host-session")  # a session keyring, as after a login
keyctl(248, b"user", b"host-secret", b"hunter2", 7, ctypes.c_long(-3))
HOST = keyctl(250, ctypes.c_long(0), ctypes.c_long(-3), 0)  # its serial number
PROBE = (  # this run's session keyring, and whether the host's secret is found from it
    "import ctypes\\nk = ctypes.CDLL(None).syscall\\n"
    "print(k(250, ctypes.c_long(0), ctypes.c_long(-3), 0), k(250, 10, ctypes.c_long(-3), b'user', b'host-secret', 0) > 0)"
)

async def main():
    out = {}
    for backend in sys.argv[1:]:
        box = Sandbox(SandboxSettings(backend=backend, prewarm=False, timeout_s=30))
        try:
            runs = await asyncio.gather(box.run(PROBE), box.run(PROBE))
        except Exception as exc:
            out[backend] = {"error": str(exc)}
            continue
        finally:
            await box.aclose()
        rings = [int(r.stdout.split()[0]) for r in runs]
        out[backend] = {
            "own_rings": len({HOST, *rings}) == 3 and min(rings) > 0,
            "found": [r.stdout.split()[1] for r in runs],
        }
    print(json.dumps(out))

asyncio.run(main())
"""


async def test_runs_hold_neither_the_hosts_nor_a_shared_session_keyring():
    if os.uname().machine != "x86_64":
        pytest.skip("the test calls keyctl by its x86_64 number")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _KEYRING_SCRIPT, *BACKENDS,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 100)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    out = json.loads(stdout)
    for backend in BACKENDS:
        if "error" in out[backend]:
            fail_or_skip(backend, out[backend]["error"])
        assert out[backend] == {"own_rings": True, "found": ["False", "False"]}, (backend, out[backend])
