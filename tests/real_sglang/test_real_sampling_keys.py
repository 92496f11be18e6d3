"""Issue 24, defect 2: the sampling keys the project allows are the ones the REAL server accepts, and every one
of them reaches the server (passed, never dropped silently).

What SGLang accepts is read from the server venv itself (the constructor of its engine's ``SamplingParams``) and
from the live server's own 400 for an unknown key (the API contract ``/generate`` validates against): a key is
accepted when both know it (0.5.23's contract also lists ``choice``, which its engine does not take: a 500)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from real_sglang.real_helpers import ANSWER, GREEDY, check_record, post_json, run
from real_sglang.server_setup import server_python
from slime_strands.agent.record import Termination
from slime_strands.provider.model import SGLANG_SAMPLING_KEYS, SGLangModel

pytestmark = [pytest.mark.real_sglang, pytest.mark.timeout(600)]

_ENGINE_PARAMS = """
import inspect, json
from sglang.srt.sampling.sampling_params import SamplingParams
print(json.dumps(sorted(inspect.signature(SamplingParams).parameters)))
"""


def engine_sampling_params() -> set[str]:
    """The parameters of the server venv's ``SamplingParams`` constructor (``__init__``; a msgspec Struct's
    signature in 0.5.23)."""
    out = subprocess.run(
        [server_python(), "-c", _ENGINE_PARAMS], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def api_sampling_fields(base_url: str) -> set[str]:
    """The fields the live server names in its 400 for an unknown sampling key."""
    body = {"input_ids": [100, 200], "sampling_params": {"max_new_tokens": 1, "slime_strands_probe": 1}}
    try:
        post_json(base_url, "/generate", body)
    except Exception as exc:  # urllib's HTTPError for the 400
        text = exc.read().decode() if hasattr(exc, "read") else str(exc)
    else:
        raise AssertionError("the server accepted an unknown sampling key")
    fields = set(re.findall(r"`([a-z_]+)`", json.loads(text)["error"].split("expected one of", 1)[1]))
    assert "max_new_tokens" in fields, text
    return fields


def test_allowed_keys_are_exactly_what_the_server_accepts(proxy):
    accepted = engine_sampling_params() & api_sampling_fields(proxy.base_url)
    missing = sorted(accepted - SGLANG_SAMPLING_KEYS)
    assert not missing, f"SGLang 0.5.23 accepts sampling keys SGLANG_SAMPLING_KEYS lacks: {missing}"
    refused = sorted(SGLANG_SAMPLING_KEYS - api_sampling_fields(proxy.base_url))
    assert not refused, f"SGLANG_SAMPLING_KEYS allows keys the server refuses with a 400: {refused}"


async def test_a_structural_tag_is_accepted_and_constrains_the_answer(proxy, tokenizer):
    """``structural_tag`` (a grammar, here the answer as a constant string) goes from the Python API and the
    episode's sampling params to the server, which enforces it."""
    tag = json.dumps({"type": "structural_tag", "format": {"type": "const_string", "value": ANSWER}})
    SGLangModel(tokenizer=tokenizer, base_url=proxy.base_url, sampling_params={"structural_tag": tag})
    record = await run(proxy, tokenizer, {**GREEDY, "structural_tag": tag, "stream_interval": 1})
    sent = [e.body["sampling_params"] for e in proxy.generations("episode")]
    assert sent and all(p.get("structural_tag") == tag and p.get("stream_interval") == 1 for p in sent), (
        f"sampling keys were dropped on the way to the server: {sent}"
    )
    assert record.termination is Termination.END_TURN, record.error
    check_record(record, proxy)
    assert record.response.endswith(ANSWER + "<|im_end|>"), record.response
