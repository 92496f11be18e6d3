"""Run a program against its tests in the sandbox and say what happened: a frozen :class:`CodeVerdict`.

The verdict comes only from the trusted side of the run (``_harness.py``), as one stdout line behind a secret
nonce made here per run; the program runs in another process that never sees it (``_harness.py`` says why).
Where that line is missing or malformed (the run timed out, was killed, flooded, or the sandbox failed) the
verdict is the sandbox's own (``timeout``, ``killed``, ``sandbox_error``, ``no_verdict``): never a pass.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..sandbox import ExecutionResult, run_python
from ..settings import CodeRewardSettings, SandboxSettings
from ..strict_reader import StrictReader
from .tests import CodeTests

__all__ = ["PASSING", "CodeVerdict", "grade_program", "grading_sandbox"]

_HERE = Path(__file__).parent
_SANDBOX_GRACE_S = 5.0
"""The run's own limit beyond the grading's: the trusted side reports a timeout itself, with the test it was in."""
PASSING = "passed"
_STATUSES = frozenset(
    {"passed", "failed", "load_error", "no_entry_point", "timeout", "crashed", "harness_error"}
)


@functools.cache
def _source(name: str) -> str:
    return (_HERE / name).read_text(encoding="utf-8")


@dataclass(frozen=True)
class CodeVerdict:
    """One sample's grading: what the tests (or the sandbox) said."""

    status: str
    """``passed``, ``failed`` (a test failed), ``no_program`` (no fenced Python block), ``bad_label``,
    ``load_error`` (the program raised or did not compile), ``no_entry_point``, ``timeout``, ``crashed`` (the
    program's process exited or broke its channel mid-test), ``killed`` / ``no_verdict`` / ``sandbox_error`` /
    ``harness_error`` (the sandbox's own verdict)."""
    passed: int = 0
    total: int = 0
    detail: str = ""
    """The first failing test's first lines (or why nothing ran)."""
    failures: tuple[str, ...] = ()
    program_output: str = ""
    backend: str = ""
    duration_s: float = 0.0

    @property
    def all_passed(self) -> bool:
        return self.status == PASSING and self.total > 0 and self.passed == self.total

    def score(self, pass_fraction: bool) -> float:
        """1.0 when every test passed; with ``pass_fraction``, the share that passed (0 unless the tests ran)."""
        if self.all_passed:
            return 1.0
        if pass_fraction and self.status in ("passed", "failed") and self.total:
            return self.passed / self.total
        return 0.0

    def to_metadata(self) -> dict[str, Any]:
        """The verdict as plain JSON (the sample's metadata, a trajectory row's ``code``)."""
        return dataclasses.asdict(self) | {"failures": list(self.failures)}

    @classmethod
    def from_metadata(cls, data: Any, where: str = "code") -> CodeVerdict:
        """Read back :meth:`to_metadata`; ValueError naming what is wrong with anything else (keys a later
        version adds are ignored)."""
        d = StrictReader(data, where)
        failures = d.items("failures")
        if not all(isinstance(f, str) for f in failures):
            d.fail(f"{where}: failures must be strings, got {failures!r}")
        return cls(**d.scalars(cls, negative=False), failures=tuple(failures))

    def summary(self) -> str:
        """One line: the status, the tests passed, the backend (what ``inspect`` heads the verdict with)."""
        ran = f"{self.passed}/{self.total} tests passed" if self.total else "no tests ran"
        backend = f" · sandbox {self.backend}" if self.backend else ""
        return f"code verdict {self.status} · {ran}{backend} · {self.duration_s:.2f} s"


def grading_sandbox(sandbox: SandboxSettings, code: CodeRewardSettings) -> SandboxSettings:
    """The sandbox a grading runs in: the tool sandbox's backend and placement (a Ray pool too), with the
    reward's own limits; nothing preloaded (the program runs in a fresh interpreter anyway)."""
    return dataclasses.replace(
        sandbox,
        timeout_s=code.timeout_s + _SANDBOX_GRACE_S,
        cpu_seconds=math.ceil(code.timeout_s) + 1,
        memory_mb=code.memory_mb,
        max_processes=code.max_processes,
        max_output_chars=code.max_output_chars,
        return_figures=False,
        prewarm=False,
        preload_modules=(),
        concurrency=code.concurrency,  # null under the Ray placement (validated): the pool bounds it
    )


def _harness(program: str, tests: CodeTests, code: CodeRewardSettings, nonce: str) -> str:
    job = {
        "nonce": nonce,
        "program": program,
        "entry_point": tests.entry_point,
        "setup": tests.setup,
        "tests": list(tests.tests),
        "timeout_s": code.timeout_s,
        "failure_lines": code.failure_lines,
        "host": _source("_program_host.py"),
    }
    return f"_JOB = {job!r}\n" + _source("_harness.py")


async def grade_program(
    program: str, tests: CodeTests, code: CodeRewardSettings, sandbox: SandboxSettings
) -> CodeVerdict:
    """Run ``program`` against ``tests`` in the grading sandbox. Raises only what the sandbox raises for a
    configuration that can never run code (``SandboxIsolationError``, ``SandboxPoolError``)."""
    nonce = "@@slime-strands-verdict-" + secrets.token_hex(16) + "@@"
    result = await run_python(_harness(program, tests, code, nonce), grading_sandbox(sandbox, code))
    return _verdict(result, nonce, len(tests.tests))


def _verdict(result: ExecutionResult, nonce: str, total: int) -> CodeVerdict:
    lines = [line for line in result.stdout.splitlines() if line.startswith(nonce)]
    if len(lines) == 1:
        parsed = _parse(lines[0][len(nonce) :], total)
        if parsed is not None:
            return dataclasses.replace(parsed, backend=result.backend, duration_s=result.duration_s)
    if result.timed_out:
        status, detail = "timeout", "the sandbox killed the grading run at its time limit"
    elif result.error:
        status, detail = "sandbox_error", result.error
    elif result.signal is not None:
        status, detail = "killed", result.to_model_text(500)
    else:
        why = "several verdict lines" if len(lines) > 1 else "no verdict line"
        status, detail = "no_verdict", f"{why}: {result.to_model_text(500)}"
    return CodeVerdict(
        status, total=total, detail=detail, backend=result.backend, duration_s=result.duration_s
    )


def _parse(text: str, total: int) -> CodeVerdict | None:
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    status, passed = data.get("status"), data.get("passed")
    failures = data.get("failures", [])
    if status not in _STATUSES or not isinstance(passed, int) or data.get("total") != total:
        return None
    if not isinstance(failures, list) or not all(isinstance(f, str) for f in failures):
        return None
    if status == PASSING and passed != total:
        return None
    return CodeVerdict(
        status=str(status),
        passed=passed,
        total=total,
        detail=str(data.get("detail", "")),
        failures=tuple(failures),
        program_output=str(data.get("program_output", "")),
    )
