"""Plain-text tables for the command's output (eval's summary, drift's report, inspect's list): aligned
columns and no colour codes, because they go to logs and pastes as often as to terminals."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["format_columns"]


def format_columns(
    header: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 1, rule: bool = True
) -> str:
    """``header`` and ``rows`` as aligned columns two spaces apart: the first ``left`` columns left-aligned,
    the others right-aligned (figures), a line of dashes under the header when ``rule``."""
    table = [list(header), *(list(row) for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(width) if i < left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in table
    ]
    if rule:
        lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
