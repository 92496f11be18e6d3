"""Backends and placements are objects behind one interface, looked up once: every name the settings accept has
its object, nothing compares a backend's or a placement's name elsewhere, and a new kind of runner (a remote
sandbox service) plugs in through the same interface."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from slime_strands import settings as settings_module
from slime_strands.sandbox import (
    CodeRunner,
    ExecutionResult,
    Placement,
    _backends,
    _host,
    _local,
    _placements,
    configure_sandbox,
    ensure_isolation,
    execute_python_code,
    run_python,
)
from slime_strands.settings import SANDBOX_BACKENDS, SANDBOX_PLACEMENTS, PluginSettings, SandboxSettings

PACKAGE = Path(__file__).resolve().parents[2] / "slime_strands"


def test_every_placement_and_backend_the_settings_accept_has_its_object():
    assert set(_placements.PLACEMENTS) == set(SANDBOX_PLACEMENTS)
    assert set(_backends.CHOICES) | {"camel"} == set(SANDBOX_BACKENDS)
    for backend in SANDBOX_BACKENDS:
        runner = _local.LOCAL.make(SandboxSettings(backend=backend))
        assert isinstance(runner, CodeRunner) and runner.settings.backend == backend
    assert not _local.LOCAL.shared and _placements.PLACEMENTS["ray"].shared


def _name_compares(tree: ast.AST) -> list[int]:
    """Lines comparing something named ``*backend*`` / ``*placement*`` with a string."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = any(
            "backend" in name or "placement" in name
            for side in sides
            for name in (getattr(side, "attr", ""), getattr(side, "id", ""))
        )
        if named and any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides):
            found.append(node.lineno)
    return found


def test_no_module_compares_a_backend_or_placement_name_but_the_settings_that_own_them():
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "settings.py" and path.parent == PACKAGE:
            continue  # the vocabulary's owner validates it
        lines = _name_compares(ast.parse(path.read_text()))
        if lines:
            offenders[str(path.relative_to(PACKAGE))] = lines
    assert not offenders, f"compare the objects, not their names: {offenders}"


def test_the_check_finds_a_name_compare():
    assert _name_compares(ast.parse("if settings.backend == 'camel':\n    pass\n")) == [1]
    assert _name_compares(ast.parse("if placement != 'ray':\n    pass\n")) == [1]


@dataclasses.dataclass
class _RemoteService(CodeRunner):
    """What a remote sandbox service (an HTTP one) would be: a runner that sends the code elsewhere."""

    settings: SandboxSettings
    started: int = 0

    async def start(self) -> str:
        self.started += 1
        return "remote"

    async def run(self, code: str) -> ExecutionResult:
        return ExecutionResult(stdout=f"ran remotely: {code}\n", stderr="", exit_code=0, backend="remote")

    def retire(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


class _RemotePlacement(Placement):
    shared = True

    def __init__(self) -> None:
        self.made: list[_RemoteService] = []

    def make(self, settings: SandboxSettings) -> CodeRunner:
        self.made.append(_RemoteService(settings))
        return self.made[-1]


async def test_a_new_placement_plugs_in_through_the_interface(monkeypatch):
    """The preflight, run_python and the model's tool all reach a new placement's runner: a remote service
    needs its module (a runner and a placement) and its name, nothing else."""
    remote = _RemotePlacement()
    monkeypatch.setattr(settings_module, "SANDBOX_PLACEMENTS", (*SANDBOX_PLACEMENTS, "remote"))
    monkeypatch.setitem(_placements.PLACEMENTS, "remote", remote)
    settings = PluginSettings.from_mapping({"sandbox": {"placement": "remote"}}).sandbox
    original = _host.HOST.settings
    try:
        assert await ensure_isolation(settings) == "remote"
        assert (await run_python("print(1)", settings)).stdout == "ran remotely: print(1)\n"
        configure_sandbox(settings)
        result = await execute_python_code("print(2)")
        assert result["content"][0]["text"] == "ran remotely: print(2)"
        assert len(remote.made) == 1 and remote.made[0].started == 1  # one per process, started once
    finally:
        _host.HOST.shared_runners()
        configure_sandbox(original)


def test_an_unknown_placement_is_refused_by_the_settings():
    with pytest.raises(settings_module.SettingsError, match=r"sandbox\.placement: unknown placement 'k8s'"):
        PluginSettings.from_mapping({"sandbox": {"placement": "k8s"}})
