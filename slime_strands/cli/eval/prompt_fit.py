"""Prompts longer than the context window are refused before the first request, naming their lines.

An episode renders its prompt (system prompt, the row's messages, the tools) with the chat template and stops
when the tokens leave no room to generate: with a 5 MB prompt that took half a minute of tokenizing per sample
and ended FAILED, n times over. Here every distinct prompt is rendered and counted once, as the episode will
render it, against the room a trajectory has (:meth:`SGLangModel.context_window`: ``strands.max_context_len``
and the server's window less SGLang's margin), before any episode starts. A window nobody reports is not
checked here (the server's refusal will say).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from ...agent.episode import _split_prompt
from ...template.messages import to_template_messages
from ...template.render import ChatRenderer
from ..errors import CommandError
from .data import EvalPrompt

__all__ = ["check_prompts_fit", "prompt_tokens"]

_SHOWN = 3


def prompt_tokens(
    renderer: ChatRenderer,
    prompt: EvalPrompt,
    system_prompt: str,
    tools: Sequence[Mapping[str, Any]] | None,
) -> int:
    """Tokens of ``prompt`` as an episode's first request holds them (its own system message, else
    ``system_prompt``; the tools; the generation prompt)."""
    system, history, last = _split_prompt(prompt.prompt, system_prompt)  # what run_episode does with it
    messages = to_template_messages([*history, {"role": "user", "content": last}], images=False)
    if system:
        messages.insert(0, {"role": "system", "content": system})
    return len(renderer.encode(renderer.render(messages, tools=tools)))


async def check_prompts_fit(
    prompts: Sequence[EvalPrompt],
    renderer: ChatRenderer,
    system_prompt: str,
    tools: Sequence[Mapping[str, Any]] | None,
    window: int | None,
    *,
    data: str,
) -> None:
    """CommandError naming every prompt of ``prompts`` that leaves no token to generate in ``window``."""
    if window is None:
        return

    def count_all() -> list[tuple[EvalPrompt, int]]:
        counted = ((p, prompt_tokens(renderer, p, system_prompt, tools)) for p in prompts)
        return [(p, n) for p, n in counted if n >= window]  # at least one generated token must fit

    too_long = await asyncio.get_running_loop().run_in_executor(None, count_all)
    if not too_long:
        return
    shown = ", ".join(f"line {p.line} ({n} tokens)" for p, n in too_long[:_SHOWN])
    more = f" and {len(too_long) - _SHOWN} more" if len(too_long) > _SHOWN else ""
    raise CommandError(
        f"{data}: {len(too_long)} prompt(s) leave no room to generate in the {window} tokens a trajectory may "
        f"hold: {shown}{more}",
        hint="shorten or drop those rows (or --limit before them), or give the model a longer window (SGLang's "
        "--context-length, strands.max_context_len)",
    )
