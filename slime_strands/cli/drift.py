"""``slime-strands drift``: how many of a trajectory's tokens a text-based pipeline would get wrong.

Two ways of rebuilding the token ids the trainer sees, compared with the ids the server actually sampled:

* **re-tokenized**: decode the trajectory to text and encode that text again (what any pipeline that stores
  text and tokenizes for training does). Sampled ids need not be the tokenizer's canonical split of their own
  text (``" hel" + "lo"`` becomes ``" hello"``), so ids change;
* **re-rendered**: render the conversation (``messages``, the agent's view) with the chat template and encode
  it (what a chat-completions pipeline does). Templates rewrite history: Qwen3 drops the reasoning of earlier
  turns when it is empty and of turns before the last user message, tool-call JSON is re-serialised, whitespace
  is normalised.

Each comparison aligns the two sequences on a longest common subsequence (so an early change does not count
every later token again) and reports the trajectory tokens that do not survive (``lost``, and how many of them
are trained tokens, loss mask 1: the ones whose logprobs the update would get wrong), the tokens the rebuild
has that the trajectory does not (``added``; the template's newline after the last turn is not counted), the
share of the trajectory lost, and the first position that differs. A
multi-segment row (context compaction) is re-tokenized segment by segment; its ``messages`` are the last
segment's conversation, so only that segment is re-rendered.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..template.render import ChatRenderer, TemplateError
from ..trajectories.file import SavedSegment, TrajectoryRow
from .text_table import format_columns
from .token_alignment import align

__all__ = ["Divergence", "DriftReport", "format_reports", "measure", "report_json"]

MAX_EDITS = 4000
"""Beyond this many insertions + deletions the alignment stops (its cost grows with them): the counts are then
the tokens outside the common prefix and suffix, an upper bound (``exact`` is False)."""
_CONTEXT = 3


@dataclass(frozen=True)
class Divergence:
    """How one rebuilt token sequence differs from the sampled one."""

    tokens: int
    trained: int
    lost: int
    """Trajectory tokens the rebuild does not reproduce."""
    lost_trained: int
    added: int
    """Rebuilt tokens the trajectory does not have (after its last token: not counted)."""
    exact: bool
    """False when the sequences were too different to align: the counts are then an upper bound."""
    first: tuple[int, int] | None
    """(segment number from 1, token index) of the first token that differs; None when none does."""
    where: str = ""
    """What the first differing token belongs to (``turn 2``, ``tool / template tokens``, ``prompt``)."""
    sampled: tuple[str, ...] = ()
    """Token texts from the first difference on, as sampled ..."""
    rebuilt: tuple[str, ...] = ()
    """... and as rebuilt."""

    @property
    def share(self) -> float:
        return self.lost / self.tokens if self.tokens else 0.0

    @property
    def differs(self) -> bool:
        """Whether the rebuild is not the sampled trajectory token for token."""
        return self.first is not None or self.lost > 0 or self.added > 0

    @property
    def trained_share(self) -> float:
        return self.lost_trained / self.trained if self.trained else 0.0


@dataclass(frozen=True)
class DriftReport:
    key: str
    segments: int
    retokenized: Divergence | None
    rerendered: Divergence | None
    rerender_note: str | None = None
    """Why there is no re-rendered figure (no conversation recorded, the template cannot render it)."""


def measure(row: TrajectoryRow, tokenizer: Any) -> DriftReport:
    """Both rebuilds of ``row`` compared with its sampled tokens (re-rendered only where it can be)."""
    if not row.segments:
        return DriftReport(row.key, 0, None, None, "no tokens: the episode failed before its first turn")
    parts = []
    for number, segment in enumerate(row.segments, start=1):
        text = tokenizer.decode(segment.token_ids, skip_special_tokens=False)
        parts.append(_compare(number, segment, _encode(tokenizer, text), tokenizer))
    retokenized = _combine(parts)
    rerendered, note = None, None
    if not row.messages:
        note = "no conversation recorded"
    elif not any(span.kind == "generated" for span in row.segments[-1].spans):
        note = "no generated turn"
    else:
        try:
            renderer = ChatRenderer(tokenizer, template_kwargs=row.chat_template_kwargs, probe=False)
            text = renderer.render(row.messages, tools=row.tools, add_generation_prompt=False)
        except TemplateError as exc:
            note = f"the chat template cannot render the conversation: {exc}"
        else:
            last = len(row.segments)
            rerendered = _compare(last, row.segments[-1], _encode(tokenizer, text), tokenizer)
    return DriftReport(row.key, len(row.segments), retokenized, rerendered, note)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _compare(number: int, segment: SavedSegment, rebuilt: Sequence[int], tokenizer: Any) -> Divergence:
    ids, mask = segment.token_ids, segment.loss_mask
    alignment = align(ids, rebuilt, max_edits=MAX_EDITS)
    if alignment is not None:
        a_matched, added = alignment.a_matched, alignment.b_matched.count(False) - alignment.trailing_b
    else:  # too different to align cheaply: everything between the common prefix and suffix
        a_matched, added = _outside_prefix_suffix(ids, rebuilt)
    first = next((i for i, (a, b) in enumerate(zip(ids, rebuilt, strict=False)) if a != b), None)
    if first is None and len(rebuilt) < len(ids):
        first = len(rebuilt)
    lost = [i for i, ok in enumerate(a_matched) if not ok]
    return Divergence(
        tokens=len(ids),
        trained=sum(mask),
        lost=len(lost),
        lost_trained=sum(mask[i] for i in lost),
        added=added,
        exact=alignment is not None,
        first=None if first is None else (number, first),
        where="" if first is None else _where(segment, first),
        sampled=() if first is None else _pieces(tokenizer, ids[first : first + _CONTEXT]),
        rebuilt=() if first is None else _pieces(tokenizer, rebuilt[first : first + _CONTEXT]),
    )


def _outside_prefix_suffix(a: Sequence[int], b: Sequence[int]) -> tuple[list[bool], int]:
    """Tokens of ``a`` in the common prefix or suffix, and how many tokens of ``b`` lie between them."""
    shortest = min(len(a), len(b))
    prefix = 0
    while prefix < shortest and a[prefix] == b[prefix]:
        prefix += 1
    suffix = 0
    while suffix < shortest - prefix and a[-1 - suffix] == b[-1 - suffix]:
        suffix += 1
    matched = [i < prefix or i >= len(a) - suffix for i in range(len(a))]
    return matched, len(b) - prefix - suffix


def _where(segment: SavedSegment, index: int) -> str:
    turn = 0
    for span in segment.spans:
        turn += span.kind == "generated"
        if span.start <= index < span.end:
            return {"prompt": "prompt", "generated": f"turn {turn}", "observation": "tool / template tokens"}[
                span.kind
            ]
    return "end"


def _pieces(tokenizer: Any, ids: Sequence[int]) -> tuple[str, ...]:
    return tuple(tokenizer.decode([t], skip_special_tokens=False) for t in ids)


def _combine(parts: Sequence[Divergence]) -> Divergence:
    """Segment figures summed; the first difference is the earliest segment's."""
    if len(parts) == 1:
        return parts[0]
    first = next((p for p in parts if p.first is not None), None)
    return Divergence(
        tokens=sum(p.tokens for p in parts),
        trained=sum(p.trained for p in parts),
        lost=sum(p.lost for p in parts),
        lost_trained=sum(p.lost_trained for p in parts),
        added=sum(p.added for p in parts),
        exact=all(p.exact for p in parts),
        first=first.first if first else None,
        where=first.where if first else "",
        sampled=first.sampled if first else (),
        rebuilt=first.rebuilt if first else (),
    )


# -- output ------------------------------------------------------------------------------------------


def report_json(report: DriftReport) -> str:
    """One JSON line per trajectory (``drift --json``); shares included for convenience."""
    data: dict[str, Any] = {"key": report.key, "segments": report.segments}
    for name in ("retokenized", "rerendered"):
        divergence: Divergence | None = getattr(report, name)
        if divergence is None:
            data[name] = None
            continue
        entry = asdict(divergence)
        entry["first"] = list(divergence.first) if divergence.first else None
        entry["share"], entry["trained_share"] = divergence.share, divergence.trained_share
        data[name] = entry
    data["rerender_note"] = report.rerender_note
    return json.dumps(data, ensure_ascii=False)


def format_reports(reports: Sequence[DriftReport]) -> str:
    """A table (one row per trajectory, and a total), then where each trajectory first differs."""
    header = ["key", "tokens", "trained"]
    for name in ("re-tokenized", "re-rendered"):
        header += [f"{name}: lost", "trained lost", "added", "first"]
    rows = [[r.key, *_cells(r)] for r in reports]
    if len(reports) > 1:
        rows.append(["total", *_total(reports)])
    lines = [format_columns(header, rows)]
    details = [line for r in reports for line in _details(r)]
    if details:
        lines += ["", *details]
    lines += [
        "",
        "lost: trajectory tokens the rebuild does not reproduce (share of the trajectory); trained lost: those with "
        "loss mask 1; added: rebuilt tokens the trajectory lacks; first: segment:token of the first difference "
        "(total row: trajectories that differ). >= marks an upper bound (too different to align).",
        "",
        _verdict(reports),
    ]
    return "\n".join(lines)


def _verdict(reports: Sequence[DriftReport]) -> str:
    """One line: no drift at all, or how many trajectories each rebuild changes."""
    counts = []
    for label, name in (("re-tokenizing", "retokenized"), ("re-rendering", "rerendered")):
        measured: list[Divergence] = [getattr(r, name) for r in reports if getattr(r, name) is not None]
        counts.append((label, sum(d.differs for d in measured), len(measured)))
    if not any(differ for _, differ, _ in counts):
        (_, _, retokenized), (_, _, rerendered) = counts
        return (
            "no drift: every rebuild reproduces its trajectory token for token "
            f"({retokenized} re-tokenized, {rerendered} re-rendered)"
        )
    said = ", ".join(f"{label} changes {differ} of {total}" for label, differ, total in counts if total)
    return f"drift: {said} trajectories (details above)"


def _cells(report: DriftReport) -> list[str]:
    base = report.retokenized or report.rerendered
    counts = [str(base.tokens), str(base.trained)] if base else ["0", "0"]
    return [*counts, *_divergence_cells(report.retokenized), *_divergence_cells(report.rerendered)]


def _divergence_cells(d: Divergence | None) -> list[str]:
    if d is None:
        return ["-", "-", "-", "-"]
    bound = "" if d.exact else ">="
    first = f"{d.first[0]}:{d.first[1]}" if d.first else "-"
    return [
        f"{bound}{d.lost} ({d.share:.1%})",
        f"{bound}{d.lost_trained} ({d.trained_share:.1%})",
        f"{bound}{d.added}",
        first,
    ]


def _total(reports: Sequence[DriftReport]) -> list[str]:
    base = [r.retokenized for r in reports if r.retokenized is not None]
    cells = [str(sum(d.tokens for d in base)), str(sum(d.trained for d in base))]
    for name in ("retokenized", "rerendered"):
        parts: list[Divergence] = [getattr(r, name) for r in reports if getattr(r, name) is not None]
        if not parts:
            cells += ["-", "-", "-", "-"]
            continue
        tokens, trained = sum(p.tokens for p in parts), sum(p.trained for p in parts)
        lost, lost_trained = sum(p.lost for p in parts), sum(p.lost_trained for p in parts)
        cells += [
            f"{lost} ({lost / tokens if tokens else 0:.1%})",
            f"{lost_trained} ({lost_trained / trained if trained else 0:.1%})",
            str(sum(p.added for p in parts)),
            f"{sum(p.first is not None for p in parts)}/{len(parts)}",
        ]
    return cells


def _details(report: DriftReport) -> list[str]:
    lines = []
    for label, d in (("re-tokenized", report.retokenized), ("re-rendered", report.rerendered)):
        if d is not None and d.first is not None:
            lines.append(
                f"{report.key} {label}: first differs at segment {d.first[0]} token {d.first[1]} ({d.where}): "
                f"sampled {list(d.sampled)!r} -> rebuilt {list(d.rebuilt)!r}"
            )
    if report.rerender_note:
        lines.append(f"{report.key} re-rendered: not measured ({report.rerender_note})")
    return lines
