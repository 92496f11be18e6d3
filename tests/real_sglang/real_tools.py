"""Strands tools of the real-SGLang tier, configured by dotted path (``real_sglang.real_tools.publish_weights``)."""

from __future__ import annotations

from strands import tool

from real_sglang.real_helpers import post_json

SERVER: dict[str, str] = {}
"""``url``: the SGLang server ``publish_weights`` talks to (set by the test)."""


@tool
def publish_weights(version: str) -> str:
    """Publish new weights (stands for slime's weight sync between two turns of a rollout)."""
    answer = post_json(
        SERVER["url"], "/update_weight_version", {"new_version": version, "abort_all_requests": False}
    )
    assert answer.get("success"), answer
    return f"weights {version} published"
