"""Isolation fails closed: ``auto`` runs code under bwrap or unshare, or not at all.

A machine that refuses namespaces is played by stand-ins for ``bwrap`` and ``unshare`` that fail the way the
real tools do there (same messages, same exit status) and log each call.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from sandbox_isolation import fail_or_skip

import slime_strands.sandbox as package
from slime_strands.errors import ConfigurationError
from slime_strands.sandbox import (
    Sandbox,
    SandboxIsolationError,
    SandboxUnavailableError,
    _sandbox,
    ensure_isolation,
    execute_python_code,
    run_python,
)
from slime_strands.settings import SandboxSettings

pytestmark = pytest.mark.timeout(120)

_REFUSALS = {  # what each tool prints where namespaces are forbidden (seccomp, AppArmor, sysctl)
    "bwrap": "bwrap: No permissions to create new namespace, likely because the kernel does not allow "
    "non-privileged user namespaces.",
    "unshare": "unshare: unshare failed: Operation not permitted",
}


def _refuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *tools: str) -> Path:
    """Put refusing stand-ins for ``tools`` first on PATH; returns the log of their calls."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for tool in tools:
        script = bin_dir / tool
        usage = f'[ "$1" = --help ] && echo "usage: {tool} [OPTIONS...] [--] COMMAND [ARGS...]" && exit 0\n'
        script.write_text(f"#!/bin/sh\n{usage}echo {tool} >> '{log}'\necho '{_REFUSALS[tool]}' >&2\nexit 1\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(_sandbox.HOST, "working_backends", {})  # nothing has isolated in this process yet
    return log


def _calls(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_the_isolation_error_is_a_configuration_error_not_a_transient_one():
    assert issubclass(SandboxIsolationError, ConfigurationError)
    assert not issubclass(SandboxIsolationError, SandboxUnavailableError)
    assert not issubclass(SandboxUnavailableError, ConfigurationError)


async def test_auto_uses_bwrap_where_it_works(monkeypatch):
    monkeypatch.setattr(_sandbox.HOST, "working_backends", {})
    box = Sandbox(SandboxSettings(backend="auto", prewarm=False, timeout_s=30))
    try:
        try:
            await box.start()
        except SandboxIsolationError as exc:
            fail_or_skip("bwrap", str(exc))
        result = await box.run("print(1)")
    finally:
        await box.aclose()
    assert result.backend == "bwrap" and result.ok and result.stdout == "1\n", result


async def test_auto_moves_on_to_unshare_when_bwrap_is_refused(tmp_path, monkeypatch):
    log = _refuse(tmp_path, monkeypatch, "bwrap")
    box = Sandbox(SandboxSettings(backend="auto", prewarm=False, timeout_s=30))
    try:
        try:
            await box.start()
        except SandboxIsolationError as exc:
            fail_or_skip("unshare", str(exc))
        result = await box.run("print(1)")
    finally:
        await box.aclose()
    assert _calls(log) == ["bwrap"]
    assert result.backend == "unshare" and result.stdout == "1\n", result


async def test_no_isolation_raises_and_never_runs_the_code(tmp_path, monkeypatch):
    log = _refuse(tmp_path, monkeypatch, "bwrap", "unshare")
    marker = tmp_path / "ran-unisolated"
    code = f"open({str(marker)!r}, 'w').write('x')"
    settings = SandboxSettings(backend="auto", prewarm=False, timeout_s=30)
    box = Sandbox(settings)
    try:
        with pytest.raises(SandboxIsolationError) as raised:
            await box.run(code)
        assert _calls(log) == ["bwrap", "unshare"]
        message = str(raised.value)
        assert message.startswith("sandbox.backend: auto: no isolating sandbox backend works here (bwrap: ")
        assert _REFUSALS["bwrap"] in message and _REFUSALS["unshare"] in message
        for fix in ("apt-get install -y bubblewrap", "user namespaces", "`sandbox.backend: limits`"):
            assert fix in message, fix
        with pytest.raises(SandboxIsolationError):  # every later run too, without trying again
            await box.run(code)
        assert _calls(log) == ["bwrap", "unshare"]
    finally:
        await box.aclose()
    with pytest.raises(SandboxIsolationError, match="no isolating sandbox backend works here"):
        await ensure_isolation(settings)  # the preflight slime's entry point calls
    assert not marker.exists()


async def test_the_tool_reports_missing_isolation_as_a_tool_error(tmp_path, monkeypatch):
    _refuse(tmp_path, monkeypatch, "bwrap", "unshare")
    marker = tmp_path / "ran-unisolated"
    original = _sandbox.HOST.settings
    package.configure_sandbox(SandboxSettings(backend="auto", prewarm=False, timeout_s=30))
    try:
        reply = await execute_python_code(code=f"open({str(marker)!r}, 'w').write('x')")
    finally:
        package.configure_sandbox(original)
    assert reply["status"] == "error"
    (content,) = reply["content"]
    assert content["text"].startswith("[sandbox error: sandbox.backend: auto: no isolating sandbox backend")
    assert "bubblewrap" in content["text"] and not marker.exists()


async def test_an_explicit_backend_that_cannot_isolate_raises(tmp_path, monkeypatch):
    _refuse(tmp_path, monkeypatch, "bwrap")
    with pytest.raises(
        SandboxIsolationError, match=r"sandbox\.backend: bwrap: bwrap cannot isolate here"
    ) as raised:
        await run_python("print(1)", SandboxSettings(backend="bwrap", prewarm=False, timeout_s=30))
    assert _REFUSALS["bwrap"] in str(raised.value)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no bwrap at all
    with pytest.raises(SandboxIsolationError, match=r"\(bwrap: not installed\)"):
        await run_python("print(1)", SandboxSettings(backend="bwrap", prewarm=False, timeout_s=31))


async def test_a_failure_after_isolation_worked_is_transient(tmp_path, monkeypatch):
    """Once isolation worked in this process the machine allows it: a failed restart (e.g. under memory
    pressure) fails the run, not the training."""
    _refuse(tmp_path, monkeypatch, "bwrap", "unshare")
    monkeypatch.setattr(_sandbox.HOST, "working_backends", {"auto": "bwrap"})
    result = await run_python("print(1)", SandboxSettings(backend="auto", prewarm=False, timeout_s=32))
    assert result.error and result.error.startswith("the sandbox interpreter could not start: bwrap:"), result
    assert result.stdout == "" and not result.ok


async def test_limits_must_be_asked_for_and_warns_at_every_start(caplog):
    settings = SandboxSettings(backend="limits", prewarm=False, timeout_s=30)
    caplog.set_level(logging.WARNING, logger="slime_strands.sandbox")
    for _ in range(2):  # two sandboxes starting: two warnings, not one per process
        box = Sandbox(settings)
        try:
            assert await box.start() == "limits"
            assert (await box.run("print(1)")).stdout == "1\n"
        finally:
            await box.aclose()
    warnings = [r.getMessage() for r in caplog.records if "WITHOUT namespace isolation" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert "backend 'limits'" in warnings[0] and "host network" in warnings[0]
    assert await ensure_isolation(settings) == "limits"  # unisolated on purpose: returned as it is
