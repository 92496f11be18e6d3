"""The program of a final answer: the LAST fenced Python block, taken as written.

Strict on purpose (no repair): a block opens with a line of three or more backticks followed by ``python``,
``python3`` or ``py`` (any case) and closes with a line of at least as many backticks; an unclosed block, a
block in another language, or a bare ````` ``` ````` block is no program. What a model must write is therefore
exactly what the system prompt of ``configs/strands_code.yaml`` asks for.
"""

from __future__ import annotations

import re

__all__ = ["extract_program"]

_OPEN = re.compile(r"^[ \t]*(`{3,})[ \t]*(?:python3?|py)[ \t]*$", re.IGNORECASE)
_FENCE = re.compile(r"^[ \t]*(`{3,})[ \t]*$")


def extract_program(final_text: str) -> str | None:
    """The source of the last closed Python block of ``final_text``, or None when there is none."""
    found: str | None = None
    lines = final_text.splitlines()
    i = 0
    while i < len(lines):
        opening = _OPEN.match(lines[i])
        if opening is None:
            i += 1
            continue
        ticks = len(opening.group(1))
        for j in range(i + 1, len(lines)):
            closing = _FENCE.match(lines[j])
            if closing is not None and len(closing.group(1)) >= ticks:
                found = "\n".join(lines[i + 1 : j]) + "\n"
                i = j + 1
                break
        else:
            break  # unclosed: no program from here on
    return found
