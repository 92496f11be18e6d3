"""One finished eval episode as a row of the trajectory file: the agent's conversation in chat-template form
and one token segment per context window, exactly as the episode recorded them.

The file format (:mod:`slime_strands.trajectories.file`) only reads and writes rows; building a row needs the
eval's prompt, the episode record and the chat template's message form, which live above it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ...agent.record import EpisodeRecord
from ...code_grading import CodeVerdict
from ...template.messages import to_template_messages, to_template_tools
from ...trajectories.config_digest import ConfigDigest
from ...trajectories.file import SavedImage, SavedSegment, SavedSpan, TrajectoryRow, row_key
from .data import EvalPrompt

__all__ = ["ERROR_CHARS", "episode_row", "template_tools"]

ERROR_CHARS = 4000
"""Longest ``error`` a row keeps (head and tail)."""


def template_tools(tools: Sequence[Any]) -> list[dict[str, Any]] | None:
    """The agent's Strands tools as the chat template sees them (what ``tools`` in a row holds)."""
    return to_template_tools([tool.tool_spec for tool in tools])


def episode_row(
    prompt: EvalPrompt,
    sample: int,
    record: EpisodeRecord,
    reward: float,
    *,
    tokenizer: str,
    tools: list[dict[str, Any]] | None,
    chat_template_kwargs: Mapping[str, Any],
    config: ConfigDigest | None = None,
    code: CodeVerdict | None = None,
) -> TrajectoryRow:
    """The row of sample ``sample`` of ``prompt``: its episode's conversation, token segments and record;
    ``config``: the digests of the configuration that ran it (what an eval resume checks: a row without them is
    not resumed); ``code``: the code reward's verdict (``reward.kind: code``), kept for ``inspect``."""
    segments = _segments(record)
    kept = dataclasses.replace(record, error=_bounded(record.error))
    return TrajectoryRow(
        key=row_key(prompt.index, sample),
        prompt_index=prompt.index,
        sample=sample,
        dataset=prompt.dataset,
        prompt=prompt.prompt,
        label=prompt.label,
        prompt_digest=prompt.digest,
        tokenizer=tokenizer,
        messages=_conversation(record) if segments else [],  # nothing generated: the prompt says it all
        segments=segments,
        response=record.response,
        reward=float(reward),
        status=record.treatment.status,
        record=EpisodeRecord.from_metadata(kept.to_metadata()),  # what the file keeps: no trajectory
        tools=tools,
        chat_template_kwargs=dict(chat_template_kwargs),
        config=config,
        code=code,
    )


def _segments(record: EpisodeRecord) -> list[SavedSegment]:
    """One token segment per trajectory segment of the episode (several after context compaction or with
    collected sub-agents), each with what the episode record says of it. The record lists only segments with
    tokens after their prompt: an episode that generated nothing has none, and neither has its row (its
    prompt's tokens alone are no trajectory, and a prompt that did not fit the window made rows of 85 MB)."""
    parts = [(s.trajectory, s.to_dict()) for s in record.segments if s.trajectory is not None]
    return [
        SavedSegment(
            tm.token_ids,
            tm.loss_mask,
            tm.logprobs,
            [
                SavedSpan(
                    s.kind,
                    s.start,
                    s.end,
                    None if s.info is None else s.info.finish_reason,
                    None if s.info is None else s.info.weight_version,
                )
                for s in tm.spans
            ],
            info,
            [SavedImage(p.start, p.image.tokens, p.image.data_uri) for p in tm.images],
        )
        for tm, info in parts
        if len(tm)
    ]


def _bounded(error: str | None) -> str | None:
    """An error message of at most :data:`ERROR_CHARS` characters, head and tail (a server's error body can
    echo a whole request)."""
    if error is None or len(error) <= ERROR_CHARS:
        return error
    half = ERROR_CHARS // 2
    return f"{error[:half]} ... [{len(error) - 2 * half} characters cut] ... {error[-half:]}"


def _conversation(record: EpisodeRecord) -> list[dict[str, Any]]:
    """The agent's messages in chat-template form, each assistant turn with its reasoning (what a text-based
    framework would keep and re-render)."""
    messages = to_template_messages(record.messages, images=False)
    reasoning = [_reasoning(m) for m in record.messages if m.get("role") == "assistant"]
    assistants = [m for m in messages if m["role"] == "assistant"]
    for message, text in zip(assistants, reasoning, strict=True):
        if text is not None:
            message["reasoning_content"] = text
    if record.system_prompt:
        messages.insert(0, {"role": "system", "content": record.system_prompt})
    return messages


def _reasoning(message: Mapping[str, Any]) -> str | None:
    texts = [
        str(block["reasoningContent"].get("reasoningText", {}).get("text", ""))
        for block in message.get("content") or []
        if "reasoningContent" in block
    ]
    return "".join(texts) if texts else None
