"""Every answer recorded from the REAL SGLang 0.5.23 server (``tests/data/sglang-0.5.23-answers``: the request
and what the server answered) replayed against the stand-in: the same request, to a stand-in configured like the
recorded server (a tiny Qwen3, ``--context-length 1024 --max-total-tokens 4096``), scripted to write what the
real model wrote plus more (so the stand-in's own stop rules must end the output where the real server did),
must get the same status, error text, ``finish_reason``, ``meta_info`` keys, output and text.

A new recorded answer without a replay here fails the suite.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from standin_kit import QWEN3_EOS, get, post, prompt, wait_until

from slime_strands.testing import SGLangTestServer, SGLangTestServerError, Turn

pytestmark = pytest.mark.timeout(120)

RECORDED = Path(__file__).resolve().parents[1] / "data" / "sglang-0.5.23-answers"


def recorded(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / name).read_text())


def like_the_recorded_server(tokenizer: Any) -> SGLangTestServer:
    """The recorded server's configuration (see docs: real-sglang-on-cpu.md)."""
    return SGLangTestServer(
        tokenizer,
        context_length=1024,
        kv_capacity=4096,
        context_length_flag=True,
        model_path="models/tiny-qwen3",
        weight_version="default",
        eos_tokens=QWEN3_EOS,
        vocab_size=151936,
        top_p_patch=False,  # stock SGLang: slime's patch is not there
    )


def as_sent(tokenizer: Any, request: dict[str, Any]) -> dict[str, Any]:
    """The recorded request with its ``"<N ids>"`` placeholder made N real ids."""
    body = dict(request)
    if isinstance(body.get("input_ids"), str):
        body["input_ids"] = prompt(tokenizer, int(re.fullmatch(r"<(\d+) ids>", body["input_ids"])[1]))
    return body


def what_the_model_wrote(tokenizer: Any, answer: dict[str, Any], budget: int) -> Turn:
    """The recorded output followed by more tokens: the stand-in must end it where the real server did."""
    more = tokenizer.encode(" word", add_special_tokens=False) * budget
    return Turn(token_ids=[*answer["output_ids"], *more], finish="length")


# -- replays ----------------------------------------------------------------------------------------


def replay_generate(tokenizer: Any, record: dict[str, Any]) -> tuple[int | None, Any]:
    body = as_sent(tokenizer, record["request"])
    with like_the_recorded_server(tokenizer) as server:
        if record["status"] == 200:
            server.script(what_the_model_wrote(tokenizer, record["response"], 1024))
        return post(server, "/generate", body)


def replay_regex_tool_call(tokenizer: Any, record: dict[str, Any]) -> tuple[int | None, Any]:
    # Recorded with the sampling params only; the answer shows the rest (12 prompt tokens, logprobs from the last).
    body = {
        "input_ids": prompt(tokenizer, 12),
        "return_logprob": True,
        "logprob_start_len": 11,
        "rid": "rx1",
        "stream": False,
        **record["request"],
    }
    with like_the_recorded_server(tokenizer) as server:
        server.script(what_the_model_wrote(tokenizer, record["response"], 64))
        return post(server, "/generate", body)


def replay_abort(tokenizer: Any, record: dict[str, Any]) -> tuple[int | None, Any]:
    body = as_sent(tokenizer, record["request"])
    written = len(record["response"]["output_ids"])
    with like_the_recorded_server(tokenizer) as server, ThreadPoolExecutor(1) as pool:
        turn = what_the_model_wrote(tokenizer, record["response"], 1000)
        turn.delay_s, turn.pause_at = 600, written  # only the abort answers it, after `written` tokens
        server.script(turn)
        answer = pool.submit(post, server, "/generate", body)
        wait_until(lambda: body["rid"] in server.running)
        assert post(server, "/abort_request", {"rid": body["rid"]}) == (record["abort_request_status"], "")
        return answer.result()


def replay_duplicate_concurrent(tokenizer: Any, record: dict[str, Any]) -> tuple[int | None, Any]:
    """Two requests with one rid at once: the first waits in the queue (a long request fills the pool), the
    second is refused, then the first runs and finishes."""
    first = {"input_ids": prompt(tokenizer, 15), "rid": "dup-concurrent", "return_logprob": True,
             "sampling_params": {"max_new_tokens": 300, "ignore_eos": True}}  # fmt: skip
    blocker = {
        "input_ids": prompt(tokenizer, 1000),
        "rid": "blocker",
        "sampling_params": {"max_new_tokens": 22},
    }
    server = SGLangTestServer(tokenizer, context_length=1024, kv_capacity=1100, eos_tokens=QWEN3_EOS)
    with server, ThreadPoolExecutor(2) as pool:
        server.script(Turn(token_ids=[11] * 22, finish="length", delay_s=600))
        server.script(Turn(token_ids=[11] * 300, finish="length"))
        blocked = pool.submit(post, server, "/generate", blocker)
        wait_until(lambda: server.running == ["blocker"])
        answered = pool.submit(post, server, "/generate", first)
        wait_until(lambda: server.waiting == ["dup-concurrent"])
        second = post(server, "/generate", first)
        post(server, "/abort_request", {"rid": "blocker"})
        assert blocked.result()[1]["meta_info"]["finish_reason"]["message"] == "Aborted"
        status, answer = answered.result()
    meta = answer["meta_info"]
    return None, {  # recorded as the pair
        "1": {"status": second[0], "body": second[1]},
        "0": {
            "status": status,
            "body": {"finish_reason": meta["finish_reason"], "n": len(answer["output_ids"])},
        },
    }


def replay_duplicate_sequential(tokenizer: Any, record: dict[str, Any]) -> tuple[int | None, Any]:
    body = as_sent(tokenizer, record["request"])
    with like_the_recorded_server(tokenizer) as server:
        server.script(*[what_the_model_wrote(tokenizer, record["response"], 128)] * 2)
        assert post(server, "/generate", body)[0] == 200
        return post(server, "/generate", body)  # the rid again, once the first is answered: fine


def replay_out_of_vocabulary(tokenizer: Any, record: dict[str, Any]) -> tuple[int | None, Any]:
    server = like_the_recorded_server(tokenizer).start()
    try:
        outcome = post(
            server, "/generate", {"input_ids": [*prompt(tokenizer, 4), 200000], "sampling_params": {}}
        )
        assert post(server, "/generate", {"input_ids": prompt(tokenizer, 4)}) == (None, ""), (
            "the server is gone"
        )
    finally:
        with pytest.raises(SGLangTestServerError, match="input id 200000 is outside the vocabulary"):
            server.stop()
    return outcome[0], "connection closed without response" if outcome == (None, "") else outcome[1]


REPLAYS: dict[str, Callable[[Any, dict[str, Any]], tuple[int | None, Any]]] = {
    "custom_params_top_p_patch.json": replay_generate,
    "duplicate_rid_concurrent.json": replay_duplicate_concurrent,
    "duplicate_rid_sequential.json": replay_duplicate_sequential,
    "error_input_id_out_of_vocab.json": replay_out_of_vocabulary,
    "error_input_longer_than_context.json": replay_generate,
    "error_input_plus_max_new_tokens.json": replay_generate,
    "error_logprob_start_len_too_big.json": replay_generate,
    "error_scheduler_max_input_len.json": replay_generate,
    "error_unknown_sampling_param.json": replay_generate,
    "generate_abort.json": replay_abort,
    "generate_greedy.json": replay_generate,
    "generate_length.json": replay_generate,
    "generate_logprob_start_len_omitted.json": replay_generate,
    "generate_regex_tool_call.json": replay_regex_tool_call,
    "generate_silent_clamp.json": replay_generate,
    "generate_stop_str.json": replay_generate,
    "generate_stop_token.json": replay_generate,
    "generate_stop_token_slime.json": replay_generate,
    "routed_experts_without_server_flag.json": replay_generate,
    "unknown_top_level_field.json": replay_generate,
}
GET_ROUTES = {
    "GET_health.json": "/health",
    "GET_model_info.json": "/model_info",
    "GET_server_info.json": "/server_info",
    "GET_get_server_info.json": "/get_server_info",
    "GET_v1_models.json": "/v1/models",
}


def test_every_recorded_answer_has_a_replay():
    assert {p.name for p in RECORDED.glob("*.json")} == set(REPLAYS) | set(GET_ROUTES)


@pytest.mark.parametrize("name", sorted(REPLAYS))
def test_the_stand_in_answers_the_recorded_request_as_sglang_did(tokenizer, name):
    record = recorded(name)
    status, answer = REPLAYS[name](tokenizer, record)
    if "status" not in record:  # the concurrent duplicates: both answers
        assert answer == record
        return
    assert status == record["status"]
    real = record["response"]
    if status is None:  # the server died: the record adds its log
        assert real.startswith(answer)
        return
    if status != 200 or "meta_info" not in real:
        assert answer == real  # error bodies and texts, exactly
        return
    assert_same_answer(answer, real)


def assert_same_answer(ours: dict[str, Any], real: dict[str, Any]) -> None:
    """Same keys, finish, output and text; logprob entries shaped alike; every count consistent."""
    assert ours.keys() == real.keys()
    mine, theirs = ours["meta_info"], real["meta_info"]
    assert mine.keys() == theirs.keys()
    assert mine["finish_reason"] == theirs["finish_reason"]
    assert ours["output_ids"] == real["output_ids"]
    assert ours["text"] == real["text"]
    same = ("id", "prompt_tokens", "completion_tokens", "output_token_logprobs_length", "weight_version",
            "weight_versions", "num_retractions", "reasoning_tokens", "dp_rank")  # fmt: skip
    assert {k: mine.get(k) for k in same} == {k: theirs.get(k) for k in same}
    assert [e[1:] for e in mine["output_token_logprobs"]] == [e[1:] for e in theirs["output_token_logprobs"]]
    assert all(isinstance(e[0], float) and e[0] <= 0 for e in mine["output_token_logprobs"])
    assert shape(mine["input_token_logprobs"]) == shape(theirs["input_token_logprobs"])
    for meta in (mine, theirs):
        details = meta["cached_tokens_details"]
        assert (details is None) == (meta["cached_tokens"] == 0)
        assert details is None or details == {"device": meta["cached_tokens"], "host": 0}
        assert isinstance(meta["e2e_latency"], float) and isinstance(
            meta["response_sent_to_client_ts"], float
        )


def shape(entries: list[list[Any]]) -> list[tuple[str, ...]]:
    return [tuple(type(v).__name__ for v in entry) for entry in entries]


@pytest.mark.parametrize("name", sorted(GET_ROUTES))
def test_the_stand_in_answers_the_recorded_get_as_sglang_did(tokenizer, name):
    """Every key the stand-in sends, the real server sends, with the same value where the configuration sets it."""
    record = recorded(name)
    with like_the_recorded_server(tokenizer) as server:
        status, answer = get(server, GET_ROUTES[name])
    real = record["response"]
    assert status == record["status"]
    if not isinstance(real, dict):
        assert answer == real
        return
    if "data" in real:  # /v1/models: the cards
        answer, real = answer["data"][0], real["data"][0]
    assert answer.keys() <= real.keys(), answer.keys() - real.keys()
    assert {k: v for k, v in answer.items() if k != "created"} == {
        k: real[k] for k in answer if k != "created"
    }
