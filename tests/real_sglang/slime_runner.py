"""Runs ``slime_driver.py`` (slime's REAL ``generate_and_rm`` on the unmodified snapshot) in a process of its
own, against the recording proxy: the test process never imports slime (its ``Sample`` and singletons would
leak into other tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from typing import Any

from conftest import qwen3_tokenizer_path

from real_sglang.recording_proxy import RecordingProxy
from real_sglang.server_process import REPO
from real_sglang.server_setup import slime_paths

__all__ = ["finish_slime", "run_slime", "start_slime"]

_TIMEOUT_S = 540


def start_slime(
    proxy: RecordingProxy, jobs: list[dict], strands: dict[str, Any], slime: dict[str, Any] | None = None
) -> subprocess.Popen[str]:
    """The driver, started on ``jobs`` (see ``slime_driver.py``), its request already written."""
    source, deps = slime_paths()
    tests = REPO / "tests"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(tests), str(source)]),
        "SLIME_STRANDS_SLIME_DEPS": str(deps),
    }
    request = {
        "base_url": proxy.base_url,
        "tokenizer": qwen3_tokenizer_path(),
        "strands": strands,
        "slime": slime or {},
        "jobs": jobs,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "real_sglang.slime_driver"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tests,
    )
    assert process.stdin is not None
    process.stdin.write(json.dumps(request))
    process.stdin.close()
    return process


def finish_slime(process: subprocess.Popen[str]) -> list[types.SimpleNamespace]:
    """What slime ended with, one namespace per printed sample (the driver must succeed)."""
    assert process.stdout is not None and process.stderr is not None
    try:
        process.wait(_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    out, err = process.stdout.read(), process.stderr.read()
    assert process.returncode == 0, err[-4000:]
    return [types.SimpleNamespace(**s) for s in json.loads(out.strip().splitlines()[-1])["samples"]]


def run_slime(
    proxy: RecordingProxy, jobs: list[dict], strands: dict[str, Any], slime: dict[str, Any] | None = None
) -> list[types.SimpleNamespace]:
    return finish_slime(start_slime(proxy, jobs, strands, slime))
