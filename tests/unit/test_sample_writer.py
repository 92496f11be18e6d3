"""Record -> Sample details that need no server: recycling a poisoned sample, reading slime's template flags,
and the record's own serialisation."""

from __future__ import annotations

import base64
import dataclasses
import struct
import types

import numpy as np
import pytest
from slime_helpers import Sample, slime_args

from slime_strands._slime.adapter import template_kwargs
from slime_strands._slime.config import SlimeConfig
from slime_strands._slime.sample_writer import SampleContract, reset_for_generation, write_sample
from slime_strands.agent.record import TREATMENTS, EpisodeRecord, MalformedRecordError, Termination
from slime_strands.errors import ConfigurationError
from slime_strands.provider.token_manager import TokenManager, TurnInfo


def poisoned() -> Sample:
    """A sample as a FAILED first attempt leaves it (with replay data and stats of an earlier success)."""
    s = Sample(prompt="p", tokens=[1, 2, 3, 4], response="x", response_length=1, loss_mask=[0])
    s.rollout_log_probs = [0.0]
    s.rollout_top_p_token_ids, s.rollout_top_p_token_offsets = [], [0, 0]
    s.rollout_routed_experts = np.zeros((3, 1, 1), dtype=np.int32)
    s.weight_versions = ["3"]
    s.reward, s.remove_sample, s.status = 0.0, True, Sample.Status.FAILED
    s.non_generation_time = 9.0
    s.prefix_cache_info.add({"cached_tokens": 5, "prompt_tokens": 9})
    s.metadata = {"strands": EpisodeRecord(Termination.FAILED, regenerations=2).to_metadata(), "keep": 1}
    return s


def test_a_recycled_sample_is_reset_completely():
    s = poisoned()
    assert reset_for_generation(s) == 3
    fresh = Sample(prompt="p")
    for name in ("tokens", "response", "response_length", "loss_mask", "rollout_log_probs", "reward",
                 "rollout_top_p_token_ids", "rollout_top_p_token_offsets", "rollout_routed_experts",
                 "weight_versions", "remove_sample", "status", "non_generation_time", "prefix_cache_info",
                 "spec_info"):  # fmt: skip
        assert getattr(s, name) == getattr(fresh, name), name
    assert s.metadata == {"keep": 1}, "slime's own metadata stays"


def test_a_sample_slime_aborted_before_generate_counts_as_an_attempt():
    s = Sample(prompt="p", status=Sample.Status.ABORTED)
    assert reset_for_generation(s) == 1
    assert reset_for_generation(Sample(prompt="p")) == 0


def test_a_failed_record_gives_a_batchable_masked_sample():
    s = Sample(prompt="p")
    tokenizer = types.SimpleNamespace(eos_token_id=7, eos_token="<eos>")
    contract = SampleContract(routing=(2, 3), top_p=True, reward_key="score")
    write_sample(s, EpisodeRecord(Termination.FAILED, error="boom"), contract, tokenizer)
    assert (s.tokens, s.response_length, s.loss_mask, s.rollout_log_probs) == ([7, 7], 1, [0], [0.0])
    assert s.reward == {"score": 0.0} and s.remove_sample and s.status is Sample.Status.FAILED
    assert (s.rollout_top_p_token_ids, s.rollout_top_p_token_offsets) == ([], [0, 0])
    experts = np.asarray(s.rollout_routed_experts)
    assert experts.shape == (1, 2, 3) and all(np.count_nonzero(experts[:, layer]) for layer in range(2))
    assert EpisodeRecord.of(s).error == "boom"


def test_every_termination_has_a_treatment_with_a_real_status():
    assert set(TREATMENTS) == set(Termination)
    for outcome in TREATMENTS.values():
        assert outcome.status in Sample.Status.__members__
    assert [t for t, o in TREATMENTS.items() if o.trains] == [
        Termination.END_TURN,
        Termination.TOOL_LIMIT,
        Termination.MAX_TOKENS,
        Termination.RESPONSE_BUDGET,
        Termination.CONTEXT_FULL,
    ]


def test_record_round_trip_keeps_the_trajectory_out():
    record = EpisodeRecord(
        Termination.TOOL_LIMIT, turns=3, parse_errors={"bad_json": 1}, tool_time_s=1.5, response="text"
    )
    data = record.to_metadata()
    assert "trajectory" not in data and "response" not in data and data["termination"] == "tool_limit"
    assert EpisodeRecord.from_metadata(data) == record
    with pytest.raises(MalformedRecordError, match=r"episode record: unknown key\(s\)"):
        EpisodeRecord.from_metadata({**data, "extra": 1})
    with pytest.raises(MalformedRecordError, match="unknown termination 'done'"):
        EpisodeRecord.from_metadata({**data, "termination": "done"})
    assert EpisodeRecord.in_metadata({"strands": {**data, "termination": ["done"]}}) is None


def test_template_kwargs_from_the_flag_and_the_sample():
    config = SlimeConfig.of(slime_args(apply_chat_template_kwargs='{"enable_thinking": true, "x": 1}'))
    sample = Sample(apply_chat_template_kwargs={"enable_thinking": False})
    assert template_kwargs(config, sample) == {"enable_thinking": False, "x": 1}, "the sample's own win"
    with pytest.raises(ConfigurationError, match="--apply-chat-template-kwargs is not JSON"):
        SlimeConfig.of(slime_args(apply_chat_template_kwargs="{oops"))
    with pytest.raises(ConfigurationError, match="a sample's apply_chat_template_kwargs must be a mapping"):
        template_kwargs(config, Sample(apply_chat_template_kwargs="thinking"))


def _int32(values: list[int]) -> str:
    """SGLang's encoding of an int32 array in meta_info."""
    return base64.b64encode(struct.pack(f"<{len(values)}i", *values)).decode()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (None, None),
        ("routed_experts", "AAAAAAA="),  # 5 bytes: not an int32 array
        ("routed_experts", "not base64!"),
        ("top_p_token_ids", "AAAAAAA="),
        ("top_p_token_ids", [[1, 2], 3]),  # ragged nesting
        ("routed_experts_start_len", "junk"),
    ],
)
def test_replay_data_the_server_garbled_fails_the_sample_not_the_step(key, value):
    """Whatever the server put in a turn's meta_info, writing the sample never raises: it is FAILED, saying why."""
    tm = TokenManager()
    tm.add_prompt([1, 2, 3])
    meta = {
        "finish_reason": {"type": "stop"},
        "routed_experts": _int32([3, 1, 4, 1]),  # 4 rows (len(tokens) - 1) of 1 layer x top-1
        "top_p_token_ids": _int32([4, 5]),
        "top_p_token_offsets": _int32([0, 1, 2]),
    }
    if key is not None:
        meta[key] = value
    tm.add_generation([4, 5], [-0.5, -0.25], TurnInfo(finish_reason="stop", meta_info=meta))
    record = EpisodeRecord(Termination.END_TURN, trajectory=tm, response="x")
    s = Sample(prompt="p")
    reset_for_generation(s)
    written = write_sample(
        s, record, SampleContract(routing=(1, 1), top_p=True), types.SimpleNamespace(eos_token_id=7)
    )
    assert written == EpisodeRecord.of(s), "the record written is the one returned"
    if key is None:  # the same turn, intact: a trained sample
        assert s.status is Sample.Status.COMPLETED and s.rollout_top_p_token_offsets == [0, 1, 2]
        return
    assert s.status is Sample.Status.FAILED and s.remove_sample
    assert written.termination is Termination.FAILED and written.error.startswith("ReplayError: ")
    assert record.termination is Termination.END_TURN and record.error is None, "the caller's record is kept"


def test_the_episode_record_cannot_be_changed_once_made():
    record = EpisodeRecord(Termination.END_TURN, parse_errors={"bad_json": 1}, segments=[])
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.termination = Termination.FAILED  # type: ignore[misc]
    with pytest.raises(TypeError):
        record.parse_errors["bad_json"] = 2  # type: ignore[index]
    assert record.segments == () and dict(record.parse_errors) == {"bad_json": 1}
