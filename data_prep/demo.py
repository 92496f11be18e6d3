"""The ``demo`` dataset: a few arithmetic problems built into the package, in dapo-math-17k's row format, so that
``python -m data_prep.prepare --dataset demo`` works offline (try the package on a laptop, against the demo
server of ``python -m slime_strands.testing``). One problem is a word problem the demo server's policy cannot
read as an expression: it guesses, as a model might."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["DEMO_SOURCE", "demo_rows"]

DEMO_SOURCE = "builtin:demo"
"""The ``source`` of the ``demo`` dataset: rows built in, nothing to download."""

DAPO_PROMPT = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: \\boxed{{$Answer}} where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)
"""dapo-math-17k's prompt around each problem."""

PROBLEMS: tuple[tuple[str, int], ...] = (
    ("What is 37 * 12 + 5?", 449),
    ("Compute 2^10 - 24.", 1000),
    ("What is (125 - 17) * 3?", 324),
    ("Evaluate 7 * 8 * 9 - 100.", 404),
    ("What is 1234 + 4321 - 555?", 5000),
    ("Compute 3^5 + 4^4.", 499),
    ("What is 2024 - 13 * 17 + 6?", 1809),
    (
        "A train travels at 60 miles per hour for 3 hours, then at 45 miles per hour for 2 hours. How many "
        "miles does it travel in all?",
        270,
    ),
)


def demo_rows() -> Iterator[dict[str, Any]]:
    """The problems as source rows: ``{"prompt": [user message], "label": "449"}``."""
    for problem, answer in PROBLEMS:
        yield {
            "prompt": [{"role": "user", "content": DAPO_PROMPT.format(problem=problem)}],
            "label": str(answer),
        }
