"""Tool outputs cut to fit: to ``max_tool_output_tokens`` each, and evenly to the room a turn has left.

A tool output is what the model's program printed: possibly megabytes. One longer than
``max_tool_output_tokens`` keeps its head and tail around a marker saying how many tokens were cut; with
``fit_tool_outputs``, outputs that would leave a turn fewer than ``min_turn_tokens`` to write are shrunk
evenly so they fit (context management may instead start a segment that holds them whole). An image of a tool
output is shown if it can be shown at all and its pads fit what ``max_tool_output_tokens`` leaves, otherwise a
line says why in its place, and the text beside the images shown is cut to what they leave. All work on the
template-form messages of one render, in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InputError
from ..template.render import ChatRenderer
from .images import TrajectoryImage, Vision
from .model_stats import ModelStats

__all__ = ["FIGURE_NAME_KEY", "ToolOutputFitter"]

_MIN_TRUNCATED_TOOL_TOKENS = 32
_CHARS_PER_TOKEN_BOUND = 16
FIGURE_NAME_KEY = "slime_strands_file"
"""Key of a Strands image content naming the file a sandbox run saved it as (``sandbox.return_figures``): the
line beside it says ``[figure NAME: attached]`` when the model is shown it, ``[figure NAME not shown: why]``
when not."""

_MARKER = "\n... [{} tokens of tool output truncated] ...\n"

Encoded = dict[int, list[int]]
"""Token ids of tool messages already encoded, by ``id()`` of the message."""


class ToolOutputFitter:
    """Cuts the tool outputs of a model's renders (its live config: ``max_tool_output_tokens``,
    ``fit_tool_outputs``, ``min_turn_tokens``); cuts are counted in the ``stats`` a render passes."""

    def __init__(self, renderer: ChatRenderer, config: Mapping[str, Any]) -> None:
        self._renderer = renderer
        self._config = config

    def fit_image_outputs(
        self, template_messages: list[dict[str, Any]], vision: Vision | None, stats: ModelStats | None
    ) -> dict[int, TrajectoryImage]:
        """Fit, in place, each tool output that holds images. An image the model cannot be shown is replaced by
        a line saying why: one that is no image, a decompression bomb or far too large (what model-written code
        may save), and one whose pads would take the output past ``max_tool_output_tokens`` (each image in
        order is shown if its pads fit what the output has left; a refused one counts as a cut). The episode
        goes on with the output, as with any tool error. The text beside the images shown is cut to what they
        leave of the limit (shared evenly by its parts). An image of a user message is the data's and stays (an
        unusable one fails the sample with its reason). An output left without images is text again (cut like
        any). Returns the images shown, by ``id()`` of their image block (the render reads each image once)."""
        shown: dict[int, TrajectoryImage] = {}
        if vision is None:
            return shown
        limit = self._config["max_tool_output_tokens"]
        for message in template_messages:
            if message["role"] != "tool" or not isinstance(message["content"], list):
                continue
            left = limit
            texts = [part for part in message["content"] if part.get("type") == "text"]  # the tool's own
            parts: list[dict[str, Any]] = []
            for part in message["content"]:
                if part.get("type") != "image":
                    parts.append(part)
                    continue
                name = part["image"].get(FIGURE_NAME_KEY)
                try:
                    image = vision.image(part["image"])
                except InputError as exc:
                    parts.append(_not_shown(str(exc), name))
                    continue
                tokens = image.tokens
                if left is None or tokens <= left:
                    left = None if left is None else left - tokens
                    shown[id(part["image"])] = image
                    if name is not None:
                        parts.append({"type": "text", "text": f"\n[figure {name}: attached]"})
                    parts.append(part)
                    continue
                parts.append(
                    _not_shown(
                        f"its {tokens} tokens would take the output past the {limit} a tool output may hold "
                        "(max_tool_output_tokens): save it smaller",
                        name,
                    )
                )
                if stats is not None:
                    stats.tool_outputs_truncated += 1
            message["content"] = parts
            if all(part.get("type") == "text" for part in parts):
                message["content"] = "\n".join(part["text"] for part in parts)
            elif left is not None and texts:
                self._cut_texts(texts, max(left // len(texts), _MIN_TRUNCATED_TOOL_TOKENS), stats)
        return shown

    def _cut_texts(self, texts: list[dict[str, Any]], limit: int, stats: ModelStats | None) -> None:
        """Cut each text part (``{"type": "text", "text"}``) to ``limit`` tokens, in place."""
        views = [{"content": part["text"]} for part in texts]
        self._cut_contents(views, limit, stats)
        for part, view in zip(texts, views, strict=True):
            part["text"] = view["content"]

    def cut_to_limit(self, tool_msgs: list[dict[str, Any]], stats: ModelStats | None) -> Encoded:
        """Cut each tool output to ``max_tool_output_tokens`` (head + tail); returns the token ids it computed.

        An output is encoded on its own only when it may be too long (a token is at least one UTF-8 byte, so
        one of at most ``limit`` bytes fits): the continuation encodes it anyway.
        """
        limit = self._config["max_tool_output_tokens"]
        return self._cut_contents(tool_msgs, limit, stats) if limit else {}

    def _cut_contents(self, tool_msgs: list[dict[str, Any]], limit: int, stats: ModelStats | None) -> Encoded:
        """Cut each message's ``content`` to ``limit`` tokens (head + tail), in place; the ids it computed."""
        for message in tool_msgs:  # bound tokenizer work on huge outputs: no token survives beyond this
            message["content"] = _cut_chars(message["content"], limit * _CHARS_PER_TOKEN_BOUND)
        long = [m for m in tool_msgs if len(m["content"].encode()) > limit]
        encoded = {id(m): self._renderer.encode(m["content"]) for m in long}
        self._cut(long, encoded, limit, stats)
        return encoded

    def shrink_to_room(
        self,
        tool_msgs: list[dict[str, Any]],
        encoded: Encoded,
        used: int,
        room: int | None,
        stats: ModelStats | None,
    ) -> bool:
        """With ``fit_tool_outputs``: shrink every tool output evenly so a render of ``used`` tokens that holds
        them leaves ``min_turn_tokens`` of ``room`` to generate; True when they were shrunk (render again)."""
        floor = self._config["min_turn_tokens"]
        if room is None or not tool_msgs or not self._config["fit_tool_outputs"] or used + floor <= room:
            return False
        for m in tool_msgs:
            if id(m) not in encoded:
                encoded[id(m)] = self._renderer.encode(m["content"])
        current = sum(len(encoded[id(m)]) for m in tool_msgs)
        per_tool = (current - (used + floor - room)) // len(tool_msgs)
        if per_tool < _MIN_TRUNCATED_TOOL_TOKENS:
            return False
        self._cut(tool_msgs, encoded, per_tool, stats)
        return True

    def _cut(
        self, tool_msgs: list[dict[str, Any]], encoded: Encoded, limit: int, stats: ModelStats | None
    ) -> None:
        renderer = self._renderer
        for message in tool_msgs:
            ids = encoded[id(message)]
            if len(ids) <= limit:
                continue
            keep = max(limit - len(renderer.encode(_MARKER.format(len(ids)))), 2)
            head, tail = ids[: keep - keep // 2], ids[len(ids) - keep // 2 :]
            dropped = len(ids) - len(head) - len(tail)
            message["content"] = renderer.decode(head) + _MARKER.format(dropped) + renderer.decode(tail)
            encoded[id(message)] = renderer.encode(message["content"])
            if stats is not None:
                stats.tool_outputs_truncated += 1


def _cut_chars(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return (
        f"{text[:half]}\n... [{len(text) - 2 * half} characters of tool output truncated] ...\n{text[-half:]}"
    )


def _not_shown(why: str, name: str | None) -> dict[str, str]:
    """The line in place of an image the model cannot be shown: the file it is (a figure's) and why."""
    what = f"figure {name}" if name is not None else "image"
    return {"type": "text", "text": f"\n[{what} not shown: {why}]"}
