"""FAILED trajectories grouped by cause: the error texts the episode writes (``<type>: <message>``, built here
from the client's real exceptions), and "rerun" said only for causes a rerun can fix."""

from __future__ import annotations

import pytest

from slime_strands.cli.eval.failures import failure_cause, failure_lines
from slime_strands.provider.client import (
    SGLangAbortError,
    SGLangConnectionError,
    SGLangContextLengthError,
    SGLangHTTPError,
    SGLangProtocolError,
    SGLangTimeoutError,
)


def written(error: Exception) -> str:
    """What ``episode._classify`` writes into a FAILED row."""
    return f"{type(error).__name__}: {error}"


@pytest.mark.parametrize(
    ("error", "summary", "rerun_fixes"),
    [
        (SGLangConnectionError("POST http://h/generate failed after 61 attempt(s): ClientConnectorError()"),
         "the server could not be reached", True),
        (SGLangTimeoutError("POST http://h/generate timed out"), "requests timed out", True),
        (SGLangAbortError("the server aborted the request 4 times"), "the server aborted requests", True),
        (SGLangHTTPError(400, "Unknown field 'best_of'"),
         "the server refused the request (HTTP 400: Unknown field 'best_of')", False),
        (SGLangContextLengthError(400, "The input (9000 tokens) is longer than the model's context length"),
         "the server refused the request (HTTP 400: The input (9000 tokens)", False),
        (SGLangProtocolError("unexpected /generate answer"), "the server's answers are not SGLang", False),
        (RuntimeError("the tool crashed"), "the agent or a tool raised RuntimeError", False),
    ],
)  # fmt: skip
def test_each_cause_says_whether_a_rerun_fixes_it(error, summary, rerun_fixes):
    cause = failure_cause(written(error))
    assert cause.summary.startswith(summary) and cause.rerun_fixes is rerun_fixes
    assert ("a rerun of the same command retries them" in cause.advice) is rerun_fixes
    assert ("a rerun" in cause.advice and "fails the same way" in cause.advice) is not rerun_fixes


def test_a_prompt_without_room_is_not_fixed_by_a_rerun():
    cause = failure_cause("no token generated (context_full)")
    assert cause.summary == "the prompt left no room to generate (context_full)" and not cause.rerun_fixes


def test_failures_are_grouped_by_cause_most_frequent_first():
    refused = written(SGLangHTTPError(400, "Unknown field 'best_of'"))
    gone = written(SGLangConnectionError("POST http://h/generate failed after 3 attempt(s): " + "x" * 400))
    lines = failure_lines([refused, gone, refused, None])
    assert lines[0] == "4 trajectories FAILED:"
    assert lines[1].startswith(
        "  2: the server refused the request (HTTP 400: Unknown field 'best_of') (e.g. "
    )
    assert lines[1].endswith("a rerun fails the same way: fix what the server names (a sampling param, the "
                             "prompt, its flags)")  # fmt: skip
    assert lines[2].startswith("  1: the server could not be reached") and lines[2].endswith(
        ": a rerun of the same command retries them"
    )
    assert "..." in lines[2] and len(lines[2]) < 400, "the example error is shortened"
    assert lines[3].startswith("  1: no error was recorded")
    assert failure_lines([]) == []
    assert failure_lines([gone])[0] == "1 trajectory FAILED:"
