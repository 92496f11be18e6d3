"""Which trajectory of a file ``inspect --index`` and ``drift --index`` name: by row key, not by line.

Rows are written as episodes finish, so the line order of an eval's ``--out`` file is completion order, and a
retried key (a FAILED row run again) has several lines. A trajectory is named by its row key instead, as
``--list`` shows it: ``P:S`` is sample ``S`` of prompt ``P`` (the prompt's position in ``--data``), ``P``
alone is ``P:0``, and ``-K`` is the K-th from the end in key order. The later line of a key is the key's
row, as for a resumed eval; the files are read once to find the keys (from the start of each line, where the
writer puts them) and only the chosen row is parsed.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..trajectories.file import TrajectoryRow, complete_lines, parse_row
from .errors import CommandError

__all__ = ["find_row", "latest_rows"]

_KEY_AT_START = re.compile(rb'\{"schema": "[^"]*", "key": "(\d+):(\d+)"')
_SELECTOR = re.compile(r"(\d+)(?::(\d+))?|-(\d+)")
_HINT = "name a row key P:S (prompt index P, sample S) as --list shows it, P for P:0, or -1 for the last"

Key = tuple[int, int]


def latest_rows(path: str | Path) -> list[tuple[int, TrajectoryRow]]:
    """``(line number, row)`` of the later line of every key, in key order (the file is read twice)."""
    order = [number for _, number in _latest_lines(path)]
    wanted = set(order)
    rows = {number: parse_row(path, number, raw) for number, raw in complete_lines(path) if number in wanted}
    if len(rows) != len(order):
        raise CommandError(f"{path}: changed while it was read", hint="run the command again")
    return [(number, rows[number]) for number in order]


def find_row(path: str | Path, selector: str | None = None) -> tuple[int, TrajectoryRow]:
    """``(line number, row)`` of the trajectory ``selector`` names (see the module docstring; None: the first
    key); CommandError when it is malformed or names no row of the file."""
    match = _SELECTOR.fullmatch((selector or "-0").strip())
    if match is None:
        raise CommandError(f"--index {selector!r} is not a row key", hint=_HINT)
    keys = _latest_lines(path)
    if not keys:
        raise CommandError(
            f"{path}: no trajectories",
            hint="the file is empty: run `slime-strands eval ... --out FILE` first",
        )
    held = (
        f"the file holds keys {_key_text(keys[0][0])} to {_key_text(keys[-1][0])} ({len(keys)} trajectories)"
    )
    if selector is None:
        return keys[0][1], _read_line(path, keys[0][1])
    if match.group(3) is not None:
        back = int(match.group(3))
        if not 1 <= back <= len(keys):
            raise CommandError(f"{path}: no trajectory at --index -{back}: {held}", hint=_HINT)
        return keys[-back][1], _read_line(path, keys[-back][1])
    wanted = (int(match.group(1)), int(match.group(2) or 0))
    found = dict(keys).get(wanted)
    if found is None:
        raise CommandError(f"{path}: no trajectory with key {_key_text(wanted)}: {held}", hint=_HINT)
    return found, _read_line(path, found)


def _latest_lines(path: str | Path) -> list[tuple[Key, int]]:
    """``(key, line number)`` of the later line of every key, in key order."""
    latest: dict[Key, int] = {}
    for number, raw in complete_lines(path):
        latest[_key_of(path, number, raw)] = number
    return sorted(latest.items())


def _key_of(path: str | Path, number: int, raw: bytes) -> Key:
    """A line's key, read where the writer puts it; a line written otherwise is parsed whole."""
    match = _KEY_AT_START.match(raw)
    if match is not None:
        return int(match.group(1)), int(match.group(2))
    row = parse_row(path, number, raw)
    return row.prompt_index, row.sample


def _read_line(path: str | Path, wanted: int) -> TrajectoryRow:
    for number, raw in complete_lines(path):
        if number == wanted:
            return parse_row(path, number, raw)
    raise CommandError(f"{path}: changed while it was read", hint="run the command again")


def _key_text(key: Key) -> str:
    return f"{key[0]}:{key[1]}"
