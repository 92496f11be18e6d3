"""Import-only stub (see ``megatron/legacy/__init__.py`` of this stub): Megatron's fused-kernel loader."""

from __future__ import annotations

from typing import Any


def load(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError(
        "megatron.legacy.fused_kernels.load is an import-only stub (tests/slime_train/harness/megatron_stub): "
        "slime initialised Megatron, which --debug-rollout-only never does on a CPU"
    )
