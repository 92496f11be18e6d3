"""Import-only stub (see ``megatron/rl/__init__.py`` of this stub)."""

from __future__ import annotations

from typing import Any


def build_inference_pg_collection(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(
        "megatron.rl.parallel_utils.build_inference_pg_collection is an import-only stub "
        "(tests/slime_train/harness/megatron_stub): Megatron set up RL inference, which slime's "
        "--debug-rollout-only never does"
    )
