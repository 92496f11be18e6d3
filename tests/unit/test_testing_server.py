"""The stand-in server behaves like SGLang 0.5.23 where a kinder stand-in would hide a client's defect: aborts
matched by rid prefix, a hung-up client's request aborted, a queue before a full token pool, the model's end
ids stopping whatever the request says, SGLang's own sampling keys and texts, and a loud failure where the real
server would crash or write on."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from standin_kit import QWEN3_EOS, post, prompt, send_and_hang_up, wait_until

from slime_strands.testing import SGLangTestServer, SGLangTestServerError, Turn
from slime_strands.testing.sglang_checks import SAMPLING_FIELDS

pytestmark = pytest.mark.timeout(60)

RECORDED = Path(__file__).resolve().parents[1] / "data" / "sglang-0.5.23-answers"
HOLD = 600  # a turn held this long is answered only by an abort (or the server's stop)
SPARSE_ABORT_KEYS = {
    "id", "finish_reason", "weight_version", "e2e_latency", "weight_versions", "input_token_logprobs",
    "output_token_logprobs", "output_token_logprobs_length", "completion_tokens",
}  # fmt: skip


def body(tokenizer: Any, rid: str, n: int = 15, **params: Any) -> dict[str, Any]:
    """What the client sends: token-in, logprobs from the last input token on."""
    return {
        "input_ids": prompt(tokenizer, n),
        "return_logprob": True,
        "logprob_start_len": n - 1,
        "rid": rid,
        "stream": False,
        "sampling_params": {"max_new_tokens": 64, **params},
    }


def held(text: str = "one two three four five six seven eight", **kwargs: Any) -> Turn:
    return Turn(text, delay_s=HOLD, **kwargs)


# -- aborts -----------------------------------------------------------------------------------------


def test_an_abort_ends_every_request_whose_rid_starts_with_it(tokenizer):
    with SGLangTestServer(tokenizer) as server, ThreadPoolExecutor(3) as pool:
        server.script(held(pause_at=3), held(pause_at=2), "untouched")
        first = pool.submit(post, server, "/generate", body(tokenizer, "r1"))
        wait_until(lambda: server.running == ["r1"])
        retry = pool.submit(post, server, "/generate", body(tokenizer, "r1-retry1"))
        wait_until(lambda: server.running == ["r1", "r1-retry1"])
        assert post(server, "/abort_request", {"rid": "r1"}) == (200, "")
        for future, written in ((first, 3), (retry, 2)):
            status, answer = future.result()
            assert status == 200
            assert answer["meta_info"]["finish_reason"] == {
                "type": "abort", "message": "Aborted", "status_code": None, "err_type": None,
            }  # fmt: skip
            assert len(answer["output_ids"]) == written == len(answer["meta_info"]["output_token_logprobs"])
        assert server.aborted_requests == ["r1", "r1-retry1"]
        assert (
            post(server, "/generate", body(tokenizer, "r2"))[1]["meta_info"]["finish_reason"]["type"]
            == "stop"
        )


def test_the_partial_output_is_what_was_written_before_the_abort_with_its_logprobs(tokenizer):
    text = "alpha beta gamma delta"
    expected = tokenizer.encode(text, add_special_tokens=False)[:2]
    with SGLangTestServer(tokenizer) as server, ThreadPoolExecutor(1) as pool:
        server.script(held(text, pause_at=2, logprobs=[-0.5, -0.25, -0.125]))
        answer = pool.submit(post, server, "/generate", body(tokenizer, "cut"))
        wait_until(lambda: server.running == ["cut"])
        post(server, "/abort_request", {"rid": "cut"})
        meta = answer.result()[1]["meta_info"]
    assert answer.result()[1]["output_ids"] == expected
    assert meta["output_token_logprobs"] == [[-0.5, expected[0], None], [-0.25, expected[1], None]]
    assert meta["completion_tokens"] == 2 and meta["weight_versions"] == [
        {"version": "0", "start": 0, "end": 2}
    ]
    assert server.answers["cut"] == (expected, [-0.5, -0.25])


def test_an_abort_of_an_unknown_rid_reaches_nothing_even_as_a_prefix(tokenizer):
    """The tokenizer manager forwards an abort only for a rid it knows; the prefix match comes after."""
    with SGLangTestServer(tokenizer) as server, ThreadPoolExecutor(1) as pool:
        server.script(held())
        answer = pool.submit(post, server, "/generate", body(tokenizer, "sample-7"))
        wait_until(lambda: server.running == ["sample-7"])
        post(server, "/abort_request", {"rid": "sample"})
        post(server, "/abort_request", {"rid": ""})
        assert server.running == ["sample-7"] and server.aborted_requests == []
        post(server, "/abort_request", {"abort_all": True})
        assert answer.result()[1]["meta_info"]["finish_reason"]["message"] == "Aborted"
    assert server.aborted_rids == ["sample", "sample-7"]


def test_a_client_that_hangs_up_has_its_request_aborted(tokenizer):
    with SGLangTestServer(tokenizer, disconnect_check_s=0.01) as server:
        server.script(held())
        send_and_hang_up(server, body(tokenizer, "gone"), until=lambda: server.running == ["gone"])
        wait_until(lambda: server.disconnected_rids == ["gone"])
        wait_until(lambda: server.in_flight == [])
        assert server.aborted_requests == ["gone"] and "gone" not in server.meta_infos


def test_a_retry_named_after_a_hung_up_request_dies_with_it(tokenizer):
    """Issue 24, defect 1, as SGLang does it: the original's hang-up aborts its rid, by prefix, and so the
    in-flight ``{rid}-retry1`` (the check never fires on its own here: only the retry's arrival triggers it)."""
    with SGLangTestServer(tokenizer, disconnect_check_s=HOLD) as server:
        server.script(held(), Turn("the retry's answer", pause_at=0))
        send_and_hang_up(server, body(tokenizer, "orig"), until=lambda: server.running == ["orig"])
        status, answer = post(server, "/generate", body(tokenizer, "orig-retry1"))
        assert server.disconnected_rids == ["orig"]
    assert status == 200 and answer["meta_info"]["finish_reason"]["message"] == "Aborted"
    assert answer["output_ids"] == []  # aborted as it started
    assert server.aborted_requests == ["orig", "orig-retry1"]


def test_an_unrelated_rid_survives_a_hang_up(tokenizer):
    with SGLangTestServer(tokenizer, disconnect_check_s=HOLD) as server:
        server.script(held(), "fresh")
        send_and_hang_up(server, body(tokenizer, "orig"), until=lambda: server.running == ["orig"])
        status, answer = post(server, "/generate", body(tokenizer, "f3a9c1"))
    assert status == 200 and answer["meta_info"]["finish_reason"]["type"] == "stop"


# -- the queue --------------------------------------------------------------------------------------


def test_requests_wait_while_the_token_pool_is_full(tokenizer):
    # a pool of 200 tokens: a request of 15 input + 64 new holds 79 of it, so two run and the third waits
    with (
        SGLangTestServer(tokenizer, context_length=150, kv_capacity=200) as server,
        ThreadPoolExecutor(3) as pool,
    ):
        server.script(held(), held(), "third")
        answers = [pool.submit(post, server, "/generate", body(tokenizer, rid)) for rid in ("a", "b")]
        wait_until(lambda: server.running == ["a", "b"])
        third = pool.submit(post, server, "/generate", body(tokenizer, "c"))
        wait_until(lambda: server.waiting == ["c"])
        assert server.pending() == 1, "a waiting request has not taken its turn yet"
        post(server, "/abort_request", {"rid": "a"})
        assert third.result()[1]["meta_info"]["finish_reason"]["type"] == "stop"
        assert answers[0].result()[1]["meta_info"]["finish_reason"]["message"] == "Aborted"
        post(server, "/abort_request", {"rid": "b"})


def test_an_abort_in_the_waiting_queue_answers_nothing_with_a_sparse_meta_info(tokenizer):
    with (
        SGLangTestServer(tokenizer, context_length=100, kv_capacity=100) as server,
        ThreadPoolExecutor(2) as pool,
    ):
        server.script(held())
        running = pool.submit(post, server, "/generate", body(tokenizer, "big", max_new_tokens=60))
        wait_until(lambda: server.running == ["big"])
        queued = pool.submit(post, server, "/generate", body(tokenizer, "queued", max_new_tokens=60))
        wait_until(lambda: server.waiting == ["queued"])
        post(server, "/abort_request", {"rid": "queued"})
        status, answer = queued.result()
        post(server, "/abort_request", {"rid": "big"})
        running.result()
    assert status == 200 and answer["output_ids"] == [] and answer["text"] == ""
    meta = answer["meta_info"]
    assert meta.keys() == SPARSE_ABORT_KEYS
    assert meta["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}
    assert meta["weight_versions"] == [{"version": "0", "start": 0, "end": 0}]
    assert meta["output_token_logprobs"] == [] and meta["completion_tokens"] == 0
    assert server.pending() == 0, "the running request took the only turn"


# -- stops ------------------------------------------------------------------------------------------


def test_the_models_end_ids_stop_whatever_the_request_asks(tokenizer):
    endoftext, im_end = (tokenizer.convert_tokens_to_ids(t) for t in QWEN3_EOS)
    words = tokenizer.encode("before", add_special_tokens=False)
    after = tokenizer.encode(" after", add_special_tokens=False)
    with SGLangTestServer(tokenizer, eos_tokens=QWEN3_EOS) as server:
        server.script(Turn("done", stop_token_id=endoftext), Turn(token_ids=[*words, endoftext, *after]))
        first = post(server, "/generate", body(tokenizer, "a", stop_token_ids=[im_end]))[1]
        second = post(server, "/generate", body(tokenizer, "b", stop_token_ids=[im_end]))[1]
    assert first["output_ids"][-1] == endoftext and first["text"] == "done"
    assert first["meta_info"]["finish_reason"] == {"type": "stop", "matched": endoftext}
    assert second["output_ids"] == [*words, endoftext], "a scripted end id mid-text ends the output there"


def test_ignore_eos_writes_past_every_stop_token(tokenizer):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = [
        *tokenizer.encode("a b", add_special_tokens=False),
        im_end,
        *tokenizer.encode(" c d e f", add_special_tokens=False),
    ]
    with SGLangTestServer(tokenizer) as server:
        server.script(Turn(token_ids=ids, finish="length"))
        answer = post(server, "/generate", body(tokenizer, "x", max_new_tokens=4, ignore_eos=True))[1]
    assert answer["output_ids"] == ids[:4] and answer["meta_info"]["finish_reason"] == {
        "type": "length",
        "length": 4,
    }


def test_stop_strings_and_the_text_trim(tokenizer):
    text = "First line. STOP and more"
    with SGLangTestServer(tokenizer) as server:
        server.script(Turn(text), Turn(text))
        trimmed = post(server, "/generate", body(tokenizer, "a", stop=["STOP"]))[1]
        kept = post(server, "/generate", body(tokenizer, "b", stop="STOP", no_stop_trim=True))[1]
    assert trimmed["meta_info"]["finish_reason"] == {"type": "stop", "matched": "STOP"}
    assert trimmed["text"] == "First line. " and kept["text"] == "First line. STOP"
    assert tokenizer.decode(trimmed["output_ids"]).endswith("STOP"), (
        "output_ids keep the stop string's tokens"
    )


@pytest.mark.parametrize(
    ("turn", "params", "why"),
    [
        (
            Turn("x", stop_token_id=151643),
            {},
            "does not stop this request",
        ),  # <|endoftext|> is no default end id
        (Turn("x"), {"ignore_eos": True}, "does not stop this request"),
        (Turn("short", finish="length"), {}, "the real model would write on"),
    ],
)
def test_a_script_the_real_model_would_not_follow_fails_the_test(tokenizer, turn, params, why):
    server = SGLangTestServer(tokenizer).start()
    try:
        server.script(turn)
        status, answer = post(server, "/generate", body(tokenizer, "x", **params))
        assert status == 400 and why in answer["error"]["message"]
    finally:
        with pytest.raises(SGLangTestServerError, match=why):
            server.stop()


# -- checks and their texts -------------------------------------------------------------------------


def test_the_sampling_keys_are_sglangs_own_list():
    """The stand-in's list is SGLang 0.5.23's (the recorded 400 names every one), not production's."""
    recorded = json.loads((RECORDED / "error_unknown_sampling_param.json").read_text())
    listed = recorded["response"]["error"].split("expected one of ", 1)[1]
    assert list(SAMPLING_FIELDS) == [key.strip("`") for key in listed.split(", ")]


@pytest.mark.parametrize(
    ("params", "status", "error"),
    [
        ({"structural_tag": '{"format": "x"}', "beam_width": 1, "stream_interval": 2}, 200, None),
        ({"temperature": "hot"}, 400, 'invalid type: string "hot", expected f64'),
        ({"stop_token_ids": [1, "2"]}, 400, 'invalid type: string "2", expected i64'),
        ({"watermark": {"strength": 1}}, 400, "unknown field `strength`, expected one of `enabled`, `key`, `context_window`"),
        ({"top_p": 0}, 400, {"message": "top_p must be in (0, 1], got 0."}),
        ({"regex": "a", "ebnf": "b"}, 400, {"message": "Only one of json_schema, regex, ebnf, or structural_tag can be set."}),
        ({"logit_bias": {"999999": 1.0}}, 400, {"message": "logit_bias must has keys in [0, 151668], got 999999."}),
    ],
)  # fmt: skip
def test_sampling_params_are_checked_as_sglang_does(tokenizer, params, status, error):
    with SGLangTestServer(tokenizer) as server:
        server.script("fine")
        answered = post(server, "/generate", body(tokenizer, "x", **params))
    assert answered[0] == status
    if error is not None:
        assert answered[1] == {"error": error}


@pytest.mark.parametrize(
    ("top_level", "status", "error"),
    [
        ({"an_unknown_key": 1}, 200, None),
        ({"logprob_start_len": [14]}, 400, {"message": "SGLangTestServer supports single token-in requests only"}),
        ({"logprob_start_len": "14"}, 400, 'invalid type: string "14", expected a value or an array of values for Int64OrList'),
        ({"routed_experts_start_len": None}, 400, "invalid type: null, expected i64"),
    ],
)  # fmt: skip
def test_top_level_keys_are_checked_as_sglang_does(tokenizer, top_level, status, error):
    with SGLangTestServer(tokenizer) as server:
        server.script("fine")
        answered = post(server, "/generate", {**body(tokenizer, "x"), **top_level})
    assert answered[0] == status
    if error is not None:
        assert answered[1] == {"error": error}


def test_a_rid_is_refused_while_it_is_answered_and_free_after(tokenizer):
    with SGLangTestServer(tokenizer) as server, ThreadPoolExecutor(1) as pool:
        server.script(held(), "again")
        first = pool.submit(post, server, "/generate", body(tokenizer, "same"))
        wait_until(lambda: server.running == ["same"])
        assert post(server, "/generate", body(tokenizer, "same")) == (
            400, {"error": {"message": "Duplicate request ID detected: same"}},
        )  # fmt: skip
        post(server, "/abort_request", {"rid": "same"})
        first.result()
        assert post(server, "/generate", body(tokenizer, "same"))[0] == 200


def test_the_cache_hit_stops_short_of_the_last_input_token(tokenizer):
    """SGLang matches at most ``len(input) - 1`` tokens, and no further than ``logprob_start_len``."""
    with SGLangTestServer(tokenizer) as server:
        server.script("one", "two", "three")
        first = post(server, "/generate", body(tokenizer, "a"))[1]["meta_info"]
        again = post(server, "/generate", body(tokenizer, "b"))[1]["meta_info"]
        earlier = {**body(tokenizer, "c"), "logprob_start_len": 5}
        capped = post(server, "/generate", earlier)[1]["meta_info"]
    assert (first["cached_tokens"], first["cached_tokens_details"]) == (0, None)
    assert again["cached_tokens"] == 14 and again["cached_tokens_details"] == {"device": 14, "host": 0}
    assert capped["cached_tokens"] == 5 and len(capped["input_token_logprobs"]) == 10


def test_an_input_id_outside_the_vocabulary_crashes_the_server_loudly(tokenizer):
    server = SGLangTestServer(tokenizer).start()
    try:
        server.script("never")
        assert post(server, "/generate", {"input_ids": [1, len(tokenizer)]}) == (None, "")
        assert post(server, "/generate", body(tokenizer, "after")) == (None, ""), "the whole server is gone"
    finally:
        with pytest.raises(
            SGLangTestServerError, match=f"input id {len(tokenizer)} is outside the vocabulary"
        ):
            server.stop()
