"""Import-only stub (see ``megatron/legacy/__init__.py`` of this stub): the one name ``megatron.training.utils``
imports from Megatron's legacy model module."""

from __future__ import annotations

from typing import Any


def param_is_not_shared(param: Any) -> bool:
    raise RuntimeError(
        "megatron.legacy.model.module.param_is_not_shared is an import-only stub "
        "(tests/slime_train/harness/megatron_stub): slime computed a gradient norm, which --debug-rollout-only "
        "never does on a CPU"
    )
