"""The Sample stand-in must mirror slime's real Sample: the rollout is written against slime's types."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from slime_helpers import SLIME_SOURCE_ENV, slime_args, slime_source

from slime_strands.testing.slime_types import Sample, load_sample_class, real_slime_available

REPO = Path(__file__).resolve().parents[2]

# slime main (624b824, slime/utils/types.py): field order and defaults the rollout and the trainer rely on.
EXPECTED_FIELDS = [
    "group_index", "index", "rollout_id", "prompt", "tokens", "multimodal_inputs", "multimodal_train_inputs",
    "multimodal_train_input_id", "apply_chat_template_kwargs", "response", "response_length", "label", "reward",
    "loss_mask", "weight_versions", "rollout_log_probs", "rollout_top_p_token_ids", "rollout_top_p_token_offsets",
    "rollout_routed_experts", "remove_sample", "teacher_log_probs", "status", "metadata", "generate_function_path",
    "custom_rm_path", "train_metadata", "session_id", "non_generation_time", "spec_info", "prefix_cache_info",
]  # fmt: skip


def test_stand_in_fields_and_defaults():
    names = [f.name for f in dataclasses.fields(Sample)]
    assert names == EXPECTED_FIELDS
    s = Sample()
    assert (s.tokens, s.response, s.response_length, s.loss_mask, s.rollout_log_probs) == (
        [],
        "",
        0,
        None,
        None,
    )
    assert s.status is Sample.Status.PENDING and s.remove_sample is False and s.non_generation_time == 0.0
    assert [m.value for m in Sample.Status] == ["pending", "completed", "truncated", "aborted", "failed"]
    assert Sample().metadata is not s.metadata  # per-instance defaults
    assert s.apply_chat_template_kwargs == {} and s.rollout_id is None and s.custom_rm_path is None
    assert s.rollout_top_p_token_ids is None and s.rollout_top_p_token_offsets is None


def test_round_trip_keeps_extra_attributes():
    s = Sample(index=3, tokens=[1, 2, 3], response_length=1, loss_mask=[1], status=Sample.Status.TRUNCATED)
    s.tool_iters = 2
    s.prefix_cache_info.add({"cached_tokens": 5, "prompt_tokens": 10})
    back = Sample.from_dict(s.to_dict())
    assert back == s and back.tool_iters == 2
    assert back.prefix_cache_info.prefix_cache_hit_rate == 0.5
    assert back.effective_response_length == 1


_DESCRIBE = """
import dataclasses, json, sys
from slime_strands.testing.slime_types import load_sample_class
cls = load_sample_class()
fields = [f.name for f in dataclasses.fields(cls)]
sample = cls()
print(json.dumps({
    "module": cls.__module__,
    "fields": fields,
    "defaults": {n: repr(getattr(sample, n)) for n in fields if n not in ("spec_info", "prefix_cache_info", "status")},
    "status": {m.name: m.value for m in cls.Status},
    "spec_info": sample.spec_info.to_dict(),
    "prefix_cache_info": sample.prefix_cache_info.to_dict(),
}))
"""


def _describe(pythonpath: list[Path]) -> dict:
    """What ``load_sample_class()`` returns in a fresh interpreter with ``pythonpath`` first on its path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, pythonpath), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-c", _DESCRIBE], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_stand_in_matches_real_slime():
    """slime's real Sample (the unmodified source beside the clone, in its own interpreter) against the stand-in,
    field by field, default by default."""
    source = slime_source()
    if source is None:
        pytest.skip(f"slime's source is not at hand: set {SLIME_SOURCE_ENV} (CI always has it)")
    real, mine = _describe([source]), _describe([])
    assert real["module"] == "slime.utils.types" and mine["module"] == "slime_strands.testing.slime_types"
    assert real["fields"] == mine["fields"] == EXPECTED_FIELDS
    assert {k: v for k, v in real.items() if k != "module"} == {
        k: v for k, v in mine.items() if k != "module"
    }


def test_loader_falls_back_to_stand_in_without_slime():
    assert _describe([])["module"] == "slime_strands.testing.slime_types"
    assert load_sample_class() is Sample or real_slime_available()


# -- the appender (slime's semantics, checked on hand-made turns) --------------------------------------------

ARGS = slime_args(num_layers=2, moe_router_topk=2, sglang_speculative_algorithm=None)


def b64(values):
    return base64.b64encode(struct.pack(f"<{len(values)}i", *values)).decode()


def test_appender_aligns_masks_logprobs_and_top_p_spans():
    s = Sample(tokens=[1, 2, 3])
    meta = {
        "finish_reason": {"type": "stop"},
        "weight_version": "5",
        "prompt_tokens": 3,
        "cached_tokens": 1,
        "top_p_token_ids": b64([10, 11, 12]),
        "top_p_token_offsets": b64([0, 2, 3]),
    }
    s.append_response_tokens(ARGS, tokens=[10, 12], log_probs=[-0.1, -0.2], trainable=True, meta_info=meta)
    s.append_response_tokens(ARGS, tokens=[7, 8, 9], trainable=False)
    assert s.tokens == [1, 2, 3, 10, 12, 7, 8, 9] and s.response_length == 5
    assert s.loss_mask == [1, 1, 0, 0, 0] and s.rollout_log_probs == [-0.1, -0.2, 0.0, 0.0, 0.0]
    assert s.rollout_top_p_token_ids == [10, 11, 12] and s.rollout_top_p_token_offsets == [0, 2, 3, 3, 3, 3]
    assert s.weight_versions == ["5"] and s.status is Sample.Status.COMPLETED
    assert (s.prefix_cache_info.cached_tokens, s.prefix_cache_info.total_prompt_tokens) == (1, 3)
    with pytest.raises(ValueError, match="trainable response tokens require rollout log probabilities"):
        s.append_response_tokens(ARGS, tokens=[1], trainable=True)
    with pytest.raises(ValueError, match="offsets length must equal generated token count"):
        s.append_response_tokens(ARGS, tokens=[4], log_probs=[0.0], meta_info={"finish_reason": {"type": "length"},
            "top_p_token_ids": b64([4]), "top_p_token_offsets": b64([0, 1, 1])})  # fmt: skip


def test_appender_appends_routed_experts_after_the_start_len():
    s = Sample(tokens=[1, 2, 3])
    first = list(range(4 * 4))  # 4 rows (3 prompt + 2 generated - 1) x 2 layers x top-2
    s.append_response_tokens(
        ARGS, tokens=[4, 5], log_probs=[0.0, 0.0], meta_info={"routed_experts": b64(first)}
    )
    assert np.asarray(s.rollout_routed_experts).shape == (4, 2, 2)
    s.append_response_tokens(ARGS, tokens=[6], trainable=False)
    later = [100 + v for v in range(3 * 4)]  # rows 4..6 of 7 tokens after the turn: start 4
    meta = {"routed_experts": b64(later), "routed_experts_start_len": 4}
    s.append_response_tokens(ARGS, tokens=[7, 8], log_probs=[0.0, 0.0], meta_info=meta)
    rows = np.asarray(s.rollout_routed_experts)
    assert rows.shape == (len(s.tokens) - 1, 2, 2)
    assert rows.reshape(-1).tolist() == first + later
    with pytest.raises(ValueError, match="routed_experts element count does not match"):
        s.append_response_tokens(ARGS, tokens=[9], log_probs=[0.0], meta_info={"routed_experts": b64([1, 2])})
