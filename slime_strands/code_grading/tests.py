"""A row's unit tests, as data_prep writes them into the label, read strictly once.

The label is a JSON object (a string in slime's JSONL): ``entry_point`` (the function the tests call),
``setup`` (trusted code run before each test, e.g. HumanEval's prompt with its helpers and imports) and
``tests`` (a non-empty list of Python sources; each one is a test case, calling the entry point by its name or
as ``candidate``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import SlimeStrandsError

__all__ = ["CodeLabelError", "CodeTests"]


class CodeLabelError(SlimeStrandsError, ValueError):
    """A label that holds no usable tests (the sample cannot be graded: it scores 0)."""


@dataclass(frozen=True)
class CodeTests:
    """What one row's program is graded against."""

    entry_point: str
    tests: tuple[str, ...]
    setup: str = ""

    def to_label(self) -> str:
        return json.dumps({"entry_point": self.entry_point, "setup": self.setup, "tests": list(self.tests)})

    @classmethod
    def from_label(cls, label: Any) -> CodeTests:
        if isinstance(label, str):
            try:
                label = json.loads(label)
            except ValueError:
                raise CodeLabelError(
                    "the label is not a JSON object of tests (prepare code data with "
                    "`python -m data_prep.prepare --dataset humaneval`)"
                ) from None
        if not isinstance(label, dict):
            raise CodeLabelError("the label is not a JSON object with entry_point and tests")
        unknown = sorted(set(label) - {"entry_point", "setup", "tests"})
        if unknown:
            raise CodeLabelError(f"the label has unknown key(s) {unknown} (entry_point, setup, tests)")
        entry, setup, tests = label.get("entry_point"), label.get("setup", ""), label.get("tests")
        if not isinstance(entry, str) or not entry.isidentifier():
            raise CodeLabelError(f"the label's entry_point {entry!r} is not a Python name")
        if not isinstance(setup, str):
            raise CodeLabelError("the label's setup is not a string")
        if (
            not isinstance(tests, list)
            or not tests
            or not all(isinstance(t, str) and t.strip() for t in tests)
        ):
            raise CodeLabelError("the label has no tests (a non-empty list of Python sources)")
        return cls(entry_point=entry, tests=tuple(tests), setup=setup)
