"""Agent metrics: aggregation arithmetic, pass@k, slime's logging path, never raising, and the keys that
real generate() episodes actually write."""

from __future__ import annotations

import logging
import math
import sys
import types
import uuid

import pytest
from slime_helpers import make_args, slime_args

from slime_strands import rollout
from slime_strands.agent.record import EpisodeRecord, Termination
from slime_strands.metrics import aggregate, log_eval_rollout, log_rollout, pass_at_k
from slime_strands.testing import Fault, SGLangTestServer
from slime_strands.testing.slime_types import Sample

S = Sample.Status
# Every module path slime has kept its tracking / step helpers under (verified in THUDM/slime's history).
SLIME_MODULES = (
    "slime",
    "slime.observability",
    "slime.observability.logging_utils",
    "slime.observability.metric_utils",
    "slime.utils",
    "slime.utils.logging_utils",
    "slime.utils.tracking_utils",
    "slime.utils.metric_utils",
)
LAYOUTS = {  # slime version -> (module with log(), module with compute_rollout_step())
    "observability": ("slime.observability.logging_utils", "slime.observability.metric_utils"),
    "utils": ("slime.utils.logging_utils", "slime.utils.metric_utils"),
    "tracking": ("slime.utils.tracking_utils", "slime.utils.metric_utils"),
}


def sample(status=S.COMPLETED, reward=None, group_index=None, remove=False, termination="end_turn", **fields):
    """A sample as generate() leaves it: its episode record under metadata["strands"]."""
    meta = EpisodeRecord(Termination(termination), **fields).to_metadata()
    s = Sample(status=status, reward=reward, group_index=group_index, metadata={"strands": meta})
    s.remove_sample = remove
    return s


def args(**kw):
    return slime_args(**{"wandb_always_use_train_step": False, "n_samples_per_eval_prompt": 4, **kw})


def install_slime(monkeypatch, layout=None, log=None, step=None):
    """Make exactly one slime layout importable (or none): fake modules record what would reach wandb."""
    calls = []
    for name in SLIME_MODULES:
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: the import fails
    if layout is not None:
        log_module, step_module = LAYOUTS[layout]
        tracking = types.ModuleType(log_module)
        tracking.log = log or (lambda a, metrics, step_key: calls.append((dict(metrics), step_key)))
        monkeypatch.setitem(sys.modules, log_module, tracking)
        if step is not None:
            metric_utils = types.ModuleType(step_module)
            metric_utils.compute_rollout_step = step
            monkeypatch.setitem(sys.modules, step_module, metric_utils)
    return calls


@pytest.fixture
def slime_logging(monkeypatch):
    return install_slime(monkeypatch, "observability", step=lambda a, rollout_id: rollout_id)


# -- pass@k ----------------------------------------------------------------------------------------


def test_pass_at_k_known_values():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0  # k = n with one correct sample
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001)
    for bad in ((2, 1, 3), (2, 3, 1), (2, 1, 0)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)


@pytest.mark.parametrize(("n", "c", "k"), [(16, 3, 4), (32, 1, 8), (64, 10, 16), (7, 2, 5)])
def test_pass_at_k_matches_the_binomial_definition(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_is_stable_for_large_n():
    value = pass_at_k(100_000, 3, 1024)  # C(100000, 1024) overflows a float; the product does not
    assert math.isfinite(value) and 0 < value < 1
    assert value == pytest.approx(1 - (1 - 1024 / 100_000) ** 3, rel=1e-3)


# -- aggregate -------------------------------------------------------------------------------------


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
        sample(S.FAILED, remove=True, termination="failure", error="boom", turns=3),
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
    assert m["generated_tokens_mean"] == pytest.approx(60 / 4) and m["prompt_tokens_mean"] == pytest.approx(
        1000 / 4
    )
    assert m["parse_errors_per_sample/bad_json"] == pytest.approx(3 / 4)
    assert m["parse_errors_per_sample/unknown_tool"] == pytest.approx(1 / 4)
    assert m["termination/end_turn"] == pytest.approx(2 / 4)
    assert m["termination/tool_limit"] == m["termination/failure"] == pytest.approx(1 / 4)
    assert m["remove_sample_rate"] == pytest.approx(1 / 4)
    assert m["regenerated_rate"] == pytest.approx(1 / 4)
    assert m["tool_outputs_truncated_per_sample"] == pytest.approx(1 / 4)


def test_percentiles_are_nearest_rank():
    m = aggregate([sample(turns=t, tool_time_s=t / 10) for t in range(100, 0, -1)])  # order must not matter
    assert (m["turns_p50"], m["turns_p99"], m["turns_max"]) == (50, 99, 100)
    assert m["turns_mean"] == pytest.approx(50.5)
    assert m["tool_time_s_p50"] == pytest.approx(5.0) and m["tool_time_s_p99"] == pytest.approx(9.9)
    single = aggregate([sample(turns=7)])
    assert single["turns_p50"] == single["turns_p99"] == single["turns_max"] == 7


def test_aggregate_edge_cases():
    assert aggregate([]) == {} and aggregate(None) == {}
    nested = [[sample(turns=1)], [sample(turns=3), sample(turns=5)]]  # groups of samples
    assert aggregate(nested)["turns_mean"] == pytest.approx(3.0)
    junk = Sample(metadata={"strands": "junk"})
    assert aggregate([junk]) == {"status/pending": 1.0}
    for odd in (
        {"termination": "end_turn", "turns": "many"},
        {"termination": "end_turn", "tool_time_s": float("nan")},
        {"termination": "end_turn", "parse_errors": ["x"]},
        {"termination": "finished"},
        {"turns": 1},
    ):
        assert aggregate([Sample(metadata={"strands": odd})]) == {"status/pending": 1.0}, odd
    # No tool calls / prompt tokens at all: the ratios are absent, not a division by zero.
    m = aggregate([sample(turns=1, tool_calls=0, prompt_tokens=0)])
    assert "tool_error_rate" not in m and "cache_hit_rate" not in m


# -- real episodes: the keys generate() writes are the keys metrics reads ------------------------------

CALL_ADD = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
# Everything rollout.generate may write into metadata["strands"]; a new key must be either aggregated
# here or consciously listed as not aggregated.
AGGREGATED = {
    "termination", "turns", "tool_iters", "tool_calls", "tool_errors", "parse_errors", "tool_time_s",
    "generation_time_s", "client_overhead_s", "prompt_tokens", "cached_tokens", "tool_outputs_truncated",
    "response_tokens", "generated_tokens", "wall_time_s", "regenerations", "segments", "continuations",
    "turns_saved", "offpolicy_masked_tokens", "staleness", "versions_trained", "stale_masked_tokens",
    "stale_dropped",
}  # fmt: skip
NOT_AGGREGATED = {
    "evaluation", "error", "final_turn_chars", "segment", "version_newest", "version_earliest_trained",
    "version_latest_trained", "rollout_thread",
}  # fmt: skip
DISTRIBUTIONS = (
    "turns", "tool_calls", "tool_iters", "tool_time_s", "generation_time_s", "wall_time_s", "response_tokens",
)  # fmt: skip


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=8192) as srv:
        yield srv


def episode_args(server):
    return make_args(server, strands={"tools": ["rollout_tools.add"], "max_retries": 1})


async def episode(server, *turns):
    flags = episode_args(server)
    s = Sample(prompt="What is 2+3?", label="5", session_id=str(uuid.uuid4()))
    server.script(*turns, key=s.session_id)
    params = {"temperature": 1.0, "max_new_tokens": 2048, "skip_special_tokens": False, "no_stop_trim": True}
    return await rollout.generate(flags, s, params)


async def test_real_episodes_through_log_rollout(server, monkeypatch):
    ok = await episode(server, CALL_ADD, "Answer: \\boxed{5}")
    bad_call = await episode(server, "<tool_call>\n{not json}\n</tool_call>", "Answer: 5")
    failed = await episode(server, Fault(status=422))
    other = Sample(status=S.COMPLETED)  # from another generate function: no metadata["strands"]
    metas = [s.metadata["strands"] for s in (ok, bad_call, failed)]
    for meta in metas:
        assert set(meta) <= AGGREGATED | NOT_AGGREGATED, set(meta) - AGGREGATED - NOT_AGGREGATED
    assert (ok.status, bad_call.status, failed.status) == (S.COMPLETED, S.COMPLETED, S.FAILED)

    served = [
        server.meta_infos[r.body["rid"]]
        for r in server.generate_requests
        if r.body["rid"] in server.meta_infos
    ]
    calls = install_slime(monkeypatch, "observability", step=lambda a, rollout_id: 100 + rollout_id)
    assert log_rollout(3, args(), [[ok, bad_call], [failed, other]], {"extra": 1.0}, 9.5) is False
    [(m, step_key)] = calls
    assert step_key == "rollout/step" and m.pop("rollout/step") == 103
    assert all(k.startswith("rollout/strands/") for k in m)
    m = {k.removeprefix("rollout/strands/"): v for k, v in m.items()}
    for key in DISTRIBUTIONS:  # every distribution docs/training.md promises exists for real episodes
        assert {f"{key}_mean", f"{key}_p50", f"{key}_p99", f"{key}_max"} <= set(m), key
    assert m["samples"] == 3
    assert m["status/completed"] == pytest.approx(3 / 4) and m["status/failed"] == pytest.approx(1 / 4)
    assert m["termination/end_turn"] == pytest.approx(2 / 3) and m["termination/failure"] == pytest.approx(
        1 / 3
    )
    assert m["remove_sample_rate"] == pytest.approx(1 / 3)
    assert m["parse_errors_per_sample/bad_json"] == pytest.approx(1 / 3)
    assert m["turns_mean"] == pytest.approx(len(served) / 3) == pytest.approx((2 + 2 + 0) / 3)
    assert m["tool_calls_mean"] == pytest.approx(sum(meta["tool_calls"] for meta in metas) / 3)
    assert m["tool_error_rate"] == 0.0  # a malformed call is a parse error, not a failed run
    # what the server saw and served: a failed first request produced no response
    assert m["response_tokens_mean"] == pytest.approx((ok.response_length + bad_call.response_length + 0) / 3)
    served = [
        server.meta_infos[r.body["rid"]]
        for r in server.generate_requests
        if r.body["rid"] in server.meta_infos
    ]
    cached = sum(meta["cached_tokens"] for meta in served)
    assert m["cache_hit_rate"] == pytest.approx(cached / sum(meta["prompt_tokens"] for meta in served))
    assert 0 < m["cache_hit_rate"] < 1 and 0 < m["tool_token_share"] < 1
    assert m["generation_time_s_mean"] > 0 and m["wall_time_s_max"] >= m["wall_time_s_p50"] > 0
    # one weight version throughout (the server's "0"): nothing stale, nothing masked or dropped
    assert {ok.metadata["strands"]["version_newest"], ok.metadata["strands"]["staleness"]} == {"0", 0}
    assert (m["staleness/mean"], m["staleness/max"], m["staleness/multi_version_frac"]) == (0.0, 0.0, 0.0)
    assert (m["staleness/masked_tokens"], m["staleness/dropped_episodes"]) == (0.0, 0.0)
    assert "context_window" not in m, "args of no configuration that ran here: nothing known of a server"

    # slime's own args: the window the process's client sizes turns by (the server's /v1/models says 8192)
    assert log_rollout(4, episode_args(server), [ok]) is False
    assert calls[-1][0]["rollout/strands/context_window"] == 8192.0


# -- slime's logging path --------------------------------------------------------------------------


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_log_rollout_uses_each_slime_layout(monkeypatch, layout):
    calls = install_slime(monkeypatch, layout, step=lambda a, rollout_id: rollout_id * 10)
    samples = [sample(turns=2, tool_calls=1, tool_errors=0), sample(S.TRUNCATED, turns=4)]
    assert log_rollout(3, args(), samples, {"x": 1}, 12.5) is False
    [(metrics, step_key)] = calls
    assert step_key == "rollout/step" and metrics["rollout/step"] == 30  # slime's own step function
    assert metrics["rollout/strands/turns_mean"] == 3.0
    assert metrics["rollout/strands/status/truncated"] == 0.5
    assert metrics["rollout/strands/tool_error_rate"] == 0.0
    assert all(k.startswith("rollout/") for k in metrics)


def test_step_without_slimes_step_function_follows_its_formula(monkeypatch):
    calls = install_slime(monkeypatch, "utils")  # log() importable, compute_rollout_step not
    a = args(
        wandb_always_use_train_step=True, rollout_batch_size=4, n_samples_per_prompt=8, global_batch_size=16
    )
    log_rollout(3, a, [sample(turns=1)], None, 1.0)
    log_rollout(3, args(), [sample(turns=1)], None, 1.0)
    assert [m["rollout/step"] for m, _ in calls] == [3 * 4 * 8 // 16, 3]


def test_nothing_to_log_logs_nothing(slime_logging):
    assert log_rollout(0, args(), [], None, 1.0) is False
    assert log_eval_rollout(0, args(), {}, None) is False
    assert slime_logging == []


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
    assert metrics["eval/strands/aime/termination/end_turn"] == 1.0
    assert all(k.startswith("eval/") for k in metrics)


def test_eval_groups_by_position_like_slime(slime_logging):
    # slime's eval leaves group_index unset: samples come prompt by prompt, n per prompt.
    samples = [sample(reward=r) for r in [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    log_eval_rollout(0, args(), {"aime": {"rewards": [s.reward for s in samples], "samples": samples}}, None)
    metrics = slime_logging[0][0]
    assert metrics["eval/strands/aime/pass@4"] == pytest.approx(0.5)
    assert metrics["eval/strands/aime/pass@1"] == pytest.approx(0.25)
    slime_logging.clear()
    log_eval_rollout(0, args(), {"aime": {"rewards": [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]}}, None)
    assert slime_logging[0][0]["eval/strands/aime/pass@4"] == pytest.approx(0.5)  # rewards alone suffice


def test_eval_samples_per_prompt_per_dataset(slime_logging):
    # --eval-config gives each dataset its own n_samples_per_eval_prompt (objects or plain dicts).
    a = args(
        n_samples_per_eval_prompt=4,
        eval_datasets=[types.SimpleNamespace(name="aime", n_samples_per_eval_prompt=2), {"name": "math"}],
    )
    data = {"aime": {"rewards": [1.0, 0.0, 0.0, 0.0]}, "math": {"rewards": [1.0, 0.0, 0.0, 0.0]}}
    log_eval_rollout(0, a, data, None)
    metrics = slime_logging[0][0]
    assert metrics["eval/strands/aime/pass@2"] == pytest.approx(0.5)  # 2 prompts x 2 samples
    assert "eval/strands/aime/pass@4" not in metrics
    assert metrics["eval/strands/math/pass@4"] == pytest.approx(1.0)  # the global 4 per prompt


def test_eval_pass_at_k_over_ragged_groups(slime_logging):
    # Prompt 0 has 4 samples (1 right), prompt 1 only 2 (both wrong): pass@4 averages over prompt 0 only.
    samples = [
        sample(reward=r, group_index=g)
        for g, r in [(0, 1.0), (0, 0.0), (0, 0.0), (0, 0.0), (1, 0.0), (1, 0.0)]
    ]
    log_eval_rollout(0, args(), {"d": {"rewards": [s.reward for s in samples], "samples": samples}}, None)
    metrics = slime_logging[0][0]
    assert metrics["eval/strands/d/pass@1"] == pytest.approx((0.25 + 0.0) / 2)
    assert metrics["eval/strands/d/pass@2"] == pytest.approx((0.5 + 0.0) / 2)
    assert metrics["eval/strands/d/pass@4"] == pytest.approx(1.0)


def test_eval_without_scalar_rewards_reports_no_accuracy(slime_logging):
    samples = [sample(turns=1), sample(turns=3)]
    log_eval_rollout(0, args(), {"d": {"rewards": [{"acc": 1}, None], "samples": samples}}, None)
    metrics = slime_logging[0][0]
    assert "eval/strands/d/accuracy" not in metrics and metrics["eval/strands/d/turns_mean"] == 2.0


def test_without_slime_logs_to_python_logging(caplog, monkeypatch):
    install_slime(monkeypatch, None)  # every slime import fails
    with caplog.at_level(logging.INFO, logger="slime_strands.metrics"):
        assert log_rollout(0, args(), [sample(turns=1)], None, 1.0) is False
        assert log_eval_rollout(2, args(), {"aime": {"rewards": [1.0, 0.0]}}, None) is False
    assert "'rollout/strands/turns_mean': 1.0" in caplog.text and "'rollout/step': 0" in caplog.text
    assert "'eval/strands/aime/accuracy': 0.5" in caplog.text and "'eval/step': 2" in caplog.text


# -- never raising ---------------------------------------------------------------------------------


def test_never_raises_when_slime_logging_fails(monkeypatch, caplog):
    def broken(*a, **k):
        raise RuntimeError("wandb is down")

    install_slime(monkeypatch, "observability", log=broken)
    assert log_rollout(0, args(), [sample(turns=1)], None, 1.0) is False
    assert log_eval_rollout(0, args(), {"aime": {"rewards": [1.0]}}, None) is False
    failures = [r for r in caplog.records if r.levelno == logging.WARNING and r.exc_info]
    assert [str(r.exc_info[1]) for r in failures] == ["wandb is down"] * 2


def test_never_raises_on_garbage(slime_logging, caplog):
    junk = Sample(metadata={"strands": "junk"})
    assert log_rollout(0, args(), [junk, sample(turns=2)], None, 1.0) is False
    assert "malformed metadata['strands']" in caplog.text
    assert slime_logging[0][0]["rollout/strands/samples"] == 1  # the good sample still counts
    assert log_rollout(0, args(), 42, None, 1.0) is False  # not even a list
    assert log_rollout(0, args(), [None, "x", 3], None, 1.0) is False
    assert log_eval_rollout(0, args(), "garbage", None) is False
    assert log_eval_rollout(0, args(), {"d": {"rewards": "nope", "samples": 5}}, None) is False
    assert log_eval_rollout(0, None, {"d": {"rewards": [1.0]}}, None) is False
    assert "failed (training continues)" in caplog.text
