"""A turn's input tokens: the prompt on a trajectory's first call, then only the messages added since.

The first call renders system prompt, tools and messages with the chat template as a whole (a compacted history
re-rendered as a new segment's prompt too); every later call renders only the new messages (tool results, user
turns) after the last generated token (:class:`~slime_strands.template.render.ChatRenderer`), their tool
outputs cut to fit (:class:`~slime_strands.provider.tool_output.ToolOutputFitter`). Large inputs are rendered
off the event loop. Images (a vision-language model's :class:`~slime_strands.provider.images.Vision`) are rendered
by the template as one pad each and expanded here to the server's count, each placed where its run starts.
"""

from __future__ import annotations

import json
from typing import Any

from strands.types.content import Messages
from strands.types.tools import ToolSpec

from ..errors import ConfigurationError
from ..template.messages import image_items, to_template_messages, to_template_tools
from ..template.render import ChatRenderer
from ..tool_parsers import ToolSchemas
from .budgets import TurnBudgets
from .checkpoint import PendingTurn
from .images import ImagePlacement, TrajectoryImage, Vision
from .model_stats import ModelStats
from .offload import offload
from .token_manager import TokenManager
from .tool_output import ToolOutputFitter
from .turn_state import TrajectoryError, TurnState

__all__ = ["InputRenderer"]

Tools = list[dict[str, Any]] | None
"""The template's tool list (OpenAI-style function specs), None for none."""


class InputRenderer:
    """Renders the input of one model's turns (see the module docstring)."""

    def __init__(
        self,
        renderer: ChatRenderer,
        fitter: ToolOutputFitter,
        budgets: TurnBudgets,
        vision: Vision | None = None,
    ) -> None:
        self._renderer = renderer
        self._vision = vision
        self._fitter = fitter
        self._budgets = budgets
        self._tools_of: tuple[Any, Tools, ToolSchemas] | None = None

    def template_tools(self, tool_specs: list[ToolSpec] | None) -> tuple[Tools, ToolSchemas]:
        """The template's tool list and the parser's schemas; the same objects while the specs are equal (Strands
        passes a fresh copy every call), so the renderer's cache keys them without serialising them again."""
        if self._tools_of is None or self._tools_of[0] != tool_specs:
            tools = to_template_tools(tool_specs)
            schemas: ToolSchemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools or []}
            self._tools_of = (tool_specs, tools, schemas)
        return self._tools_of[1], self._tools_of[2]

    async def render(
        self,
        tm: TokenManager,
        state: TurnState,
        stats: ModelStats,
        messages: Messages,
        system_prompt: str | None,
        tools: Tools,
        continued: PendingTurn | None,
    ) -> tuple[list[int], list[ImagePlacement], bool]:
        """The turn's input: the prompt (added to ``tm``) on the first call, else the new messages' tokens and
        images (added once the server accepted them); whether the turn starts inside a reasoning block."""
        if continued is not None:  # a turn an abort cut: its input is in the trajectory, partial output too
            return [], [], continued.starts_in_reasoning
        if len(tm) == 0:
            size = _content_chars(messages) + len(system_prompt or "") + len(json.dumps(tools or []))
            room = await self._budgets.room(tm, prompt=True)
            prompt_text, prompt_ids, images = await offload(
                size, self._render_prompt, messages, system_prompt, tools, room, state, stats
            )
            tm.add_prompt(prompt_ids, images)
            return [], [], self._renderer.opens_reasoning(prompt_text)
        prompt_text, delta_ids, images = await self._render_new_messages(
            tm, state, stats, messages, system_prompt, tools
        )
        return delta_ids, images, self._renderer.opens_reasoning(prompt_text)

    def _render_prompt(
        self,
        messages: Messages,
        system_prompt: str | None,
        tools: Tools,
        room: int | None,
        state: TurnState,
        stats: ModelStats,
    ) -> tuple[str, list[int], list[ImagePlacement]]:
        renderer = self._renderer
        template_messages = to_template_messages(messages, tool_ids=state.template_ids)
        shown = self._fitter.fit_image_outputs(template_messages, self._vision, stats=None)
        images = self._images(template_messages, shown)
        # A compacted history re-rendered as a new segment's prompt: its tool outputs as they were cut before,
        # and shrunk when they do not fit the new segment either.
        tool_msgs = _text_tool_messages(template_messages)
        encoded = self._fitter.cut_to_limit(tool_msgs, stats=None)
        if system_prompt:
            template_messages.insert(0, {"role": "system", "content": system_prompt})
        text = renderer.render(template_messages, tools=tools)
        ids = renderer.encode(text)
        if self._fitter.shrink_to_room(tool_msgs, encoded, len(ids) + _added_pads(images), room, stats):
            text = renderer.render(template_messages, tools=tools)
            ids = renderer.encode(text)
        return (text, *self._expand(ids, images))

    def _images(
        self, template_messages: list[dict[str, Any]], shown: dict[int, TrajectoryImage]
    ) -> list[TrajectoryImage]:
        """The images the messages show, in the order the template renders them (``shown``: the tool outputs'
        images already read, by ``id()`` of their block; an unusable image of a user message: InputError with
        the reason). An image for a model without an image processor is a ConfigurationError: every episode that
        holds one would fail the same way."""
        items = image_items(template_messages)
        if items and self._vision is None:
            raise ConfigurationError(
                "a message holds an image but the model has no image processor: use a vision-language checkpoint "
                "(slime: --hf-checkpoint with a vision_config and preprocessor_config.json; slime-strands eval: "
                "--tokenizer that folder; a library model: vision=load_vision(folder)), or keep images out of the "
                "data and the tools"
            )
        vision = self._vision
        return [shown.get(id(item)) or vision.image(item) for item in items] if vision is not None else []

    def _expand(
        self, ids: list[int], images: list[TrajectoryImage]
    ) -> tuple[list[int], list[ImagePlacement]]:
        """``ids`` with the rendered images' pads expanded to the server's count, and where each image is."""
        if self._vision is None or not images:
            return ids, []
        expanded, starts = self._vision.expand(ids, images)
        return expanded, [ImagePlacement(start, image) for start, image in zip(starts, images, strict=True)]

    async def _render_new_messages(
        self,
        tm: TokenManager,
        state: TurnState,
        stats: ModelStats,
        messages: Messages,
        system_prompt: str | None,
        tools: Tools,
    ) -> tuple[str, list[int], list[ImagePlacement]]:
        """Tokens of the messages added since the last answer (and their images), tool outputs cut to fit the
        budgets."""
        new = state.new_messages(messages)
        last = tm.last_span
        if last is None or last.kind != "generated" or last.info is None or last.info.finish_reason != "stop":
            raise TrajectoryError(
                "the previous turn did not finish with a stop (cut by max_tokens?): cannot continue"
            )
        # The continuation starts with the token that ends the assistant turn: the model's own stop token is
        # not repeated; a turn that stopped on another one (e.g. <|endoftext|>) is closed the template's way.
        template_messages = to_template_messages(
            new, tool_order=state.last_tool_ids, tool_ids=state.template_ids
        )
        room = await self._budgets.room(tm)
        size = sum(
            len(str(m.get("content") or "")) for m in template_messages if isinstance(m.get("content"), str)
        )
        return await offload(
            size,
            self._fit_continuation,
            template_messages,
            system_prompt,
            tools,
            room,
            last.token_ids[-1],
            stats,
        )

    def _fit_continuation(
        self,
        template_messages: list[dict[str, Any]],
        system_prompt: str | None,
        tools: Tools,
        room: int | None,
        after: int,
        stats: ModelStats,
    ) -> tuple[str, list[int], list[ImagePlacement]]:
        renderer = self._renderer
        shown = self._fitter.fit_image_outputs(template_messages, self._vision, stats)
        images = self._images(template_messages, shown)
        tool_msgs = _text_tool_messages(template_messages)
        encoded = self._fitter.cut_to_limit(tool_msgs, stats)
        text, ids = renderer.encode_continuation(
            template_messages, system=system_prompt, tools=tools, after=after
        )
        if self._fitter.shrink_to_room(tool_msgs, encoded, len(ids) + _added_pads(images), room, stats):
            text, ids = renderer.encode_continuation(
                template_messages, system=system_prompt, tools=tools, after=after
            )
        return (text, *self._expand(ids, images))


def _added_pads(images: list[TrajectoryImage]) -> int:
    """Tokens the images add to a render once expanded (each is rendered as one pad)."""
    return sum(image.tokens - 1 for image in images)


def _text_tool_messages(template_messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool messages whose output is text only (what the fitter cuts; a result with images is kept whole)."""
    return [m for m in template_messages if m["role"] == "tool" and isinstance(m["content"], str)]


def _content_chars(messages: Messages) -> int:
    """Characters of text in Strands messages (text blocks and tool results), to size tokenizer work."""
    total = 0
    for message in messages:
        for block in message.get("content") or []:
            if "text" in block:
                total += len(block["text"])
            elif "toolResult" in block:
                total += sum(
                    len(str(part.get("text") or part.get("json") or ""))
                    for part in block["toolResult"].get("content") or []
                )
    return total
