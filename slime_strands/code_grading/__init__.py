"""Grading model-written programs against a row's unit tests in the sandbox (the code environment's reward).

``program.py`` finds the program in the final answer, ``tests.py`` reads a row's tests from its label,
``grader.py`` runs them in the sandbox and returns a frozen :class:`CodeVerdict`. What runs inside the sandbox is
``_harness.py`` (the trusted side: the tests) and ``_program_host.py`` (the untrusted side: the program, in a
fresh interpreter), both executed there, never imported.
"""

from __future__ import annotations

from .grader import CodeVerdict, grade_program, grading_sandbox
from .program import extract_program
from .tests import CodeLabelError, CodeTests

__all__ = [
    "CodeLabelError",
    "CodeTests",
    "CodeVerdict",
    "extract_program",
    "grade_program",
    "grading_sandbox",
]
