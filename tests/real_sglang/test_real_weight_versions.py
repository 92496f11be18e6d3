"""Weight versions that really change: the REAL SGLang 0.5.23 server's weights are updated between the turns of
an episode (``/update_weights_from_disk`` with a second copy of the tiny model, written with weights of its own,
and a new ``weight_version``, as slime's update sends it), through slime's REAL ``generate_and_rm``.

Each episode's tool is the update: turn 1 calls it (the server loads the checkpoint as version N+1), turn 2
calls it again (N+2), turn 3's call is over the tool limit (``max_tool_iters`` 2): three generated turns, each
of a version of its own. Four episodes run at once, one per ``strands.staleness`` setting (none; ``mask`` with
``max_versions`` 0 and 1; ``drop`` with 1), so the versions the others' updates add between an episode's turns
are whatever the server says: every expectation is computed from what the server answered (each answer's
``meta_info.weight_version``), through the recording proxy.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from real_sglang import real_tools
from real_sglang.real_helpers import call, get_json, literal, post_json
from real_sglang.recording_proxy import Exchange, RecordingProxy
from real_sglang.server_setup import server_python, wait_idle
from real_sglang.slime_runner import finish_slime, start_slime
from real_sglang.tiny_model import make_tiny_weights
from slime_strands import metrics
from slime_strands.agent.record import EpisodeRecord
from slime_strands.testing.invariants import assert_sample_matches_server

pytestmark = [pytest.mark.real_sglang, pytest.mark.timeout(900)]

GREEDY = {
    "temperature": 0.0, "top_p": 1.0, "top_k": -1, "stop": None, "stop_token_ids": None,
    "skip_special_tokens": False, "no_stop_trim": True, "spaces_between_special_tokens": False,
}  # fmt: skip
UPDATE = call("update_weights")
STRANDS = {
    "tools": ["real_sglang.real_tools.update_weights"],
    "system_prompt": "You update the weights with the update_weights tool.",
    "max_tool_iters": 2,
    "retry_delay_s": 0.05,
    "max_retries": 3,
}
BOUNDS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "mask0": {"max_versions": 0, "on_exceed": "mask"},
    "mask1": {"max_versions": 1, "on_exceed": "mask"},
    "drop1": {"max_versions": 1, "on_exceed": "drop"},
}
FIRST_VERSION = 1


@dataclass(frozen=True)
class Episode:
    key: str
    bound: dict[str, Any] | None
    sample: SimpleNamespace


@dataclass(frozen=True)
class WeightRun:
    proxy: RecordingProxy
    episodes: dict[str, Episode]


@pytest.fixture(scope="module")
def weight_run(sglang_server, tmp_path_factory) -> Iterator[WeightRun]:
    """The four episodes, each in a slime driver of its own, all at once against one server whose weights
    their tools update; the server's version label is put back afterwards (its weights stay the copy's)."""
    checkpoint = make_tiny_weights(tmp_path_factory.mktemp("weights") / "tiny-qwen3-v2", server_python())
    base = sglang_server.base_url
    before = get_json(base, "/model_info")["weight_version"]
    post_json(base, "/update_weight_version", {"new_version": str(FIRST_VERSION)})
    saved_env = {k: os.environ.get(k) for k in (real_tools.WEIGHTS_URL_ENV, real_tools.WEIGHTS_PATH_ENV)}
    os.environ[real_tools.WEIGHTS_PATH_ENV] = str(checkpoint)
    try:
        wait_idle(base)
        with RecordingProxy(base) as proxy:
            os.environ[real_tools.WEIGHTS_URL_ENV] = proxy.base_url  # the updates are recorded too
            keys = {name: str(uuid.uuid4()) for name in BOUNDS}
            drivers = {}
            for name, bound in BOUNDS.items():
                strands = {**STRANDS, **({"staleness": bound} if bound else {})}
                job = {
                    "session_id": keys[name],
                    "prompt": "Update the weights.",
                    "label": "5",
                    "sampling_params": {**GREEDY, "regex": literal(UPDATE), "max_new_tokens": 256},
                }
                drivers[name] = start_slime(proxy, [job], strands)
            episodes = {}
            for name, driver in drivers.items():
                (sample,) = finish_slime(driver)
                episodes[name] = Episode(keys[name], BOUNDS[name], sample)
            yield WeightRun(proxy, episodes)
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        wait_idle(base)
        post_json(base, "/update_weight_version", {"new_version": before})


def answered(proxy: RecordingProxy, key: str) -> list[Exchange]:
    exchanges = proxy.generations(key)
    assert [e.status for e in exchanges] == [200] * len(exchanges), "the server refused a request"
    return exchanges


def versions(proxy: RecordingProxy, key: str) -> list[int]:
    """Per turn, the version the server answered it with."""
    return [int(e.answer["meta_info"]["weight_version"]) for e in answered(proxy, key)]


def served(proxy: RecordingProxy, sample: Any, key: str) -> list[tuple[int, int, int]]:
    """Per turn, as the server answered it: (version, start in the response, length)."""
    prompt = len(sample.tokens) - sample.response_length
    out, position = [], prompt
    for exchange in answered(proxy, key):
        ids = list(exchange.answer["output_ids"])
        start = _find(sample.tokens, ids, position)
        out.append((int(exchange.answer["meta_info"]["weight_version"]), start - prompt, len(ids)))
        position = start + len(ids)
    return out


def _find(haystack: list[int], needle: list[int], start: int) -> int:
    for i in range(start, len(haystack) - len(needle) + 1):
        if haystack[i : i + len(needle)] == needle:
            return i
    raise AssertionError("a turn the server answered is not in the sample's tokens")


def test_the_server_reports_each_update_and_each_turn_records_its_version(weight_run):
    """Three turns per episode, each answered with the version the server had loaded: the version goes up
    between two turns of the episode (its own update, and any the others' made); the sample's
    ``weight_versions`` and the record's newest are the answers' ``weight_version``."""
    proxy = weight_run.proxy
    updates = [e for e in proxy.exchanges if e.path == "/update_weights_from_disk"]
    # every update of the run loaded the checkpoint and named a new version (2 per episode)
    assert len(updates) == 2 * len(BOUNDS)
    assert all(e.status == 200 and e.answer["success"] for e in updates), [e.answer for e in updates]
    assert sorted(int(e.body["weight_version"]) for e in updates) == list(
        range(FIRST_VERSION + 1, FIRST_VERSION + 1 + len(updates))
    )
    for name, episode in weight_run.episodes.items():
        sample, exchanges = episode.sample, answered(proxy, episode.key)
        assert len(exchanges) == 3, name
        reported = [e.answer["meta_info"]["weight_version"] for e in exchanges]
        versions = [int(v) for v in reported]
        assert versions[0] < versions[1] < versions[2], (name, reported)
        for exchange in exchanges:  # the answer's own per-token spans name the same version
            meta = exchange.answer["meta_info"]
            assert {s["version"] for s in meta["weight_versions"]} == {meta["weight_version"]}, meta
        # a FAILED sample (drop) carries no response, so no versions; every other one, one per answer
        assert sample.weight_versions == ([] if sample.status == "FAILED" else reported), name
        record = EpisodeRecord.of(sample)
        assert record is not None and record.version_newest == reported[-1]


@pytest.mark.parametrize("name", ["none", "mask0", "mask1"])
def test_the_loss_mask_trains_exactly_the_tokens_within_the_bound(weight_run, name):
    """``mask``: a turn more than K versions before the episode's newest has loss mask 0 (in the context, its
    logprobs as sampled), every newer one is trained; the record counts what was masked and measures what was
    trained."""
    proxy, episode = weight_run.proxy, weight_run.episodes[name]
    sample = episode.sample
    turns = served(proxy, sample, episode.key)
    newest = max(v for v, _, _ in turns)
    bound = None if episode.bound is None else episode.bound["max_versions"]
    trained_versions = [v for v, _, _ in turns if bound is None or v >= newest - bound]
    masked = 0
    for version, start, length in turns:
        trained = bound is None or version >= newest - bound
        assert sample.loss_mask[start : start + length] == [int(trained)] * length, (version, turns)
        masked += 0 if trained else length
    assert sample.status == "TRUNCATED" and not sample.remove_sample, "the newest turn is always trained"
    assert_sample_matches_server(
        sample, proxy, routing_key=episode.key, masked_before=_masked_prefix(turns, bound)
    )
    record = EpisodeRecord.of(sample)
    assert record is not None
    assert record.stale_masked_tokens == masked
    assert (masked > 0) == (bound is not None), "two updates per episode: a bound of 0 or 1 masks turn 1"
    assert record.version_earliest_trained == str(min(trained_versions))
    assert record.version_latest_trained == str(newest)
    assert record.versions_trained == len(set(trained_versions))
    assert record.staleness == newest - min(trained_versions)
    m = metrics.aggregate([sample])
    assert m["staleness/masked_tokens"] == float(masked)
    assert m["staleness/dropped_episodes"] == 0.0
    assert m["staleness/mean"] == m["staleness/max"] == float(newest - min(trained_versions))
    assert m["staleness/multi_version_frac"] == float(len(set(trained_versions)) > 1)


def _masked_prefix(turns: list[tuple[int, int, int]], bound: int | None) -> int:
    """Response positions up to the end of the last masked turn (the masked turns come first: versions rise)."""
    if bound is None:
        return 0
    newest = max(v for v, _, _ in turns)
    return max((start + n for v, start, n in turns if v < newest - bound), default=0)


def test_drop_fails_the_episode_that_outlives_the_bound(weight_run):
    """``drop`` with K = 1: two updates within the episode put its first turn at least 2 versions before its
    newest, so it ends FAILED (kept out of its group) and the rollout log counts it."""
    proxy, episode = weight_run.proxy, weight_run.episodes["drop1"]
    sample = episode.sample
    turns = versions(proxy, episode.key)
    span = max(turns) - min(turns)
    assert span >= 2
    assert sample.status == "FAILED", sample.status
    assert 1 not in (sample.loss_mask or []), "a dropped episode trains nothing"
    record = EpisodeRecord.of(sample)
    assert record is not None and record.stale_dropped and record.staleness == span
    assert "staleness.max_versions=1" in (record.error or ""), record.error
    m = metrics.aggregate([sample])
    assert m["staleness/dropped_episodes"] == 1.0 and m["staleness/masked_tokens"] == 0.0
    assert "staleness/mean" not in m, "a dropped episode is not measured as trained"


def test_the_step_metrics_are_what_the_served_versions_say(weight_run):
    """The step's ``staleness/*`` over the four samples, from the server's answers alone."""
    proxy = weight_run.proxy
    measured, masked = [], 0
    multi = 0
    for name, episode in weight_run.episodes.items():
        if name == "drop1":
            continue
        turns = served(proxy, episode.sample, episode.key)
        newest = max(v for v, _, _ in turns)
        bound = None if episode.bound is None else episode.bound["max_versions"]
        kept = [v for v, _, _ in turns if bound is None or v >= newest - bound]
        masked += sum(n for v, _, n in turns if v not in kept)
        measured.append(newest - min(kept))
        multi += len(set(kept)) > 1
    m = metrics.aggregate([e.sample for e in weight_run.episodes.values()])
    assert m["staleness/mean"] == pytest.approx(sum(measured) / len(measured))
    assert m["staleness/max"] == float(max(measured))
    assert m["staleness/multi_version_frac"] == pytest.approx(multi / len(measured))
    assert m["staleness/masked_tokens"] == float(masked)
    assert m["staleness/dropped_episodes"] == 1.0


def test_the_checkpoint_is_a_real_second_copy(weight_run, tmp_path):
    """The update read weights from disk (the copy has a safetensors checkpoint; the server's answer says so)."""
    updates = [e for e in weight_run.proxy.exchanges if e.path == "/update_weights_from_disk"]
    path = Path(updates[0].body["model_path"])
    assert (path / "model.safetensors").is_file()
    assert "Succeeded to update model weights" in updates[0].answer["message"]
