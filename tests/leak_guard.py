"""The suite's guard against processes left behind: every process a test starts must be gone once the session's
fixtures are torn down. A test that leaves one makes later tests that count processes wait and fail far from the
cause (three such processes once made ten MCP tests fail): this plugin names the test that started each one.

After each test it records the descendants of pytest that appeared during that test (its module's fixtures may
still hold them: that is not yet a leak). At the session's end, those still alive are the leaks: each is named with
its command line and the test it appeared in, killed (with its own children), and the session fails: a process
left behind is a defect of the test or of the code it ran, found here rather than by a later test. A process
already on its way out (told to stop in a fixture's teardown) gets a few seconds to end first.
"""

from __future__ import annotations

from collections.abc import Iterator

import psutil
import pytest

_Key = tuple[int, float]  # (pid, create time): a pid reused later is another process
_GRACE_S = 5.0
"""How long a process still alive at the session's end may take to end before it counts as left behind."""
_started: dict[_Key, str] = {}
"""Each process that appeared during a test -> that test's node id."""


def _descendants() -> dict[_Key, psutil.Process]:
    found: dict[_Key, psutil.Process] = {}
    for process in psutil.Process().children(recursive=True):
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                found[(process.pid, process.create_time())] = process
        except psutil.NoSuchProcess:  # ended since the listing
            continue
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    before = _descendants().keys()
    yield
    for key in _descendants().keys() - before:
        _started.setdefault(key, item.nodeid)


def _describe(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())[:300] or process.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "?"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    leaked = {key: process for key, process in _descendants().items() if key in _started}
    gone, _ = psutil.wait_procs(leaked.values(), timeout=_GRACE_S)
    leaked = {key: process for key, process in leaked.items() if process not in gone}
    if not leaked:
        return
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [
        f"pid {key[0]} ({_describe(process)}), started in {_started[key]}" for key, process in leaked.items()
    ]
    for process in leaked.values():  # the leaks must not outlive the session either
        try:
            victims = [*process.children(recursive=True), process]
        except psutil.NoSuchProcess:
            continue
        for victim in victims:
            try:
                victim.kill()
            except psutil.NoSuchProcess:
                continue
    if reporter is not None:
        reporter.write_line("")
        reporter.write_sep("=", f"{len(leaked)} process(es) left behind by the tests (killed now)", red=True)
        for line in lines:
            reporter.write_line(line, red=True)
