"""Strands tools of the real-SGLang tier, configured by dotted path (``real_sglang.real_tools.publish_weights``)."""

from __future__ import annotations

import fcntl
import os

from strands import tool

from real_sglang.real_helpers import get_json, post_json

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


WEIGHTS_URL_ENV = "SLIME_STRANDS_TIER_WEIGHTS_URL"
WEIGHTS_PATH_ENV = "SLIME_STRANDS_TIER_WEIGHTS_PATH"
"""Where ``update_weights`` sends its update and the checkpoint it loads (set by the test, read in whichever
process runs the episode: the slime driver's too)."""


@tool
def update_weights() -> str:
    """Update the model's weights (slime's weight update between two turns of an episode).

    slime pauses generation and flushes the prefix cache before it loads new weights; the other episodes here
    run on, and the real server fails an update whose flush it refuses while another episode's turn is running
    (the weights loaded all the same). So the update asks for no flush, as slime's tensor and distributed updates
    do: the call's answer is then the update's own."""
    url, path = os.environ[WEIGHTS_URL_ENV], os.environ[WEIGHTS_PATH_ENV]
    with open(path + ".lock", "a") as lock:  # one update at a time across the episodes' processes
        fcntl.flock(lock, fcntl.LOCK_EX)
        current = get_json(url, "/model_info")["weight_version"]
        new = str(int(current) + 1)
        body = {"model_path": path, "load_format": "auto", "weight_version": new, "flush_cache": False}
        answer = post_json(url, "/update_weights_from_disk", body)
    assert answer.get("success"), answer
    return f"weights {new} loaded"
