"""The trajectory file: one JSON line per agent episode, written by ``slime-strands eval --out`` and read by
``inspect`` and ``drift``.

A line (schema ``slime-strands/trajectory/v1``)::

    {"schema": "slime-strands/trajectory/v1",
     "key": "3:1", "prompt_index": 3, "sample": 1,        # the row key: prompt index + sample number
     "dataset": "aime-2024", "prompt": [{"role": "user", "content": "..."}], "label": "34",
     "prompt_digest": "...",                              # the prompt and label's hash (resume checks it)
     "config": {"settings": "...", "sampling": "...", "tokenizer": "...", "tools": "...", "model": "..."},
                                 # digests of the configuration that made it (resume checks them)
     "tokenizer": "Qwen/Qwen3-8B", "chat_template_kwargs": {}, "tools": [...],   # to re-render it
     "messages": [...],          # the agent's conversation in chat-template form (system, user,
                                 # assistant with reasoning_content / tool_calls, tool results)
     "segments": [{"token_ids": [...], "loss_mask": [...], "logprobs": [...],
                   "spans": [{"kind": "prompt" | "generated" | "observation",
                              "start": 0, "end": 612, "finish_reason": null}, ...],
                   "info": {}}],          # what the episode record says of the segment, if anything
     "response": "...", "reward": 1.0, "status": "COMPLETED", "termination": "end_turn", "error": null,
     "metrics": {"turns": 2, "tool_calls": 1, "parse_errors": {}, ...},   # the episode record's counters
     "code": {"status": "failed", "passed": 0, "total": 1, "detail": "test 1: ...", ...}}
                                 # code_reward's verdict (reward.kind: code), else null

In memory the row holds the typed episode record (:class:`~slime_strands.agent.record.EpisodeRecord`, without
its trajectory): ``termination``, ``error`` and ``metrics`` of a line are that record, saved. A counter this
version does not know (written by a later one) is ignored when reading.

``segments`` holds one entry per context window the episode used: an ordinary episode has exactly one (none
when it generated nothing: a prompt alone is no trajectory); an episode whose history was compacted has one
per window, in order, each an exact token-in/token-out sequence of its own, and ``messages`` is then the
conversation of the LAST one. ``info`` describes a segment of such an episode (which agent, what opened and
closed it), as its episode record does; it is empty for an ordinary episode. ``spans`` are each window's
provenance runs (``TokenManager.spans``): the prompt, every generated turn (``loss_mask`` 1, with its finish
reason) and the template / tool tokens between turns (``loss_mask`` 0). In memory a line's segments are
:class:`SavedSegment` s with :class:`SavedSpan` s: the file's form of a trajectory segment and of a token
manager's spans (no ids of requests, no ``meta_info``).

Writing is crash-safe: each line goes out in one append; a run killed mid-line leaves a last line without its
newline, which readers skip and the next writer cuts off before appending.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..agent.record import EpisodeRecord
from ..code_grading import CodeVerdict
from ..errors import InputError
from ..strict_reader import StrictReader
from .config_digest import ConfigDigest

__all__ = [
    "SCHEMA",
    "SavedSegment",
    "SavedSpan",
    "TrajectoryFileError",
    "TrajectoryRow",
    "TrajectoryWriter",
    "complete_lines",
    "has_torn_tail",
    "iter_rows",
    "parse_row",
    "row_key",
]

SCHEMA = "slime-strands/trajectory/v1"
_KINDS = ("prompt", "generated", "observation")
_TOP_LEVEL = ("termination", "error", "evaluation")  # record fields kept beside ``metrics``, not inside
_FILE_HINT = "inspect and drift read the files `slime-strands eval --out FILE.jsonl` writes"


def row_key(prompt_index: int, sample: int) -> str:
    """The stable key of a row: the same prompt and sample number give the same key in every run."""
    return f"{prompt_index}:{sample}"


class TrajectoryFileError(InputError):
    """A trajectory file that cannot be read as asked: one line naming the file (and line), a hint."""


@dataclass(frozen=True)
class SavedSpan:
    """A run of one segment's tokens with one provenance (the file's form of a ``TokenManager`` span)."""

    kind: str
    start: int
    end: int
    finish_reason: str | None = None
    """The server's finish reason of a generated turn (``stop``, ``length``, ``abort``)."""
    weight_version: str | None = None
    """The server's ``weight_version`` of a generated turn: the policy that wrote it (an episode continued across
    a weight update has turns of several)."""


@dataclass(frozen=True)
class SavedImage:
    """An image of a segment (a vision-language model's), saved once: its run of pads starts at ``start``."""

    start: int
    tokens: int
    data_uri: str


@dataclass(frozen=True)
class SavedSegment:
    """One context window of an episode, as the file saves it: exactly the token ids the server saw, and what
    was trained."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    spans: list[SavedSpan]
    info: dict[str, Any] = field(default_factory=dict)
    """What the episode record says of the segment (e.g. its agent, what opened and closed it); shown as is."""
    images: list[SavedImage] = field(default_factory=list)
    """Its images in order, each once (the data URI every request sent), where their pads are."""

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class TrajectoryRow:
    """One line of the trajectory file (see the module docstring)."""

    key: str
    prompt_index: int
    sample: int
    dataset: str
    prompt: list[dict[str, Any]]
    label: str
    prompt_digest: str
    tokenizer: str
    messages: list[dict[str, Any]]
    segments: list[SavedSegment]
    response: str
    reward: float
    status: str
    record: EpisodeRecord
    """The episode's record: how it ended and its counters (no trajectory: the segments hold it)."""
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    config: ConfigDigest | None = None
    """What configuration made the row (None in rows written before rows carried it)."""
    code: CodeVerdict | None = None
    """The code reward's verdict (``reward.kind: code``): the sandbox's status, the failing test's first lines;
    None for another reward, or an episode that was not graded (FAILED, ABORTED)."""

    @property
    def termination(self) -> str:
        """How the episode ended (a :class:`~slime_strands.agent.record.Termination` value)."""
        return self.record.termination.value

    @property
    def error(self) -> str | None:
        """Why a FAILED episode failed."""
        return self.record.error

    @property
    def correct(self) -> bool:
        """Eval rewards are plain accuracy: 1.0 is a correct answer."""
        return self.reward == 1.0

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "key": self.key,
            "prompt_index": self.prompt_index,
            "sample": self.sample,
            "dataset": self.dataset,
            "prompt": self.prompt,
            "label": self.label,
            "prompt_digest": self.prompt_digest,
            "config": None if self.config is None else self.config.to_json(),
            "tokenizer": self.tokenizer,
            "chat_template_kwargs": self.chat_template_kwargs,
            "tools": self.tools,
            "messages": self.messages,
            "segments": [
                {
                    "token_ids": s.token_ids,
                    "loss_mask": s.loss_mask,
                    "logprobs": s.logprobs,
                    "spans": [
                        {
                            "kind": p.kind,
                            "start": p.start,
                            "end": p.end,
                            "finish_reason": p.finish_reason,
                            **({} if p.weight_version is None else {"weight_version": p.weight_version}),
                        }
                        for p in s.spans
                    ],
                    "info": s.info,
                    **(
                        {
                            "images": [
                                {"start": i.start, "tokens": i.tokens, "data_uri": i.data_uri}
                                for i in s.images
                            ]
                        }
                        if s.images
                        else {}
                    ),
                }
                for s in self.segments
            ],
            "response": self.response,
            "reward": self.reward,
            "status": self.status,
            "termination": self.termination,
            "error": self.error,
            "metrics": {k: v for k, v in self.record.to_metadata().items() if k not in _TOP_LEVEL},
            "code": None if self.code is None else self.code.to_metadata(),
        }

    @classmethod
    def from_json(cls, data: Any) -> TrajectoryRow:
        """Read back :meth:`to_json`; ValueError saying what is wrong with anything else. Keys this version
        does not know are ignored (a later version's); ``config``, ``tools``, ``chat_template_kwargs`` and
        ``code`` may be absent (rows written before they were saved)."""
        d = StrictReader(data, "row")
        schema = d.optional("schema")
        if schema != SCHEMA:
            raise ValueError(f"schema is {schema!r}, expected {SCHEMA!r}")
        return cls(
            **d.scalars(cls, negative=False),
            prompt=d.items("prompt"),
            messages=d.items("messages"),
            segments=[_segment(s, f"segments[{i}]") for i, s in enumerate(d.items("segments"))],
            record=_record(d),
            tools=d.optional("tools"),
            chat_template_kwargs=dict(d.optional("chat_template_kwargs") or {}),
            config=ConfigDigest.from_json(d.optional("config")),
            code=_code(d.optional("code")),
        )


def _code(data: Any) -> CodeVerdict | None:
    """The code verdict of a row, None where it has none."""
    return None if data is None else CodeVerdict.from_metadata(data, "code")


def _record(d: StrictReader) -> EpisodeRecord:
    """The episode record of a row: its ``metrics`` with ``termination`` and ``error`` beside them."""
    metrics = d.optional("metrics") or {}
    if not isinstance(metrics, Mapping):
        raise ValueError(f"metrics must be an object, got {metrics!r}")
    saved = {**metrics, "termination": d.get("termination"), "error": d.optional("error"), "evaluation": True}
    return EpisodeRecord.from_metadata(saved, unknown_keys=True)


def _segment(data: Any, where: str) -> SavedSegment:
    d = StrictReader(data, where)
    ids, mask, logprobs = d.items("token_ids"), d.items("loss_mask"), d.items("logprobs")
    if not len(ids) == len(mask) == len(logprobs):
        raise ValueError(
            f"{where}: {len(ids)} token_ids, {len(mask)} loss_mask and {len(logprobs)} logprobs differ in length"
        )
    spans: list[SavedSpan] = []
    for j, item in enumerate(d.items("spans")):
        span = StrictReader(item, f"{where}.spans[{j}]")
        kind, start, end = span.text("kind"), span.integer("start"), span.integer("end")
        position = spans[-1].end if spans else 0
        if kind not in _KINDS or start != position or end < start:
            raise ValueError(f"{where}: spans must cover the tokens in order, got {item!r} at {position}")
        spans.append(
            SavedSpan(
                kind,
                start,
                end,
                span.optional_text("finish_reason"),
                span.optional_text("weight_version") if span.has("weight_version") else None,
            )
        )
    if (spans[-1].end if spans else 0) != len(ids):
        raise ValueError(f"{where}: spans cover {spans[-1].end if spans else 0} of {len(ids)} tokens")
    info = d.optional("info") or {}
    if not isinstance(info, Mapping):
        raise ValueError(f"{where}: info must be an object")
    images = [
        _image(item, f"{where}.images[{k}]", len(ids)) for k, item in enumerate(d.optional("images") or [])
    ]
    return SavedSegment(
        [int(t) for t in ids], [int(m) for m in mask], [float(x) for x in logprobs], spans, dict(info), images
    )


def _image(data: Any, where: str, length: int) -> SavedImage:
    d = StrictReader(data, where)
    image = SavedImage(
        d.integer("start", negative=False), d.integer("tokens", negative=False), d.text("data_uri")
    )
    if (
        image.tokens < 1
        or image.start + image.tokens > length
        or not image.data_uri.startswith("data:image/")
    ):
        raise ValueError(f"{where}: an image's pads must lie in the segment and its data be a data:image URI")
    return image


# -- reading -----------------------------------------------------------------------------------------


def iter_rows(path: str | Path) -> Iterator[tuple[int, TrajectoryRow]]:
    """``(line number, row)`` of every complete line; a last line without its newline (a run killed mid-write)
    is skipped. TrajectoryFileError names the first malformed line."""
    for number, raw in complete_lines(path):
        yield number, parse_row(path, number, raw)


def parse_row(path: str | Path, number: int, raw: bytes) -> TrajectoryRow:
    """Line ``number`` of ``path`` as a row; TrajectoryFileError naming the line when it is not one."""
    try:
        return TrajectoryRow.from_json(json.loads(raw))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise TrajectoryFileError(f"{path}:{number}: not a trajectory row: {exc}", hint=_FILE_HINT) from exc


def complete_lines(path: str | Path) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes)`` of every non-blank line that ends with its newline; TrajectoryFileError when
    there is no such file."""
    source = Path(path)
    if not source.is_file():
        raise TrajectoryFileError(f"{path}: no such trajectory file", hint=_FILE_HINT)
    with source.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.endswith(b"\n"):
                return  # torn last line
            if raw.strip():
                yield number, raw


def has_torn_tail(path: str | Path) -> bool:
    """True when the file's last line lacks its newline (written by a run that was killed)."""
    with Path(path).open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() == 0:
            return False
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) != b"\n"


# -- writing -----------------------------------------------------------------------------------------


class TrajectoryWriter:
    """Appends rows, one ``write`` per line; opening cuts off a torn last line left by a killed run."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.exists() and has_torn_tail(self.path):
            _cut_torn_tail(self.path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, row: TrajectoryRow) -> None:
        if self._fd is None:
            raise ValueError("the trajectory writer is closed")
        try:
            text = json.dumps(row.to_json(), ensure_ascii=False)
            data = (text + "\n").encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates in tool output: escape them instead
            data = (json.dumps(row.to_json()) + "\n").encode("ascii")
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _cut_torn_tail(path: Path, chunk: int = 1 << 16) -> None:
    """Truncate after the last newline, reading backwards (the file may hold gigabytes of good rows)."""
    with path.open("r+b") as handle:
        end = handle.seek(0, os.SEEK_END)
        while end > 0:
            start = max(0, end - chunk)
            handle.seek(start)
            at = handle.read(end - start).rfind(b"\n")
            if at >= 0:
                handle.truncate(start + at + 1)
                return
            end = start
        handle.truncate(0)
