"""Images in a trajectory: how a vision-language model's server counts them, and what its trainer needs of them.

A Qwen-VL chat template renders each image as ``<|vision_start|><|image_pad|><|vision_end|>``. SGLang 0.5.23
takes exactly that, ONE pad per image, in ``input_ids``, with every image of the conversation so far in
``image_data`` (in prompt order), and expands the i-th pad into as many pads as the image has features
(``multimodal/processors/base_processor.py``: ``resolve_image_token_counts`` asks the HF processor's
``_get_num_multimodal_tokens``, ``_expand_input_ids`` replaces the i-th ``image_token_id``, every other id is kept
verbatim). Ids sent already expanded hang Qwen2.5-VL's request and fail Qwen3-VL's with a 500.

So a trajectory has two forms: the EXPANDED ids (what the server's model sees and what slime trains on:
``Sample.tokens``, the positions the trainer fills with vision features) and the WIRE ids (each image's run
collapsed back to its one pad) that every request sends. :class:`Vision` is the model's side of it: its
image token ids and its image processor (the checkpoint's ``preprocessor_config.json``), from which the
number of tokens of an image is what SGLang computes (``grid_t * grid_h * grid_w // merge_size**2``).

An image is held ONCE per trajectory, as the data URI sent every turn (:class:`TrajectoryImage`): the same bytes
each time, which Qwen3-VL's prefix cache keys on; pixel values (24 bytes per resized pixel) are only made at the
end, for the trainer (:meth:`Vision.train_inputs`).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError, InputError
from ..strict_reader import is_int

__all__ = ["ImagePlacement", "TrajectoryImage", "Vision", "image_block", "image_bytes", "load_vision"]

_OVERSIZE = 4
"""An image of more than this many times the processor's largest resized area is refused: the processor would
shrink it anyway, and decoding it (here for the trainer, on the server for the model) costs its full size (a
small PNG can claim 20,000 x 20,000 pixels)."""
_FORMATS = {"png": "png", "jpeg": "jpeg", "jpg": "jpeg", "gif": "gif", "webp": "webp"}
"""Strands' image formats (``strands.types.media.ImageFormat``), and the MIME subtype of each."""


@dataclass(frozen=True)
class TrajectoryImage:
    """One image of a trajectory: the data URI every request sends (held once) and its expanded token count."""

    data_uri: str
    tokens: int
    """Pads the server expands this image's one pad into (its vision features)."""
    size: tuple[int, int]
    """(width, height) in pixels, as decoded."""

    def pil(self) -> Any:
        """The image as a PIL image (RGB), decoded from the data URI (slime's ``multimodal_inputs`` hold these)."""
        from PIL import Image

        with Image.open(io.BytesIO(image_bytes(self.data_uri))) as image:
            return image.convert("RGB")


@dataclass(frozen=True)
class ImagePlacement:
    """An image at its position in a trajectory: its expanded run of pads starts at ``start``."""

    start: int
    image: TrajectoryImage

    @property
    def end(self) -> int:
        return self.start + self.image.tokens


class Vision:
    """A vision-language model's image tokens and image processor (see the module docstring)."""

    def __init__(
        self,
        image_processor: Any,
        *,
        image_token_id: int,
        vision_start_id: int,
        vision_end_id: int,
        video_token_id: int | None = None,
    ) -> None:
        self.image_processor = image_processor
        self.image_token_id = image_token_id
        self.vision_start_id = vision_start_id
        self.vision_end_id = vision_end_id
        self.vision_ids = frozenset(
            t for t in (image_token_id, video_token_id, vision_start_id, vision_end_id) if t is not None
        )
        """Ids only an image brings into a conversation (its pads and the markers around them): the model must
        never write one."""
        self.merge_size = int(getattr(image_processor, "merge_size", 2) or 2)

    def generated_vision_id(self, output_ids: Sequence[int]) -> int | None:
        """The first of :attr:`vision_ids` among ids the model wrote, or None.

        No image stands behind such a token: a pad sent back makes SGLang count one placeholder more than the
        images (Qwen2.5-VL answers 400, Qwen3-VL 500); in a sample, a pad makes slime's VLM trainer count one
        image token more than the vision features, and a ``<|vision_start|>`` that ends a sample makes its
        M-RoPE positions read past the sequence (either fails its forward, and the step with it). They are stop
        tokens of every turn, so the server stops on the first one."""
        return next((t for t in output_ids if t in self.vision_ids), None)

    def tokens_of(self, width: int, height: int) -> int:
        """Pads an image of this size expands into: the image processor's patches (after its resize rule) over
        ``merge_size**2``, as SGLang asks the HF processor (``Qwen2_5_VLProcessor._get_num_multimodal_tokens``)."""
        patches = self.image_processor.get_number_of_image_patches(height, width, {})
        return int(patches) // self.merge_size**2

    def image(self, block: Mapping[str, Any]) -> TrajectoryImage:
        """A Strands image content (``{"format", "source": {"bytes"}}``) as a trajectory image; one clear line
        for an image that cannot be used."""
        from PIL import Image, UnidentifiedImageError

        fmt = _FORMATS.get(str(block.get("format", "")).lower())
        data = (block.get("source") or {}).get("bytes")
        if fmt is None or not isinstance(data, (bytes, bytearray)):
            raise InputError(
                f"an image block needs a format {sorted(set(_FORMATS))} and source bytes, got "
                f"{sorted(block)} (format {block.get('format')!r}): pass {{'format': 'png', 'source': "
                "{'bytes': <the file's bytes>}}"
            )
        try:
            with Image.open(io.BytesIO(data)) as image:  # the header only: no pixel is decoded here
                size = image.size
        except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
            why = "" if isinstance(exc, UnidentifiedImageError) else f" ({exc})"
            raise InputError(  # the message may reach the model (a figure it saved): the hint is a caller's
                f"the bytes are not a {fmt} image{why}", hint="pass the image file's own bytes"
            ) from exc
        limit = _OVERSIZE * int(
            getattr(getattr(self.image_processor, "size", None), "longest_edge", None) or 1 << 24
        )
        if size[0] * size[1] > limit:
            raise InputError(
                f"an image of {size[0]} x {size[1]} pixels is more than {limit:,} pixels: save it smaller "
                "(the model sees it resized to the processor's largest area anyway)"
            )
        try:
            tokens = self.tokens_of(*size)
        except ValueError as exc:  # the processor's own refusal, e.g. an aspect ratio over 200
            raise InputError(
                f"an image of {size[0]} x {size[1]} pixels cannot be processed ({exc}): save it in another shape"
            ) from exc
        uri = f"data:image/{fmt};base64,{base64.b64encode(data).decode('ascii')}"
        return TrajectoryImage(uri, tokens, size)

    def expand(self, ids: Sequence[int], images: Sequence[TrajectoryImage]) -> tuple[list[int], list[int]]:
        """``ids`` with the k-th image pad expanded to ``images[k].tokens`` pads, and where each run starts.

        The ids come from encoding a template's rendering, where tool output and user text are encoded
        literally (a pad's text in them is not the pad token): every pad is one of the rendered images."""
        at = [i for i, token in enumerate(ids) if token == self.image_token_id]
        if len(at) != len(images):
            raise InputError(
                f"the chat template rendered {len(at)} image placeholder(s) for {len(images)} image(s): the "
                "template must render each image as one <|vision_start|><|image_pad|><|vision_end|>"
            )
        out: list[int] = []
        starts: list[int] = []
        previous = 0
        for pos, image in zip(at, images, strict=True):
            out += ids[previous:pos]
            starts.append(len(out))
            out += [self.image_token_id] * image.tokens
            previous = pos + 1
        out += ids[previous:]
        return out, starts

    def train_inputs(self, images: Sequence[TrajectoryImage]) -> dict[str, Any]:
        """What slime's VLM trainer concatenates per sample (``multimodal_train_inputs``): the image processor's
        ``pixel_values`` (float32, one row per patch) and ``image_grid_thw`` (int64, one row per image), in
        the order of the images' runs in the sample's tokens (its ``forward`` walks runs and grids together)."""
        import numpy as np

        out = self.image_processor(images=[image.pil() for image in images], return_tensors="np")
        pixel_values = np.asarray(out["pixel_values"], dtype=np.float32)
        grid = np.asarray(out["image_grid_thw"], dtype=np.int64)
        try:
            import torch
        except ImportError:  # slime converts numpy values to tensors itself (rollout_data_utils)
            return {"pixel_values": pixel_values, "image_grid_thw": grid}
        return {"pixel_values": torch.from_numpy(pixel_values), "image_grid_thw": torch.from_numpy(grid)}


def image_bytes(reference: str) -> bytes:
    """The bytes of an image as slime's data carries it: a ``data:`` URI, raw base64 or an absolute file path
    (what SGLang's ``image_data`` accepts too); one clear line for anything else. A data URI's payload is
    base64 whatever it looks like (a JPEG's starts ``/9j/``, an absolute path's shape); a bare string is a file
    when one exists there, else base64."""
    if reference.startswith("data:"):
        return _base64(reference.partition(",")[2], reference)
    path = reference[len("file://") :] if reference.startswith("file://") else reference
    if os.path.isabs(path) and (os.path.isfile(path) or reference.startswith("file://")):
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except OSError as exc:
            raise InputError(f"cannot read the image file {path!r}: {exc}") from exc
    return _base64(reference, reference)


def _base64(payload: str, reference: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        what = "no file there, and not base64" if os.path.isabs(reference) else "not base64"
        raise InputError(
            f"an image must be a data URI, base64 or an absolute path, got {reference[:40]!r}... ({what}): "
            "write images that way in the data (data_prep does)"
        ) from exc


def image_block(
    reference: Any, *, min_pixels: int | None = None, max_pixels: int | None = None
) -> dict[str, Any]:
    """A Strands image content (``{"format", "source": {"bytes"}}``) from an image as slime's data carries it
    (see :func:`image_bytes`; a PIL image is saved as PNG). ``min_pixels`` / ``max_pixels`` (slime's rich image
    entries, Qwen-VL's convention): an image whose area is outside them is resized into them, its aspect kept,
    and sent as that PNG (SGLang and the trainer then both see the resized image)."""
    if min_pixels is not None or max_pixels is not None:
        return _within(image_block(reference), min_pixels, max_pixels)
    if hasattr(reference, "save"):  # a PIL image (slime's process_vision_info hands those)
        return {"format": "png", "source": {"bytes": _png(reference)}}
    if not isinstance(reference, str):
        raise InputError(
            f"an image must be a data URI, base64, an absolute path or a PIL image, got {type(reference).__name__}"
        )
    data = image_bytes(reference)
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            fmt = _FORMATS.get(str(image.format).lower())
    except UnidentifiedImageError as exc:
        raise InputError(
            "an image of the prompt is not an image file: check the data's images column"
        ) from exc
    except (OSError, Image.DecompressionBombError) as exc:
        raise InputError(
            f"an image of the prompt cannot be read ({exc}): check the data's images column"
        ) from exc
    if fmt is None:
        raise InputError(
            f"an image of the prompt is {Image.MIME.get(str(image.format))}: use png, jpeg, gif or webp"
        )
    return {"format": fmt, "source": {"bytes": data}}


def _within(block: dict[str, Any], min_pixels: int | None, max_pixels: int | None) -> dict[str, Any]:
    """``block`` resized so that its area is within ``[min_pixels, max_pixels]`` (its aspect kept), as a PNG."""
    from PIL import Image

    for name, bound in (("min_pixels", min_pixels), ("max_pixels", max_pixels)):
        if bound is not None and not (is_int(bound) and bound > 0):
            raise InputError(f"an image entry's {name} must be a positive integer, got {bound!r}")
    with Image.open(io.BytesIO(block["source"]["bytes"])) as image:
        area = image.size[0] * image.size[1]
        target = max_pixels if max_pixels is not None and area > max_pixels else None
        target = min_pixels if min_pixels is not None and area < min_pixels else target
        if target is None:
            return block
        scale = (target / area) ** 0.5
        size = (max(1, round(image.size[0] * scale)), max(1, round(image.size[1] * scale)))
        return {
            "format": "png",
            "source": {"bytes": _png(image.convert("RGB").resize(size, Image.Resampling.BICUBIC))},
        }


def _png(image: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def load_vision(model_path: str) -> Vision | None:
    """The model's :class:`Vision` from its checkpoint folder (``config.json``'s image token ids and its
    ``preprocessor_config.json``), or None for a text model (no ``vision_config``)."""
    config_path = os.path.join(model_path, "config.json")
    if not os.path.isfile(config_path):
        return None
    with open(config_path, encoding="utf-8") as handle:
        config = json.load(handle)
    if "vision_config" not in config:
        return None
    try:
        from transformers import AutoImageProcessor

        processor = AutoImageProcessor.from_pretrained(model_path)
        ids = {
            key: int(config[key])
            for key in ("image_token_id", "vision_start_token_id", "vision_end_token_id")
        }
        video = config.get("video_token_id")
        video_token_id = None if video is None else int(video)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        raise ConfigurationError(
            f"{model_path!r} is a vision-language model, but its image processor or image token ids cannot be "
            f"loaded ({type(exc).__name__}: {exc}): the folder needs preprocessor_config.json and config.json's "
            "image_token_id / vision_start_token_id / vision_end_token_id; pip install pillow"
        ) from exc
    return Vision(
        processor,
        image_token_id=ids["image_token_id"],
        vision_start_id=ids["vision_start_token_id"],
        vision_end_id=ids["vision_end_token_id"],
        video_token_id=video_token_id,
    )
