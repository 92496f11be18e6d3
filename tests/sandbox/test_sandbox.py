"""The sandbox against hostile code, on every backend this machine has; plus normal use and the tool.

Containment differs by backend and the tests say so: ``bwrap`` hides host files and the network,
``unshare`` hides the network (host files stay readable where world-readable), ``limits`` isolates by
uid and rlimits only. Whatever the backend, the caller keeps working and nothing outlives a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
import pytest_asyncio

from slime_strands.sandbox import Sandbox, _sandbox, execute_python_code, run_python
from slime_strands.sandbox._backends import command
from slime_strands.settings import SandboxSettings

# One event loop for the module: each backend's warm interpreter then starts once, not once per test.
pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

ROOT = os.geteuid() == 0
PROJECT_FILE = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _backend_params():
    params = []
    for backend in ("bwrap", "unshare", "limits"):
        missing = command(backend, root=ROOT) is None
        marks = [pytest.mark.skipif(missing, reason=f"{backend} is not installed (CI installs bubblewrap)")]
        params.append(pytest.param(backend, marks=marks, id=backend))
    return params


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=_backend_params())
async def shared_sandbox(request):
    box = Sandbox(SandboxSettings(backend=request.param, timeout_s=1.5, cpu_seconds=5, memory_mb=512))
    yield box
    await box.aclose()


@pytest_asyncio.fixture(loop_scope="module")
async def sandbox(shared_sandbox):
    """The backend's sandbox with a live interpreter (a test before may have killed or closed it)."""
    first = await shared_sandbox.run("print('ready')")
    if first.error and shared_sandbox.settings.backend != "limits":
        pytest.skip(f"{shared_sandbox.settings.backend} cannot create namespaces here: {first.error}")
    assert first.stdout == "ready\n", first
    return shared_sandbox


def _uid_processes(uids) -> list[int]:
    """Host pids owned by the sandbox's run uids (the host sees every namespace's processes)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        real_uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        if real_uid in uids:
            found.append(int(entry.name))
    return found


def _zombie_children() -> list[int]:
    zombies = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            zombies.append(int(entry.name))
    return zombies


async def _nothing_left(box: Sandbox) -> None:
    uids = set(box._interp.uids)
    assert uids or not ROOT
    for _ in range(50):
        if not _uid_processes(uids):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"processes of run uids survived: {_uid_processes(uids)}")


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
    code = (
        "import os\n"
        f"for path in ['/etc/shadow', '/root/.bashrc', {str(PROJECT_FILE)!r}]:\n"
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
    assert "/etc/shadow READ" not in out and "/root/.bashrc READ" not in out
    if ROOT:  # the host's /root is hidden or unreadable (at most the Python it holds is visible)
        visible = {"PermissionError", "FileNotFoundError", "[]", "['.pyenv']"}
        assert any(f"/root {v}" in out for v in visible), out
    if sandbox.backend in ("bwrap", "unshare") and ROOT:  # the project is not even mounted
        assert f"{PROJECT_FILE} FileNotFoundError" in out, out


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
    limits = [(5, 6), *((v, v) for v in (512 * mib, 16 * mib, 32, 1024, 0, 0))]
    assert lines[0] == str(limits), lines
    if ROOT:
        assert lines[1] == "True True []", lines
    assert lines[2] == "['0000000000000000', '1']", lines


async def test_writes_outside_the_run_dir(sandbox):
    targets = ["/usr/pwned", "/etc/pwned", str(PROJECT_FILE.parent / "pwned")]
    if sandbox.backend != "limits":
        targets.append("/tmp/pwned")  # private /tmp: runs may only write their own directory
    code = "import os\n" + "".join(
        f"try:\n    open({t!r}, 'w').write('x'); print('WROTE', {t!r})\nexcept OSError as e:\n    print('denied')\n"
        for t in targets
    )
    result = await sandbox.run(code)
    assert "WROTE" not in result.stdout and result.stdout.count("denied") == len(targets), result
    assert not (PROJECT_FILE.parent / "pwned").exists() and not Path("/usr/pwned").exists()


async def test_network(sandbox):
    if sandbox.backend == "limits":
        pytest.skip("the limits-only backend has no network namespace (documented)")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        code = (
            "import socket\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1); print('CONNECTED')\n"
            "except OSError as exc:\n    print('blocked', type(exc).__name__)\n"
            "try:\n    socket.getaddrinfo('pypi.org', 443); print('RESOLVED')\n"
            "except OSError as exc:\n    print('blocked', type(exc).__name__)\n"
        )
        result = await sandbox.run(code)
    finally:
        listener.close()
    assert result.stdout.count("blocked") == 2, result


async def test_fork_bomb(sandbox):
    if not ROOT and sandbox.backend == "limits":
        pytest.skip("without root there is no per-run uid or pid namespace to bound a fork bomb")
    started = time.monotonic()
    result = await sandbox.run(
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    )
    assert result.timed_out and time.monotonic() - started < 10
    await _nothing_left(sandbox)
    assert (await sandbox.run("print('alive')")).stdout == "alive\n"
    if ROOT:  # max_processes (32) binds: RLIMIT_NPROC of the run's own uid
        result = await sandbox.run(
            "import os, time\nstarted = 0\nfor _ in range(40):\n    try:\n"
            "        if os.fork() == 0:\n            time.sleep(0.5)\n            os._exit(0)\n"
            "        started += 1\n    except OSError:\n        pass\nprint(started)"
        )
        assert 20 <= int(result.stdout) < 32, result


async def test_memory_bomb(sandbox):
    result = await sandbox.run("x = bytearray(4 * 1024**3)")
    assert result.memory_exceeded and "[memory limit exceeded (512 MiB)]" in result.to_model_text()
    result = await sandbox.run("chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024**2))")
    assert result.memory_exceeded, result
    assert (await sandbox.run("print('alive')")).stdout == "alive\n"


async def test_infinite_loop_and_cpu_limit(sandbox):
    loop = "while True:\n    pass"
    stubborn = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n" + loop
    tight = SandboxSettings(backend=sandbox.settings.backend, timeout_s=10, cpu_seconds=1, prewarm=False)
    started = time.monotonic()
    result, cpu, killed = await asyncio.gather(  # at once: the whole test takes one timeout
        sandbox.run(loop), run_python(loop, tight), run_python(stubborn, tight)
    )
    elapsed = time.monotonic() - started
    assert result.timed_out and result.exit_code is None and 1.4 < elapsed < 6
    assert "[timeout: killed after 1.5 s]" in result.to_model_text()
    assert not cpu.timed_out  # CPU seconds ran out before the 10 s wall clock
    assert cpu.to_model_text() == "[killed by SIGXCPU: CPU time limit]", cpu
    # Ignoring SIGXCPU: SIGKILL at the hard limit, a second later.
    assert not killed.timed_out and killed.to_model_text() == "[killed by SIGKILL]"


async def test_background_child_and_escapes_die_with_the_run(sandbox):
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"  # a background child
        "    time.sleep(60)\n"
        "if os.fork() == 0:\n"  # setsid + double fork: a daemon
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "print('spawned')\n"
    )
    result = await sandbox.run(code)
    assert result.stdout == "spawned\n"
    await _nothing_left(sandbox)
    result = await sandbox.run(code.replace("print('spawned')\n", "time.sleep(60)\n"))  # and on timeout
    assert result.timed_out
    await _nothing_left(sandbox)


async def test_killing_the_parent_does_not_break_the_sandbox(sandbox):
    pid = sandbox._interp.proc.pid
    code = (
        "import os, signal\n"
        "for target in (os.getppid(), 1, -1):\n"
        "    try:\n        os.kill(target, signal.SIGKILL)\n    except OSError as exc:\n        print(type(exc).__name__)\n"
    )
    await sandbox.run(code)
    assert (await sandbox.run("print('alive')")).stdout == "alive\n"
    if ROOT:  # its own uid cannot signal the interpreter: the same one still serves
        assert sandbox._interp.proc.pid == pid


async def test_a_run_cannot_forge_results(sandbox):
    """Fake reply lines written to every fd and to the interpreter's own fds reach no other run."""
    forger = (
        "import json, os\n"
        "fake = ''.join(json.dumps({'id': i, 'stdout': 'FORGED', 'exit_code': 0}) + '\\n' for i in range(10**4))\n"
        "hits = []\n"
        "for fd in range(3, 256):\n"
        "    try:\n        os.write(fd, fake.encode()); hits.append(fd)\n    except OSError:\n        pass\n"
        "for path in [f'/proc/{os.getppid()}/fd/{n}' for n in range(8)]:\n"
        "    try:\n        open(path, 'w').write(fake); hits.append(path)\n    except OSError:\n        pass\n"
        "print('wrote to', hits)\n"
    )
    results = await asyncio.gather(sandbox.run(forger), *(sandbox.run(f"print({i})") for i in range(6)))
    assert results[0].stdout == "wrote to []\n", results[0]
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


@pytest.mark.parametrize("backend", _backend_params())
async def test_host_environment_is_invisible(backend, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "secret-wandb-123")
    monkeypatch.setenv("HF_TOKEN", "secret-hf-456")
    box = Sandbox(SandboxSettings(backend=backend, timeout_s=3, prewarm=False))  # started after the secrets
    try:
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
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    await sandbox.run("import time\ntime.sleep(0.5)")
    task.cancel()
    assert ticks > 25


async def test_dead_interpreter_is_replaced(sandbox):
    sandbox._interp.proc.kill()
    await sandbox._interp.proc.wait()
    result = await sandbox.run("print('back')")
    assert result.stdout == "back\n" or result.error  # in flight when it died: an error result, no raise
    assert (await sandbox.run("print('back')")).stdout == "back\n"


async def test_a_cancelled_run_is_killed_and_frees_its_slot():
    """slime aborts rollouts mid-tool-call: the run must stop, not hold its slot until its timeout."""
    box = Sandbox(SandboxSettings(concurrency=1, timeout_s=30, prewarm=False))
    try:
        await box.run("print(1)")
        uids = set(box._interp.uids)
        slow = asyncio.create_task(
            box.run("import os, time\nif os.fork() == 0:\n    time.sleep(60)\ntime.sleep(60)")
        )
        await asyncio.sleep(0.5)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        started = time.monotonic()
        assert (await box.run("print('next')")).stdout == "next\n"
        assert time.monotonic() - started < 5  # not after the cancelled run's 30 s timeout
        if ROOT:
            assert not _uid_processes(uids)
    finally:
        await box.aclose()


def _zygote_pid(box: Sandbox) -> int:
    """Host pid of the warm interpreter: the outermost descendant of the started process running Python."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    level, found = [box._interp.proc.pid], []
    while level and not found:
        level = [pid for pid, parent in parents.items() if parent in level]
        for pid in level:
            with contextlib.suppress(OSError):
                if (Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:1]) == [sys.executable.encode()]:
                    found.append(pid)
    assert len(found) == 1, found
    return found[0]


async def test_hung_interpreter_is_replaced(sandbox, monkeypatch):
    monkeypatch.setattr(_sandbox, "_HOST_GRACE_S", -1.0)  # give up 0.5 s after sending (1.5 s timeout)
    hung = _zygote_pid(sandbox)
    os.kill(hung, signal.SIGSTOP)
    try:
        result = await sandbox.run("print('never')")
        assert result.error and "stopped answering" in result.error, result
        assert (await sandbox.run("print('back')")).stdout == "back\n"
        for _ in range(100):  # the stopped one was killed, not left behind
            if not Path(f"/proc/{hung}").exists():
                break
            await asyncio.sleep(0.05)
        assert not Path(f"/proc/{hung}").exists()
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


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
async def test_auto_prefers_bwrap():
    result = await run_python("print(1)", SandboxSettings(backend="auto"))
    assert result.backend == "bwrap" or result.error is None


@pytest.mark.skipif(not ROOT, reason="per-run uids need root")
async def test_runs_beyond_the_uid_pool_wait_instead_of_running_as_root():
    box = Sandbox(SandboxSettings(concurrency=1, timeout_s=5))
    try:
        await box.run("print(1)")
        interp = box._interp
        code = "import os, time\ntime.sleep(0.2)\nprint(os.getuid())"
        replies = await asyncio.gather(
            *(interp.request(code, box.settings) for _ in range(3))
        )  # no host bound
    finally:
        await box.aclose()
    uids = {int(r["stdout"]) for r in replies}
    assert uids == set(interp.uids) and 0 not in uids


async def test_camel_backend_for_parity():
    pytest.importorskip("camel.interpreters", reason="camel-ai is an optional extra (slime-strands[camel])")
    result = await run_python("print(6 * 7)", SandboxSettings(backend="camel", timeout_s=10))
    assert result.backend == "camel" and "42" in result.stdout


async def test_refused_namespaces_fall_back_with_the_reason(tmp_path, monkeypatch, caplog):
    """Like bwrap in an unprivileged container: auto moves on; an explicit bwrap says why it cannot run."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(_sandbox, "_working_backend", {})
    explicit = await run_python("print(1)", SandboxSettings(backend="bwrap", timeout_s=3))
    assert explicit.error and "No permissions to create new namespace" in explicit.error
    box = Sandbox(SandboxSettings(backend="auto", timeout_s=3))
    try:
        result = await box.run("print(1)")
    finally:
        await box.aclose()
    assert result.stdout == "1\n" and result.backend in ("unshare", "limits")


@pytest.mark.parametrize("backend", [p for p in _backend_params() if p.values[0] != "limits"])
async def test_total_writes_are_bounded_by_the_private_tmp(backend):
    box = Sandbox(SandboxSettings(backend=backend, timeout_s=10, file_size_mb=8, tmp_size_mb=32))
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
        result = await box.run(code)
        after = await box.run("print('alive')")
    finally:
        await box.aclose()
    if result.error and "namespace" in result.error:
        pytest.skip(result.error)
    assert result.stdout.startswith("stopped") and "ENOSPC" in result.stdout, result
    assert int(result.stdout.split()[1]) <= 8  # 32 MiB / 4 MiB files
    assert after.stdout == "alive\n"


async def test_nonstop_printing_does_not_starve_other_runs():
    """The interpreter's read loop is the same on every backend: checked once, on the best one."""
    box = Sandbox(SandboxSettings(timeout_s=3.0))
    try:
        flood = asyncio.create_task(box.run("while True:\n    print('x' * 4096)"))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        quick = await asyncio.gather(*(box.run(f"print({i})") for i in range(5)))
        waited = time.monotonic() - started
        flooded = await flood
    finally:
        await box.aclose()
    assert [r.stdout for r in quick] == [f"{i}\n" for i in range(5)]
    assert waited < 2.0, waited  # a starved interpreter answers only after the flood's 3 s timeout
    assert flooded.timed_out and flooded.output_truncated and len(flooded.stdout) < 100_000


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
    secret = "sibling-secret-4242"
    sibling = asyncio.create_task(sandbox.run(f"import time\nprint({secret!r}, flush=True)\ntime.sleep(0.6)"))
    await asyncio.sleep(0.2)  # the sibling is running: its code and output are in the interpreter
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
        "hits = 0\n"
        "for o in gc.get_objects():\n"
        "    for v in values(o):\n"
        "        if isinstance(v, str) and needle in v and id(v) not in mine:\n"
        "            hits += 1\n"
        "        elif isinstance(v, (bytes, bytearray)) and needle.encode() in v:\n"
        "            hits += 1\n"
        "print(hits)\n"
    )
    assert (await sibling).stdout.strip() == secret
    assert probe.stdout.strip() == "0", probe


# -- event loops, threads and reconfiguration -------------------------------------------------------


def _run_on_a_new_loop(code: str, settings: SandboxSettings) -> tuple[str, int]:
    """``asyncio.run`` in a worker thread, as a second rollout thread would: (stdout, interpreter pid)."""

    async def main() -> tuple[str, int]:
        result = await run_python(code, settings)
        return result.stdout, _sandbox.get_sandbox(settings)._interp.proc.pid

    return asyncio.run(main())


async def test_several_event_loops_and_threads():
    settings = SandboxSettings(timeout_s=5, prewarm=False)
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

    original = package._settings
    first, second = SandboxSettings(timeout_s=4, prewarm=False), SandboxSettings(timeout_s=5, prewarm=False)
    try:
        package.configure_sandbox(first)
        package.configure_sandbox(first)  # idempotent
        assert (await run_python("print(1)")).stdout == "1\n"
        old = _sandbox.get_sandbox(first)._interp
        in_flight = asyncio.create_task(run_python("import time\ntime.sleep(0.5)\nprint('old')"))
        await asyncio.sleep(0.2)
        package.configure_sandbox(second)
        new = await run_python("print('new')")
        assert (await in_flight).stdout == "old\n" and new.stdout == "new\n"
        assert _sandbox.get_sandbox(second)._interp is not old
        for _ in range(100):
            if old.proc.returncode is not None:
                break
            await asyncio.sleep(0.02)
        assert old.proc.returncode is not None  # the replaced interpreter stopped once idle
    finally:
        package.configure_sandbox(original)


async def test_least_recently_used_sandboxes_close():
    variants = [SandboxSettings(timeout_s=5 + i, prewarm=False) for i in range(_sandbox._MAX_PER_LOOP + 1)]
    interpreters = []
    for settings in variants:
        assert (await run_python("print(1)", settings)).stdout == "1\n"
        interpreters.append(_sandbox.get_sandbox(settings)._interp)
    for _ in range(100):
        if interpreters[0].proc.returncode is not None:
            break
        await asyncio.sleep(0.02)
    assert interpreters[0].proc.returncode is not None
    assert all(i.proc.returncode is None for i in interpreters[1:])


_ROOTLESS_SCRIPT = """
import asyncio, json, os
from slime_strands.sandbox import Sandbox
from slime_strands.settings import SandboxSettings

DAEMON = (
    "import os, time\\n"
    "if os.fork() == 0:\\n    os.setsid()\\n"
    "    if os.fork() == 0:\\n        print(os.getpid(), flush=True)\\n        time.sleep(60)\\n    os._exit(0)\\n"
    "time.sleep(0.3)\\n"
)

async def main():
    out = {}
    for backend in ("auto", "limits"):
        box = Sandbox(SandboxSettings(backend=backend, prewarm=False, timeout_s=5))
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


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare is not installed")
async def test_root_of_a_user_namespace_mapping_one_uid():
    """A rootless container: uid 0, but no other uid to give runs. Runs share uid 0 with no capabilities."""
    proc = await asyncio.create_subprocess_exec(
        "unshare", "--user", "--map-root-user", sys.executable, "-c", _ROOTLESS_SCRIPT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    if proc.returncode and b"unshare failed" in stderr:
        pytest.skip(f"no user namespaces here: {stderr.decode()[-200:]}")
    assert proc.returncode == 0, stderr.decode()[-2000:]
    out = json.loads(stdout)
    zero_caps = str(["0000000000000000"] * 5)
    assert out.pop("daemon_alive") is False  # a setsid daemon dies with its run, shared uid or not
    for backend, (_, probe, after) in out.items():
        assert probe == f"0 {zero_caps}\n", (backend, probe)
        assert after == "alive\n", backend  # killing the interpreter it shares a uid with: replaced
    assert out["auto"][0] in ("bwrap", "unshare")


_KEYRING_SCRIPT = """
import asyncio, ctypes, json, sys
from slime_strands.sandbox import Sandbox
from slime_strands.settings import SandboxSettings

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall(250, ctypes.c_long(1), b"host-session")  # a session keyring, as after a login
libc.syscall(248, b"user", b"host-secret", b"hunter2", 7, ctypes.c_long(-3))
ADD = "import ctypes\\nctypes.CDLL(None).syscall(248, b'user', b'shared', b'x', 1, ctypes.c_long(-3))"
FIND = (
    "import ctypes, time\\ntime.sleep(0.5)\\nfind = lambda d: ctypes.CDLL(None).syscall(250, 10, ctypes.c_long(-3), b'user', d, 0) > 0\\n"
    "print(find(b'host-secret'), find(b'shared'))"
)

async def main():
    out = {}
    for backend in sys.argv[1:]:
        box = Sandbox(SandboxSettings(backend=backend, prewarm=False))
        _, found = await asyncio.gather(box.run(ADD), box.run(FIND))
        out[backend] = found.stdout or found.to_model_text()
        await box.aclose()
    print(json.dumps(out))

asyncio.run(main())
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the test calls keyctl by its x86_64 number")
async def test_runs_hold_neither_the_hosts_nor_a_shared_session_keyring():
    backends = [p.values[0] for p in _backend_params() if not p.marks[0].args[0]]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _KEYRING_SCRIPT, *backends,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    assert json.loads(stdout) == dict.fromkeys(backends, "False False\n")
