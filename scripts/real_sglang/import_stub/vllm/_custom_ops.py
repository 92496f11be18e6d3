"""Import-only stub of ``vllm._custom_ops`` for SGLang 0.5.23 on ``--device cpu`` (never vLLM itself).

Why: without ``SGLANG_USE_CPU_ENGINE`` (which needs a CPU build of ``sgl_kernel`` that PyPI does not ship),
SGLang 0.5.23's ``RotaryEmbedding.__init__`` (``sglang/srt/layers/rotary_embedding/base.py``) imports
``vllm._custom_ops.rotary_embedding`` as a fallback kernel on a machine that is neither CUDA nor ROCm, but on
``--device cpu`` the plain-PyTorch forward runs and the function is never called. Installing vLLM for one
import would pull its own torch pins into the server venv, so this module only satisfies the import, and
raises if the function is ever called (the tier's tests then fail loudly instead of computing garbage).

When to drop it: when the pinned SGLang no longer imports ``vllm._custom_ops`` on this path (check with
``grep -rn "vllm._custom_ops" <server venv>/lib/python3.11/site-packages/sglang/srt/layers/rotary_embedding``),
or the server venv uses a CPU build of ``sgl_kernel`` with ``SGLANG_USE_CPU_ENGINE=1``.
"""

from __future__ import annotations

from typing import Any


def rotary_embedding(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError(
        "vllm._custom_ops.rotary_embedding is an import-only stub (scripts/real_sglang/import_stub): SGLang "
        "called it, so its CPU path changed; install a real kernel or update the stub's reasoning"
    )
