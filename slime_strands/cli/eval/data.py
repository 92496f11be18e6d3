"""The prompts of an eval: slime's JSONL (what ``python -m data_prep.prepare`` writes), every row checked
before the first request, and bad rows reported by line number (a typo on line 2,000 must not surface as a
FAILED trajectory an hour into the run)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_prep.prepare import IMAGE_PLACEHOLDER, RowError, validate_row

from ..errors import CommandError

__all__ = ["EvalPrompt", "load_prompts"]

_DATASET_KEYS = ("dataset", "source")
_SHOWN_ERRORS = 3
_DATA_HINT = (
    'each line must be a JSON object {"prompt": "..." or [{"role": "user", "content": "..."}], "label": "..."}, '
    "as `python -m data_prep.prepare --dataset aime-2024 --out FILE.jsonl` writes"
)


@dataclass(frozen=True)
class EvalPrompt:
    """One data row: the agent's prompt and the label the reward grades against."""

    index: int
    """0-based position among the file's rows (blank lines skipped): with the sample number, the row key."""
    line: int
    """1-based line of the file (for messages)."""
    prompt: list[dict[str, str]]
    label: str
    dataset: str
    """The row's ``dataset`` / ``source`` field (top level or in ``metadata``), else the file's stem."""
    metadata: dict[str, Any] = field(default_factory=dict)
    images: list[str] = field(default_factory=list)
    """The row's images (data_prep's ``images``: data URIs), one per ``<image>`` placeholder of the prompt."""

    @property
    def digest(self) -> str:
        """Identifies the prompt and label: a resumed ``--out`` file must hold trajectories of the same data."""
        payload = json.dumps([self.prompt, self.label, *self.images], ensure_ascii=False, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def agent_prompt(self) -> list[dict[str, Any]]:
        """The messages the agent starts from: each ``<image>`` placeholder the next image, as slime's
        ``--multimodal-keys`` builds them (``{"type": "image", "image": <data URI>}`` between text items)."""
        if not self.images:
            return self.prompt
        images = iter(self.images)
        messages: list[dict[str, Any]] = []
        for message in self.prompt:
            parts = re.split(f"({re.escape(IMAGE_PLACEHOLDER)})", message["content"])
            content = [
                {"type": "image", "image": next(images)}
                if part == IMAGE_PLACEHOLDER
                else {"type": "text", "text": part}
                for part in parts
                if part
            ]
            messages.append(
                {**message, "content": content if IMAGE_PLACEHOLDER in parts else message["content"]}
            )
        return messages


def load_prompts(path: str | Path, *, limit: int | None = None) -> list[EvalPrompt]:
    """The first ``limit`` rows (all by default) of a JSONL file; CommandError naming every bad line."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CommandError(
            f"{path}: no such data file",
            hint="prepare one with `python -m data_prep.prepare --dataset aime-2024 --out aime-2024.jsonl`",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"{path}: cannot read the data file: {exc}", hint=_DATA_HINT) from exc
    prompts: list[EvalPrompt] = []
    errors: list[str] = []
    index = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if limit is not None and index >= limit:
            break
        if not raw.strip():
            continue
        try:
            prompts.append(_parse(raw, index, number, source.stem))
        except RowError as exc:
            errors.append(f"line {number}: {exc.detail}")
        index += 1
    if errors:
        shown = "; ".join(errors[:_SHOWN_ERRORS])
        more = f" (and {len(errors) - _SHOWN_ERRORS} more)" if len(errors) > _SHOWN_ERRORS else ""
        raise CommandError(f"{path}: {len(errors)} bad row(s): {shown}{more}", hint=_DATA_HINT)
    if not prompts:
        raise CommandError(f"{path}: no rows", hint=_DATA_HINT)
    return prompts


def _parse(raw: str, index: int, line: int, default_dataset: str) -> EvalPrompt:
    try:
        row = json.loads(raw)
    except json.JSONDecodeError as exc:
        # json's own text may already end with "at" ("Unterminated string starting at"): one "at column N"
        what = exc.msg.removesuffix(" at")
        raise RowError("bad_json", f"invalid JSON ({what} at column {exc.colno})") from None
    images_key = "images" if isinstance(row, Mapping) and row.get("images") is not None else None
    checked = validate_row(row, integer_labels=False, images_key=images_key)
    _check_agent_prompt(checked["prompt"])
    metadata = checked.get("metadata", {})
    return EvalPrompt(
        index=index,
        line=line,
        prompt=checked["prompt"],
        label=checked["label"],
        dataset=_dataset_name(row, metadata) or default_dataset,
        metadata=metadata,
        images=checked.get("images", []),
    )


def _check_agent_prompt(messages: list[dict[str, str]]) -> None:
    """The agent takes an optional system message, then user / assistant turns ending with the user's."""
    first = 1 if messages[0]["role"] == "system" else 0
    body = messages[first:]
    for i, message in enumerate(body, start=first):
        if message["role"] not in ("user", "assistant"):
            raise RowError(
                "bad_role",
                f"message {i} has role {message['role']!r}: the agent's prompt is an optional first system "
                "message, then user and assistant messages",
            )
    if not body or body[-1]["role"] != "user":
        raise RowError("bad_prompt", "the prompt's last message must come from the user")


def _dataset_name(row: Any, metadata: Mapping[str, Any]) -> str | None:
    for source in (row, metadata):
        for key in _DATASET_KEYS:
            value = source.get(key) if isinstance(source, Mapping) else None
            if isinstance(value, str) and value.strip():
                return value.strip()
    return None
