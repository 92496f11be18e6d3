"""slime's REAL ``generate_and_rm`` (the unmodified snapshot) calling the plugin against the REAL server: slime's
GenerateState, its custom-generate dispatch, its reward step and its abort, in a process of their own
(``slime_driver.py``); every sample is checked against what the server saw and answered."""

from __future__ import annotations

import uuid

import pytest

from real_sglang.real_helpers import ANSWER, CALL_ADD, TEST_TOOLS, literal
from real_sglang.slime_runner import run_slime
from slime_strands.testing.invariants import assert_sample_matches_server

pytestmark = [pytest.mark.real_sglang, pytest.mark.timeout(600)]

SLIME_PARAMS = {  # what slime's GenerateState builds (temperature 0 here), plus the grammar of the test
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": -1,
    "max_new_tokens": 512,
    "stop": None,
    "stop_token_ids": None,
    "skip_special_tokens": False,
    "no_stop_trim": True,
    "spaces_between_special_tokens": False,
}
STRANDS = {"tools": list(TEST_TOOLS), "max_tool_iters": 1, "retry_delay_s": 0.05, "max_retries": 3}


def job(regex: str | None = None, **extra) -> dict:
    params = {**SLIME_PARAMS, **({"regex": regex} if regex else {}), **extra.pop("params", {})}
    return {
        "session_id": str(uuid.uuid4()),
        "prompt": "What is 2 + 3?",
        "label": "5",
        "sampling_params": params,
        **extra,
    }


def test_generate_and_rm_runs_the_agent_and_scores_it(proxy):
    answer, tool = job(literal(ANSWER)), job(literal(CALL_ADD))
    done, truncated = run_slime(proxy, [answer, tool], STRANDS)
    assert (done.status, done.reward) == ("COMPLETED", 1.0), done.metadata
    assert truncated.status == "TRUNCATED" and truncated.reward < 0, truncated.metadata
    assert truncated.metadata["strands"]["termination"] == "tool_limit"
    for sample in (done, truncated):
        assert_sample_matches_server(sample, proxy, routing_key=sample.session_id)
        answers = [e.answer["meta_info"] for e in proxy.generations(sample.session_id)]
        assert sample.weight_versions == [meta["weight_version"] for meta in answers]
    assert len(proxy.generations(truncated.session_id)) == 2


def test_slimes_abort_through_generate_and_rm(proxy):
    long_turn = job(params={"ignore_eos": True, "max_new_tokens": 900}, abort=True)
    (sample,) = run_slime(proxy, [long_turn], STRANDS)
    assert (sample.status, sample.reward) == ("ABORTED", None), sample.metadata
    aborts = [e.body for e in proxy.exchanges if e.path == "/abort_request"]
    assert {"abort_all": True} in aborts, "slime's abort of every server"
    (exchange,) = proxy.generations(sample.session_id)
    assert exchange.finish_type == "abort"
    # the plugin aborts its own request too, the moment the flag is up: by its exact id, nothing else
    assert all(body == {"abort_all": True} or body == {"rid": exchange.rid} for body in aborts), aborts
