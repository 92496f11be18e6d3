"""SGLang 0.5.23's expansion of images in a token-in request, for the stand-in (Qwen2.5-VL / Qwen3-VL).

What the real server does with ``input_ids`` + ``image_data`` (read in sglang 0.5.23,
``srt/managers/tokenizer_manager.py`` ``_tokenize_one_request``: a non-list ``image_data`` is wrapped in a list,
the ids go to the multimodal processor; ``srt/multimodal/processors/base_processor.py``:
``resolve_image_token_counts`` asks the HF processor's ``_get_num_multimodal_tokens(image_sizes=[(h, w)])`` per
image, ``_expand_input_ids`` keeps every id verbatim and replaces the i-th ``image_token_id`` with that many
pads; ``srt/multimodal/processors/qwen_vl.py`` matches ``<|vision_start|>(<|image_pad|>)+<|vision_end|>``), and
what it does with ids that break the contract (recorded on the real server, ``docs/testing.md``):

* one pad per image, as many pads as images: expanded; ``meta_info`` gains ``image_tokens``;
* no ``image_data``: a pad is an ordinary token;
* fewer images than placeholders: Qwen2.5-VL answers 400 "Prompt has N image placeholders but M image inputs
  were provided" (``legacy_load_mm_data``), Qwen3-VL 500;
* more images than placeholders: the extra ones are silently ignored;
* ids already expanded (a run of pads for one image): Qwen2.5-VL's request hangs, Qwen3-VL's fails with 500.

The stand-in expands with the same HF image processor arithmetic, answers SGLang's 400 where SGLang answers it,
and records a failure (the test fails at ``stop()``) wherever the real server would hang, crash or silently drop
an image: a client must never send those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..provider.images import Vision, image_bytes

__all__ = ["ExpandedImages", "expand_images", "pad_runs"]


@dataclass(frozen=True)
class ExpandedImages:
    """A request's ids as the server's model sees them, and the pads its images added in all."""

    input_ids: list[int]
    image_tokens: int


def expand_images(body: Mapping[str, Any], vision: Vision | None) -> ExpandedImages | tuple[int, str] | str:
    """The request's ids expanded (see the module docstring); ``(status, message)`` for SGLang's own error
    answer; a ``str`` for a request the real server would hang on, crash on or answer wrongly (a failure)."""
    images = body.get("image_data")
    ids: list[int] = body["input_ids"]
    if images is None:
        return ExpandedImages(ids, 0)
    if vision is None:
        return "image_data sent to a text model (the stand-in was started without vision=)"
    images = images if isinstance(images, list) else [images]
    runs = pad_runs(ids, vision.image_token_id)
    if any(length > 1 for _, length in runs):
        return (
            "image pads sent already expanded: the real Qwen2.5-VL server hangs on the request and Qwen3-VL's "
            "answers 500 (send one <|image_pad|> per image)"
        )
    if len(runs) > len(images):
        return 400, f"Prompt has {len(runs)} image placeholders but {len(images)} image inputs were provided"
    if len(runs) < len(images):
        return (
            f"{len(images)} images for {len(runs)} placeholders: the real server silently ignores the extra "
            "images"
        )
    counts = []
    for item in images:
        if not isinstance(item, str):
            return 400, "Invalid image"
        counts.append(_tokens(item, vision))
    out: list[int] = []
    previous = 0
    for (at, _), count in zip(runs, counts, strict=True):
        out += ids[previous:at]
        out += [vision.image_token_id] * count
        previous = at + 1
    out += ids[previous:]
    return ExpandedImages(out, sum(counts))


def pad_runs(ids: Sequence[int], image_token_id: int) -> list[tuple[int, int]]:
    """(start, length) of each run of image pads in ``ids`` (a bare pad outside vision_start / vision_end
    included: the client must not send one either, and slime's trainer counts it)."""
    runs: list[tuple[int, int]] = []
    i = 0
    while i < len(ids):
        if ids[i] == image_token_id:
            start = i
            while i < len(ids) and ids[i] == image_token_id:
                i += 1
            runs.append((start, i - start))
        else:
            i += 1
    return runs


def _tokens(reference: str, vision: Vision) -> int:
    import io

    from PIL import Image

    with Image.open(io.BytesIO(image_bytes(reference))) as image:
        width, height = image.size
    return vision.tokens_of(width, height)
