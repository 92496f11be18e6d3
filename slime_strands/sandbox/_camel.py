"""camel-ai's SubprocessInterpreter as a runner (``sandbox.backend: camel``), as slime's example uses it:
UNISOLATED, no limits but time. For parity only."""

from __future__ import annotations

import asyncio
import logging
import time

from ..settings import SandboxSettings
from ._result import ExecutionResult, cut_middle
from ._runner import CodeRunner

__all__ = ["CamelInterpreter"]

logger = logging.getLogger(__name__)


class CamelInterpreter(CodeRunner):
    """Each snippet in a new interpreter process camel-ai starts, in an executor thread."""

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings

    async def start(self) -> str:
        logger.warning(
            "slime-strands sandbox: backend 'camel': model-written code runs UNISOLATED, no limits"
        )
        return "camel"

    async def run(self, code: str) -> ExecutionResult:
        settings = self.settings
        try:
            from camel.interpreters import SubprocessInterpreter
        except ImportError as exc:
            return ExecutionResult(
                "",
                "",
                None,
                backend="camel",
                error=f"camel-ai is not installed ({exc}): pip install 'slime-strands[camel]'",
            )
        interpreter = SubprocessInterpreter(
            require_confirm=False,
            print_stdout=False,
            print_stderr=False,
            execution_timeout=int(settings.timeout_s),
        )
        started = time.perf_counter()
        output = await asyncio.get_running_loop().run_in_executor(None, interpreter.run, code, "python")
        text, truncated = cut_middle(str(output), settings.max_output_chars)
        return ExecutionResult(
            stdout=text,
            stderr="",
            exit_code=0,
            output_truncated=truncated,
            duration_s=time.perf_counter() - started,
            backend="camel",
            timeout_s=settings.timeout_s,
            memory_mb=settings.memory_mb,
        )

    def retire(self) -> None:
        """Nothing to close: each run's interpreter ends with it."""

    async def aclose(self) -> None:
        """Nothing to close: each run's interpreter ends with it."""
