"""Helpers of the real-SGLang tier: the server's load report, grammars that make the random-weight model write a
given tool call or answer, plugin settings for the test tools, and the checks every trajectory gets."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from real_sglang.recording_proxy import Exchange, RecordingProxy
from slime_strands.agent.episode import EpisodeSpec, run_episode
from slime_strands.agent.record import EpisodeRecord
from slime_strands.provider.client import SGLANG_CONTEXT_MARGIN, SGLangClient
from slime_strands.provider.token_manager import TokenManager
from slime_strands.settings import PluginSettings
from slime_strands.testing.invariants import assert_trajectory_invariants

CONTEXT_LENGTH = 1024
"""The server's window (--context-length): the tier's tests discover it from /v1/models and check it is this."""
CALL_ADD = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
ANSWER = "The sum is 5.\nAnswer: \\boxed{5}"
GREEDY = {"temperature": 0.0}
TEST_TOOLS = ("rollout_tools.add", "rollout_tools.echo", "rollout_tools.huge_output")


def literal(text: str) -> str:
    """A ``regex`` sampling param that lets the model write exactly ``text`` (xgrammar enforces it)."""
    return re.escape(text)


def one_of(*texts: str) -> str:
    return "(" + "|".join(literal(t) for t in texts) + ")"


def call(name: str, **arguments: Any) -> str:
    """A tool call as Qwen3's template writes it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@dataclass(frozen=True)
class Loads:
    """The server's own load report (``GET /v1/loads``)."""

    running: int
    waiting: int
    used_tokens: int
    max_total_tokens: int


def server_loads(base_url: str) -> Loads:
    with urllib.request.urlopen(f"{base_url}/v1/loads", timeout=10) as response:
        load = json.load(response)["loads"][0]
    return Loads(
        load["num_running_reqs"],
        load["num_waiting_reqs"],
        load["num_used_tokens"],
        load["max_total_num_tokens"],
    )


def post_json(base_url: str, path: str, body: Mapping[str, Any]) -> Any:
    request = urllib.request.Request(
        base_url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        raw = response.read()
    return json.loads(raw) if raw else None  # /abort_request answers 200 with an empty body


def get_json(base_url: str, path: str) -> Any:
    with urllib.request.urlopen(base_url + path, timeout=60) as response:
        return json.load(response)


def settings(**overrides: Any) -> PluginSettings:
    """The test tools, a short system prompt, quick retries, plus ``overrides``."""
    values: dict[str, Any] = {
        "tools": list(TEST_TOOLS),
        "system_prompt": "You add numbers with the add tool, then answer.",
        "retry_delay_s": 0.05,
        "max_retries": 3,
        **overrides,
    }
    return PluginSettings.from_mapping(values)


async def run(
    proxy: RecordingProxy,
    tokenizer: Any,
    sampling_params: Mapping[str, Any],
    *,
    plugin: PluginSettings | None = None,
    prompt: str = "What is 2 + 3?",
    key: str = "episode",
    **spec: Any,
) -> EpisodeRecord:
    """One episode through the proxy, its requests tagged with routing key ``key``."""
    plugin = plugin or settings()
    client = SGLangClient(
        proxy.base_url,
        timeout=plugin.request_timeout_s,
        max_retries=plugin.max_retries,
        retry_delay=plugin.retry_delay_s,
    )
    try:
        return await run_episode(
            tokenizer,
            client,
            plugin,
            EpisodeSpec(prompt=prompt, sampling_params=dict(sampling_params), routing_key=key, **spec),
        )
    finally:
        await client.aclose()


def check_trajectory(tm: TokenManager, proxy: RecordingProxy, key: str) -> list[Exchange]:
    """The trajectory invariants against what the real server saw and answered, and no request it refused.

    Returns the answered /generate exchanges of ``key`` in order (one per generated segment)."""
    assert_trajectory_invariants(tm, proxy, routing_key=key)
    exchanges = proxy.generations(key)
    refused = [(e.status, e.answer) for e in exchanges if e.status not in (200, None)]
    assert not refused, f"the server refused requests: {refused}"
    window = CONTEXT_LENGTH - SGLANG_CONTEXT_MARGIN
    for e in exchanges:
        sent = len(e.body["input_ids"]) + int(e.body["sampling_params"]["max_new_tokens"])
        assert len(e.body["input_ids"]) < window, (
            f"an input of {len(e.body['input_ids'])} tokens reached the edge"
        )
        assert sent <= CONTEXT_LENGTH, f"input + max_new_tokens = {sent} > the window {CONTEXT_LENGTH}"
    # answers with tokens, but not a server abort whose turn was sent again (its partial output is dropped)
    answered = [
        e
        for i, e in enumerate(exchanges)
        if e.status == 200
        and e.rid in proxy.answers
        and not (
            e.finish_type == "abort"
            and any(x.body["input_ids"] == e.body["input_ids"] for x in exchanges[i + 1 :])
        )
    ]
    generated = [s for s in tm.spans if s.kind == "generated"]
    for segment, exchange in zip(generated, answered, strict=False):
        meta = exchange.answer["meta_info"]
        assert segment.info is not None
        assert segment.info.weight_version == meta["weight_version"], "weight_version not recorded per turn"
        assert segment.info.finish_reason == meta["finish_reason"]["type"]
    return answered


def check_record(record: EpisodeRecord, proxy: RecordingProxy, key: str = "episode") -> list[Exchange]:
    assert record.trajectory is not None, record
    return check_trajectory(record.trajectory, proxy, key)


def rid_prefix_pairs(rids: Sequence[str]) -> list[tuple[str, str]]:
    """Pairs of distinct request ids where one starts with the other (SGLang aborts by prefix)."""
    return [(a, b) for a in rids for b in rids if a != b and b.startswith(a)]
