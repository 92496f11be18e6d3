"""Prompts longer than the context window are refused before the first request, naming their lines.

An episode renders its prompt (system prompt, the row's messages, the tools) with the chat template and stops
when the tokens leave no room to generate: with a 5 MB prompt that took half a minute of tokenizing per sample
and ended FAILED, n times over. Here every distinct prompt is rendered and counted once, as the episode will
render it, against the room a trajectory has (:meth:`SGLangModel.context_window`: ``strands.max_context_len``
and the server's window less SGLang's margin), before any episode starts; a vision-language model's images
count as the pads the server expands them into. A window nobody reports is not checked here (the server's
refusal will say).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from ...agent.episode import _split_prompt
from ...errors import InputError
from ...provider.images import Vision
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
    vision: Vision | None = None,
) -> int:
    """Tokens of ``prompt`` as an episode's first trajectory holds them (its own system message, else
    ``system_prompt``; the tools; the generation prompt; with ``vision``, each image expanded to its pads)."""
    source = prompt.agent_prompt() if vision is not None else prompt.prompt
    system, history, last = _split_prompt(source, system_prompt)  # what run_episode does with it
    conversation = [*history, {"role": "user", "content": last}]
    messages = to_template_messages(conversation, images=vision is not None)
    if system:
        messages.insert(0, {"role": "system", "content": system})
    tokens = len(renderer.encode(renderer.render(messages, tools=tools)))
    if vision is not None:  # each image rendered as one pad, expanded to its own count
        tokens += sum(
            vision.image(block["image"]).tokens - 1
            for message in conversation
            for block in message["content"]
            if "image" in block
        )
    return tokens


async def check_prompts_fit(
    prompts: Sequence[EvalPrompt],
    renderer: ChatRenderer,
    system_prompt: str,
    tools: Sequence[Mapping[str, Any]] | None,
    window: int | None,
    *,
    data: str,
    vision: Vision | None = None,
) -> None:
    """CommandError naming every prompt of ``prompts`` that leaves no token to generate in ``window`` (a
    vision-language model's images counted as the pads they expand into), or whose image cannot be used."""
    if window is None:
        return

    def count(prompt: EvalPrompt) -> int:
        try:
            return prompt_tokens(renderer, prompt, system_prompt, tools, vision)
        except InputError as exc:
            raise CommandError(
                f"{data}: line {prompt.line}: {exc}",
                hint=exc.hint or "fix or drop that row (data_prep writes each image as a data URI)",
            ) from exc

    def count_all() -> list[tuple[EvalPrompt, int]]:
        counted = ((p, count(p)) for p in prompts)
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
