"""Why an eval's trajectories FAILED, grouped by cause for the end of the run, each saying whether rerunning the
same command can fix it (the server was away, a request timed out) or not (the server refuses the request, the
prompt leaves no room to generate): "rerun" is only said where it helps.

A FAILED row's ``error`` is the episode's ``<exception type>: <message>`` (``episode._classify``), or
``no token generated (<termination>)`` when the prompt alone filled the room; the type says the cause.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["FailureCause", "failure_cause", "failure_lines"]

_EXAMPLE_CHARS = 160
_HTTP = re.compile(r"SGLang answered HTTP (\d+): (.*)", re.S)
_NO_ROOM = re.compile(r"no token generated \((\w+)\)")
_RERUN = "a rerun of the same command retries them"


@dataclass(frozen=True)
class FailureCause:
    """One reason trajectories fail: what happened, whether a rerun can fix it, and what to do."""

    summary: str
    rerun_fixes: bool
    advice: str


_BY_TYPE = {
    "SGLangTimeoutError": FailureCause(
        "requests timed out", True, f"{_RERUN} (raise strands.request_timeout_s if the server is only slow)"
    ),
    "SGLangConnectionError": FailureCause(
        "the server could not be reached, or kept answering 5xx / 408 / 429, through every retry",
        True,
        _RERUN,
    ),
    "SGLangAbortError": FailureCause(
        "the server aborted requests on its own (a worker restarting behind the router?)", True, _RERUN
    ),
    "SGLangProtocolError": FailureCause(
        "the server's answers are not SGLang /generate answers",
        False,
        "a rerun fails the same way: check that --base-url is an SGLang server or router",
    ),
}


def failure_cause(error: str | None) -> FailureCause:
    """The cause of a FAILED trajectory from its row's ``error``."""
    text = (error or "").strip()
    kind, _, message = text.partition(": ")
    known = _BY_TYPE.get(kind)
    if known is not None:
        return known
    http = _HTTP.match(message) if kind in ("SGLangHTTPError", "SGLangContextLengthError") else None
    if http is not None:
        return FailureCause(
            f"the server refused the request (HTTP {http.group(1)}: {_cut(http.group(2), 120)})",
            False,
            "a rerun fails the same way: fix what the server names (a sampling param, the prompt, its flags)",
        )
    no_room = _NO_ROOM.fullmatch(text)
    if no_room is not None:
        return FailureCause(
            f"the prompt left no room to generate ({no_room.group(1)})",
            False,
            "a rerun fails the same way: shorten the prompt or give the model room (a longer context window, "
            "strands.max_context_len, --max-response-len)",
        )
    if not text:
        return FailureCause("no error was recorded", False, "see the rows")
    return FailureCause(
        f"the agent or a tool raised {kind if message else 'an error'}",
        False,
        "a rerun likely fails the same way: the rows' error says what raised",
    )


def failure_lines(errors: Iterable[str | None]) -> list[str]:
    """Lines for the end of a run: how many FAILED, then one line per cause (most frequent first) with an
    example error and whether a rerun fixes it; empty when nothing failed."""
    groups: dict[FailureCause, list[str]] = {}
    for error in errors:
        groups.setdefault(failure_cause(error), []).append(error or "")
    if not groups:
        return []
    total = sum(len(found) for found in groups.values())
    lines = [f"{total} trajector{'y' if total == 1 else 'ies'} FAILED:"]
    for cause, found in sorted(groups.items(), key=lambda item: -len(item[1])):
        lines.append(
            f"  {len(found)}: {cause.summary} (e.g. {_cut(found[0], _EXAMPLE_CHARS)}): {cause.advice}"
        )
    return lines


def _cut(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
