"""Routed experts (R3) on the REAL server: what SGLang 0.5.23's CPU path does with a tiny Qwen3-MoE.

It cannot return them: ``--enable-return-routed-experts`` makes the scheduler allocate the routing rows' host
buffer pinned (``state_capturer/base.py``: ``BaseHostCache`` passes ``pin_memory=True`` to
``ALLOC_MEMORY_FUNCS["cpu"]``, i.e. ``alloc_with_host_register``), which registers it with CUDA
(``mem_cache/pool_host/common.py``: ``_cuda_host_register`` -> ``torch.cuda.cudart()``) and fails with "Found no
NVIDIA driver on your system": the server exits before it is ready. Without the flag the same MoE model serves
and a request's ``return_routed_experts`` is silently ignored (the recorded answer
``routed_experts_without_server_flag.json``; the stand-in replays it). This test pins that fact: when an SGLang
upgrade lifts it, it fails, and the real check (rows' shape ``(len - 1, layers, topk)``,
``routed_experts_start_len``, each turn's rows equal to a full request's) replaces it.
"""

from __future__ import annotations

import pytest

from real_sglang.server_process import ServerStartError
from real_sglang.server_setup import start_server

pytestmark = [pytest.mark.real_sglang, pytest.mark.timeout(900)]


def test_routed_experts_need_cuda_host_memory_on_sglang_0_5_23(tmp_path):
    with pytest.raises(ServerStartError) as failed:
        server = start_server(tmp_path, moe=True, extra_args=("--enable-return-routed-experts",))
        server.stop()
    log = str(failed.value)
    assert "_cuda_host_register" in log and "Found no NVIDIA driver" in log, log[-3000:]
