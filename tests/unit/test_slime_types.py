"""The Sample stand-in must mirror slime's real Sample: the rollout is written against slime's types."""

from __future__ import annotations

import dataclasses

import pytest

from slime_strands.testing.slime_types import Sample, load_sample_class, real_slime_available

# slime 0.3.x (slime/utils/types.py): field order and defaults the rollout and the trainer rely on.
EXPECTED_FIELDS = [
    "group_index", "index", "prompt", "tokens", "multimodal_inputs", "multimodal_train_inputs",
    "response", "response_length", "label", "reward", "loss_mask", "weight_versions",
    "rollout_log_probs", "rollout_routed_experts", "remove_sample",
    "teacher_log_probs", "mopd_teacher_log_probs", "status", "metadata", "generate_function_path",
    "train_metadata", "session_id", "non_generation_time", "spec_info", "prefix_cache_info",
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


def test_round_trip_keeps_extra_attributes():
    s = Sample(index=3, tokens=[1, 2, 3], response_length=1, loss_mask=[1], status=Sample.Status.TRUNCATED)
    s.tool_iters = 2
    s.prefix_cache_info.add({"cached_tokens": 5, "prompt_tokens": 10})
    back = Sample.from_dict(s.to_dict())
    assert back == s and back.tool_iters == 2
    assert back.prefix_cache_info.prefix_cache_hit_rate == 0.5
    assert back.effective_response_length == 1


@pytest.mark.skipif(not real_slime_available(), reason="real slime (THUDM/slime) is not importable here")
def test_stand_in_matches_real_slime():
    real = load_sample_class()
    assert real is not Sample
    real_fields = {f.name: f for f in dataclasses.fields(real)}
    for f in dataclasses.fields(Sample):
        assert f.name in real_fields, f.name
    assert {m.name: m.value for m in real.Status} == {m.name: m.value for m in Sample.Status}


def test_loader_falls_back_to_stand_in_without_slime():
    if real_slime_available():
        pytest.skip("real slime is importable: the loader returns it (checked above)")
    assert load_sample_class() is Sample
