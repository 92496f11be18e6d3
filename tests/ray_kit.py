"""Helpers for the tests of the Ray sandbox pool (tests/ray/): a Ray of the test's own, runs held in the middle
of their execution until the test lets them go, the processes below a pid, and waiting for events."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slime_strands.sandbox import RayPool, _placements
from slime_strands.settings import RayPoolSettings, SandboxSettings

HANG_GUARD_S = 180.0
"""How long a wait may take before the test fails as hung: never reached unless something is broken."""


@contextlib.contextmanager
def own_ray_tmpdir() -> Iterator[str]:
    """Ray's files (sockets, logs, the current-cluster file) in a directory of this test's own: another Ray
    on the machine (another test run, slime's CPU tier) is never joined nor disturbed. Short: Unix socket
    paths are limited to 107 bytes."""
    path = tempfile.mkdtemp(prefix="ssr-", dir="/tmp")
    previous = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = path
    try:
        yield path
    finally:
        if previous is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = previous
        shutil.rmtree(path, ignore_errors=True)


def ray_lines(stderr: str) -> list[str]:
    """The lines saying what became of the Ray the command started or joined."""
    return [line for line in stderr.splitlines() if line.startswith("ray: ")]


def home_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> Path:
    """A home folder of the test's own (HOME, for the child process) holding ``files`` (path -> text)."""
    home = tmp_path / "home"
    for name, text in files.items():
        home.joinpath(name).parent.mkdir(parents=True, exist_ok=True)
        home.joinpath(name).write_text(text)
    monkeypatch.setenv("HOME", str(home))
    home.mkdir(exist_ok=True)
    return home


def tree(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` (relative path -> text), and every folder (-> "")."""
    return {
        str(p.relative_to(folder)): (p.read_text() if p.is_file() else "") for p in sorted(folder.rglob("*"))
    }


@contextlib.contextmanager
def local_ray(num_cpus: int = 4, env_vars: dict[str, str] | None = None) -> Iterator[None]:
    """A new local Ray for this process (never an existing cluster), stopped afterwards; ``env_vars``: its
    workers' environment (e.g. a PYTHONPATH that finds the tests' tools)."""
    import ray

    with own_ray_tmpdir():
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": env_vars} if env_vars else None,
        )
        try:
            yield
        finally:
            ray.shutdown()


def pool_settings(**ray: Any) -> dict[str, Any]:
    """Keyword arguments of a SandboxSettings with placement ray and these pool settings."""
    return {"placement": "ray", "ray": RayPoolSettings(**ray)}


def pool_for(settings: SandboxSettings) -> RayPool:
    """The process's pool for ``settings`` (the one run_python and the plugin use)."""
    pool = _placements.runner(settings)
    assert isinstance(pool, RayPool)
    return pool


async def wait_until(check: Callable[[], Any], what: str, timeout_s: float = HANG_GUARD_S) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy, and return that; fail the test as
    hung after ``timeout_s`` (a guard, not a speed assertion)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"hung: {what} did not happen within {timeout_s:g} s")
        await asyncio.sleep(0.05)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, their children, ...)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return {p for p in found if alive(p)}


class Gate:
    """Runs that stay in the middle of their execution until the test opens the gate.

    Each run of :meth:`code` writes ``started-<key>-<pid>`` in a directory on the host, then waits for the
    file ``open``. Only a run that sees the host's files can do that, so these runs use ``backend: limits``:
    what they test (the pool's handling of workers lost mid-run) does not depend on the backend, which each
    worker hosts unchanged; other tests run the pool under the isolating backends."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ssr-gate-", dir="/tmp"))
        self.dir.chmod(0o777)  # runs have their own uid as root

    def code(self, key: str) -> str:
        return (
            "import os, time\n"
            f"open(os.path.join({str(self.dir)!r}, 'started-{key}-%d' % os.getpid()), 'w').close()\n"
            f"while not os.path.exists(os.path.join({str(self.dir)!r}, 'open')):\n"
            "    time.sleep(0.02)\n"
            f"print('done {key}')\n"
        )

    def started(self) -> list[tuple[str, int]]:
        """(key, pid) of every run that started (a run started again appears again)."""
        found = []
        for path in self.dir.glob("started-*"):
            key, pid = path.name.removeprefix("started-").rsplit("-", 1)
            found.append((key, int(pid)))
        return found

    async def wait_started(self, count: int) -> list[tuple[str, int]]:
        def enough() -> list[tuple[str, int]] | None:
            found = self.started()
            return found if len(found) >= count else None

        return await wait_until(enough, f"{count} gated runs starting")

    def open(self) -> None:
        (self.dir / "open").touch()

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


async def close_pools() -> None:
    """Stop every pool the plugin made (as the end of a run does) and put the default settings back."""
    from slime_strands.sandbox import _host

    for runner in _host.HOST.shared_runners():
        await runner.aclose()
    _host.HOST.configure(SandboxSettings())


def python_call(code: str) -> str:
    """A hermes tool call of the math agent's tool, as a scripted model turn."""
    import json

    payload = json.dumps({"name": "execute_python_code", "arguments": {"code": code}})
    return f"<tool_call>\n{payload}\n</tool_call>"


def sandbox_strands(**sandbox: Any) -> dict[str, Any]:
    """The plugin settings (``strands:``) of the math agent's tool with these sandbox settings."""
    return {"tools": ["slime_strands.sandbox.execute_python_code"], "sandbox": sandbox}
