"""Agent metrics: aggregation arithmetic, pass@k, slime's logging path, never raising."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from slime_strands.metrics import aggregate, log_eval_rollout, log_rollout, pass_at_k
from slime_strands.testing.slime_types import Sample

S = Sample.Status


def sample(status=S.COMPLETED, reward=None, group_index=None, remove=False, **strands):
    meta = {"evaluation": False, "termination": "end_turn", **strands}
    s = Sample(status=status, reward=reward, group_index=group_index, metadata={"strands": meta})
    s.remove_sample = remove
    return s


def args(**kw):
    return types.SimpleNamespace(
        **{"wandb_always_use_train_step": False, "n_samples_per_eval_prompt": 4, **kw}
    )


def test_pass_at_k_known_values():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_aggregate_arithmetic():
    samples = [
        sample(turns=1, tool_calls=0, tool_errors=0, prompt_tokens=100, cached_tokens=0,
               response_tokens=10, generated_tokens=10),
        sample(turns=3, tool_calls=2, tool_errors=1, prompt_tokens=300, cached_tokens=200,
               response_tokens=50, generated_tokens=30, parse_errors={"bad_json": 2},
               tool_outputs_truncated=1),
        sample(S.TRUNCATED, turns=5, tool_calls=4, tool_errors=0, prompt_tokens=600, cached_tokens=400,
               response_tokens=40, generated_tokens=20, parse_errors={"bad_json": 1, "unknown_tool": 1},
               termination="tool_limit", regenerations=1),
        sample(S.FAILED, remove=True, termination="failure", error="boom"),
    ]  # fmt: skip
    samples.append(Sample(status=S.COMPLETED))  # another generator's sample: status only
    m = aggregate(samples)
    assert m["samples"] == 4
    assert m["status/completed"] == pytest.approx(3 / 5) and m["status/failed"] == pytest.approx(1 / 5)
    assert m["turns_mean"] == pytest.approx(3.0) and m["turns_p50"] == 3 and m["turns_max"] == 5
    assert m["turns_p99"] == 5
    assert m["tool_error_rate"] == pytest.approx(1 / 6)
    assert m["cache_hit_rate"] == pytest.approx(600 / 1000)
    assert m["tool_token_share"] == pytest.approx(1 - 60 / 100)
    assert m["parse_errors_per_sample/bad_json"] == pytest.approx(3 / 4)
    assert m["parse_errors_per_sample/unknown_tool"] == pytest.approx(1 / 4)
    assert m["termination/end_turn"] == pytest.approx(2 / 4)
    assert m["termination/tool_limit"] == m["termination/failure"] == pytest.approx(1 / 4)
    assert m["remove_sample_rate"] == pytest.approx(1 / 4)
    assert m["regenerated_rate"] == pytest.approx(1 / 4)
    assert m["tool_outputs_truncated_per_sample"] == pytest.approx(1 / 4)


def test_aggregate_edge_cases():
    assert aggregate([]) == {} and aggregate(None) == {}
    nested = [[sample(turns=1)], [sample(turns=3), sample(turns=5)]]  # groups of samples
    assert aggregate(nested)["turns_mean"] == pytest.approx(3.0)
    junk = Sample(metadata={"strands": "junk"})
    assert aggregate([junk]) == {"status/pending": 1.0}
    odd = sample(turns="many", tool_calls=float("nan"), parse_errors=["x"])
    assert "turns_mean" not in aggregate([odd]) and "tool_error_rate" not in aggregate([odd])


@pytest.fixture
def slime_logging(monkeypatch):
    """A stand-in for slime's tracking module: records what would reach wandb."""
    calls = []
    module = types.ModuleType("slime.utils.logging_utils")
    module.log = lambda a, metrics, step_key: calls.append((dict(metrics), step_key))
    for name in ("slime", "slime.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "slime.observability", None)  # an older slime: no observability
    monkeypatch.setitem(sys.modules, "slime.utils.logging_utils", module)
    return calls


def test_log_rollout_through_slime(slime_logging):
    samples = [sample(turns=2, tool_calls=1, tool_errors=0), sample(S.TRUNCATED, turns=4)]
    a = args(
        wandb_always_use_train_step=True, rollout_batch_size=4, n_samples_per_prompt=8, global_batch_size=16
    )
    assert log_rollout(3, a, samples, {"x": 1}, 12.5) is False
    [(metrics, step_key)] = slime_logging
    assert step_key == "rollout/step" and metrics["rollout/step"] == 3 * 4 * 8 // 16
    assert metrics["rollout/strands/turns_mean"] == 3.0
    assert metrics["rollout/strands/status/truncated"] == 0.5
    assert all(k.startswith("rollout/") for k in metrics)


def test_log_eval_rollout_accuracy_and_pass_at_k(slime_logging):
    # Two prompts x 4 samples: prompt 0 right once, prompt 1 never.
    rewards = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    samples = [sample(reward=r, group_index=i // 4, evaluation=True) for i, r in enumerate(rewards)]
    data = {"aime": {"rewards": rewards, "truncated": [False] * 8, "samples": samples}}
    assert log_eval_rollout(7, args(), data, {}) is False
    [(metrics, step_key)] = slime_logging
    assert step_key == "eval/step" and metrics["eval/step"] == 7
    assert metrics["eval/strands/aime/accuracy"] == pytest.approx(1 / 8)
    assert metrics["eval/strands/aime/pass@1"] == pytest.approx((0.25 + 0) / 2)
    assert metrics["eval/strands/aime/pass@2"] == pytest.approx((0.5 + 0) / 2)
    assert metrics["eval/strands/aime/pass@4"] == pytest.approx((1.0 + 0) / 2)
    assert "eval/strands/aime/pass@8" not in metrics
    assert metrics["eval/strands/aime/samples"] == 8


def test_eval_groups_by_position_without_samples(slime_logging):
    data = {"aime": {"rewards": [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]}}
    log_eval_rollout(0, args(), data, None)
    metrics = slime_logging[0][0]
    assert metrics["eval/strands/aime/pass@4"] == pytest.approx(0.5)
    assert metrics["eval/strands/aime/pass@1"] == pytest.approx(0.25)


def test_without_slime_logs_to_python_logging(caplog, monkeypatch):
    monkeypatch.setitem(sys.modules, "slime", None)  # import slime fails
    with caplog.at_level(logging.INFO, logger="slime_strands.metrics"):
        assert log_rollout(0, args(), [sample(turns=1)], None, 1.0) is False
    assert "rollout/strands/turns_mean" in caplog.text


def test_never_raises(monkeypatch, caplog):
    module = types.ModuleType("slime.utils.logging_utils")

    def broken(*a, **k):
        raise RuntimeError("wandb is down")

    module.log = broken
    for name in ("slime", "slime.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "slime.observability", None)
    monkeypatch.setitem(sys.modules, "slime.utils.logging_utils", module)
    assert log_rollout(0, args(), [sample(turns=1)], None, 1.0) is False
    assert log_eval_rollout(0, args(), {"aime": {"rewards": [1.0]}}, None) is False
    assert log_eval_rollout(0, args(), "garbage", None) is False
    assert "wandb is down" in caplog.text
