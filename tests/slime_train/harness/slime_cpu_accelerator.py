"""TEST HARNESS, not the plugin and not slime: a "cpu" accelerator for slime's own ``train.py
--debug-rollout-only`` on a machine without a GPU (``scripts/slime_cpu_smoke.sh``).

slime's train actor asks its accelerator for a local device id even when ``--debug-rollout-only`` makes the
actor do nothing else, and slime registers only cuda and musa, so on a CPU ``train.py`` stops with "No usable
accelerator was detected". slime has a public registry for other backends
(``slime.utils.accelerator.register_accelerator``); this module registers one through it, the moment slime's
accelerator module is imported, without changing a line of slime's source.

It must act in EVERY process slime starts, the Ray workers included, and slime does not pass its environment
to them: the smoke's driver venv holds a ``.pth`` file that imports this module at interpreter start, and it
acts only when ``SLIME_STRANDS_CPU_ACCELERATOR=1`` is in the environment (the smoke sets it for ``ray start``,
whose workers inherit it, and for ``train.py``). The backend reports one device, gloo for communication and
no memory: nothing runs on it (no model is built under ``--debug-rollout-only``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

__all__ = ["ENV", "install"]

ENV = "SLIME_STRANDS_CPU_ACCELERATOR"
"""``1`` switches the harness on in a process (set for ``ray start`` and ``train.py`` by the smoke)."""
_TARGET = "slime.utils.accelerator"


def install() -> None:
    """Register the cpu backend as soon as slime's accelerator module is imported (now, when it already is)."""
    if os.environ.get(ENV) != "1":
        return
    module = sys.modules.get(_TARGET)
    if module is not None:
        _register(module)
    elif not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds slime's accelerator module with the other finders and runs :func:`_register` once it is loaded."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)  # the real finders find it; this one is done after this module
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _RegisteringLoader(spec.loader)
        return spec


class _RegisteringLoader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _register(module)


def _register(module: Any) -> None:
    import torch
    from slime.utils.accelerator.base import Accelerator

    class CPUAccelerator(Accelerator):
        """One CPU "device": enough for slime's train actor to start under ``--debug-rollout-only``."""

        name = "cpu"
        device_type = "cpu"
        communication_backend_name = "gloo"

        def is_available(self) -> bool:
            return True

        def device(self, index: Any = None) -> torch.device:
            return torch.device("cpu")

        def device_name(self, index: Any = None) -> str:
            return "cpu"

        def set_device(self, index: Any) -> None:
            return None

        def current_device(self) -> str:
            return "cpu"

        def device_count(self) -> int:
            return 1

        def synchronize(self, device: Any = None) -> None:
            return None

        def current_stream(self, device: Any = None) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def mem_get_info(self, device: Any = None) -> tuple[int, int]:
            return 0, 0

        def memory_allocated(self, device: Any = None) -> int:
            return 0

        def memory_reserved(self, device: Any = None) -> int:
            return 0

        def distributed_device_id(self, index: Any = None) -> None:
            return None  # gloo takes no device id

    module.register_accelerator("cpu", CPUAccelerator, lambda: True, communication_backends=("gloo",))
