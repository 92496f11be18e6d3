"""SGLangClient against the SGLang-protocol test server: real HTTP on 127.0.0.1, no mocks."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
from array import array

import pytest

from slime_strands import (
    SGLangAbortError,
    SGLangClient,
    SGLangConnectionError,
    SGLangContextLengthError,
    SGLangHTTPError,
    SGLangProtocolError,
)
from slime_strands.provider import client as client_module
from slime_strands.provider.client import (
    SGLANG_CONTEXT_MARGIN,
    RequestHandle,
    SGLangTimeoutError,
    TokenIdsJSON,
)
from slime_strands.provider.retry import RetryPolicy
from slime_strands.settings import PluginSettings
from slime_strands.testing import Fault, SGLangTestServer, Turn

pytestmark = pytest.mark.timeout(60)

PARAMS = {"max_new_tokens": 64}


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=4096) as srv:
        yield srv


def client_for(server: SGLangTestServer, **kwargs) -> SGLangClient:
    kwargs.setdefault("retry_delay", 0.01)
    kwargs.setdefault("max_retries", 5)
    return SGLangClient(server.base_url, **kwargs)


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


async def test_generate_returns_output_ids_with_logprobs(server, tokenizer):
    server.script("Hello there.")
    client = client_for(server)
    prompt = ids(tokenizer, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    result = await client.generate(prompt, PARAMS)
    expected = [*ids(tokenizer, "Hello there."), tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert result.output_ids == expected, "the end-of-turn token is part of the output"
    assert len(result.logprobs) == len(expected) and all(lp < 0 for lp in result.logprobs)
    assert result.finish_reason == "stop"
    assert result.prompt_tokens == len(prompt)
    assert result.weight_version == "0"
    assert server.answers[result.rid] == (result.output_ids, result.logprobs)
    await client.aclose()


async def test_request_body_token_in_logprobs_and_rid(server, tokenizer):
    server.script("ok")
    client = client_for(server)
    prompt = ids(tokenizer, "some prompt tokens here")
    await client.generate(prompt, {"max_new_tokens": 8, "temperature": 0.5}, rid="my-rid")
    body = server.generate_requests[0].body
    assert body["input_ids"] == prompt and "text" not in body
    assert body["return_logprob"] is True
    assert body["logprob_start_len"] == len(prompt) - 1
    assert body["rid"] == "my-rid"
    assert body["sampling_params"] == {"max_new_tokens": 8, "temperature": 0.5}
    assert body["stream"] is False


async def test_serialised_trajectory_with_a_tail_is_sent_as_one_input(server, tokenizer):
    server.script(Fault(status=503), "ok", "again")
    client = client_for(server)
    trajectory = TokenIdsJSON(ids(tokenizer, "first part"))
    trajectory.extend(ids(tokenizer, " second part"))
    tail = ids(tokenizer, " and the new tool output")
    expected = [*ids(tokenizer, "first part"), *ids(tokenizer, " second part"), *tail]
    await client.generate(trajectory, PARAMS, input_ids_tail=tail, rid="t")
    await client.generate(TokenIdsJSON(), PARAMS, input_ids_tail=tail)
    first, retried, only_tail = (r.body for r in server.generate_requests)
    assert first["input_ids"] == retried["input_ids"] == expected
    assert first["logprob_start_len"] == retried["logprob_start_len"] == len(expected) - 1
    assert first["rid"] == "t" and not retried["rid"].startswith("t"), "a retry has an id of its own"
    assert only_tail["input_ids"] == tail and len(trajectory) == len(expected) - len(tail)
    with pytest.raises(ValueError):
        await client.generate(TokenIdsJSON(), PARAMS)


def test_token_ids_json_is_the_json_array_of_the_ids_whatever_their_container():
    class Id(int):  # an int subclass (an IntEnum's members are)
        pass

    big = list(range(140_000, 140_000 + 3 * client_module._IDS_CHUNK + 5))  # several chunks
    seq = TokenIdsJSON(big)
    seq.extend((7, 8))
    seq.extend(array("i", [9]))
    seq.extend(TokenIdsJSON([10]))
    assert json.loads(seq.to_json([Id(11), 12])) == [*big, 7, 8, 9, 10, 11, 12]
    assert json.loads(seq.to_json()) == [*big, 7, 8, 9, 10] and len(seq) == len(big) + 4
    assert b" " not in seq.to_json()  # compact: every turn sends the whole trajectory
    assert json.loads(TokenIdsJSON().to_json([1])) == [1] and TokenIdsJSON().to_json() == b"[]"
    odd = TokenIdsJSON([_NotJSON(5), _NotJSON(6)])
    assert json.loads(odd.to_json()) == [5, 6]


class _NotJSON:
    """An id type json cannot encode but whose str() is the number (numpy's integers)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __str__(self) -> str:
        return str(self.value)


async def test_rid_generated_when_not_given(server, tokenizer):
    server.script("a", "b")
    client = client_for(server)
    await client.generate(ids(tokenizer, "x"), PARAMS)
    await client.generate(ids(tokenizer, "x"), PARAMS)
    rids = [r.body["rid"] for r in server.generate_requests]
    assert all(rids) and rids[0] != rids[1]


async def test_routing_key_header(server, tokenizer):
    server.script("one", "two")
    client = client_for(server)
    await client.generate(ids(tokenizer, "x"), PARAMS, routing_key="session-42")
    await client.generate(ids(tokenizer, "x"), PARAMS)
    first, second = server.generate_requests
    assert first.headers["x-smg-routing-key"] == "session-42"
    assert "x-smg-routing-key" not in second.headers


async def test_503_burst_is_retried_then_recovers(server, tokenizer):
    server.script(Fault(status=503), Fault(status=503), Fault(status=503), "recovered")
    client = client_for(server)
    result = await client.generate(ids(tokenizer, "x"), PARAMS, rid="r")
    assert result.output_ids[:-1] == ids(tokenizer, "recovered")
    requests = server.generate_requests
    assert len(requests) == 4
    rids = [r.body["rid"] for r in requests]
    assert rids[0] == "r" and len(set(rids)) == 4, "a retry carries a fresh rid (SGLang rejects duplicates)"
    assert all(r.body["input_ids"] == requests[0].body["input_ids"] for r in requests)


@pytest.mark.parametrize("status", [408, 429, 500, 502, 504])
async def test_transient_statuses_are_retried(server, tokenizer, status):
    server.script(Fault(status=status), "ok")
    result = await client_for(server).generate(ids(tokenizer, "x"), PARAMS)
    assert result.finish_reason == "stop"
    assert len(server.generate_requests) == 2


@pytest.mark.parametrize("status", [400, 401, 404, 422])
async def test_4xx_is_never_retried(server, tokenizer, status):
    server.script(Fault(status=status, body={"error": {"message": f"nope {status}"}}), "never sent")
    with pytest.raises(SGLangHTTPError) as info:
        await client_for(server).generate(ids(tokenizer, "x"), PARAMS)
    assert not isinstance(info.value, SGLangContextLengthError)
    assert info.value.status_code == status
    assert info.value.message == f"nope {status}"
    assert len(server.generate_requests) == 1
    assert server.pending() == 1


async def test_400_context_length_is_typed(tokenizer):
    with SGLangTestServer(tokenizer, context_length=16) as server:
        server.script("never")
        with pytest.raises(SGLangContextLengthError) as info:
            await client_for(server).generate(list(range(100, 130)), PARAMS)
        assert info.value.status_code == 400
        assert "longer than the model's context length" in info.value.message
        assert len(server.generate_requests) == 1


@pytest.mark.parametrize("room", [1, 3, 6])
async def test_scheduler_input_length_error_is_typed(tokenizer, room):
    """SGLang's scheduler refuses inputs a few tokens BEFORE the window is full (input >= context - 6)."""
    with SGLangTestServer(tokenizer, context_length=100) as server:
        with pytest.raises(SGLangContextLengthError) as info:
            await client_for(server).generate(list(range(100, 200 - room)), {"max_new_tokens": room})
        assert info.value.message == (
            f"Input length ({100 - room} tokens) exceeds the maximum allowed length (94 tokens). "
            "Use a shorter input or enable --allow-auto-truncate."
        )
        assert len(server.generate_requests) == 1


async def test_the_margin_sglang_keeps(tokenizer):
    """SGLANG_CONTEXT_MARGIN is the room the scheduler keeps: an input of context - margin - 1 tokens is served
    with every token left requested; one token more is refused."""
    with SGLangTestServer(tokenizer, context_length=100) as server:
        server.script("a b c d e f g h i j k l")
        client = client_for(server)
        n = 100 - SGLANG_CONTEXT_MARGIN - 1
        result = await client.generate(
            list(range(100, 100 + n)), {"max_new_tokens": 100 - SGLANG_CONTEXT_MARGIN - n}
        )
        assert result.finish_reason == "length" and len(result.output_ids) == 1
        with pytest.raises(SGLangContextLengthError):
            await client.generate(list(range(100, 101 + n)), {"max_new_tokens": 1})


@pytest.mark.parametrize(
    "message",
    [
        "The input (120 tokens) is longer than the model's context length (100 tokens).",
        "Requested token count exceeds the model's maximum context length of 100 tokens. You requested ...",
        "Input length (99 tokens) exceeds the maximum allowed length (94 tokens). Use a shorter input or ...",
        "Request prompt exceeds the KV memory budget: input_len=99.",
        "Multimodal prompt is too long after expanding multimodal tokens. After expanding ...",
    ],
)
async def test_every_sglang_context_error_text_is_typed(server, tokenizer, message):
    server.script(Fault(status=400, body={"error": {"message": message}}))
    with pytest.raises(SGLangContextLengthError):
        await client_for(server).generate(ids(tokenizer, "x"), PARAMS)


async def test_server_aborts_are_retried_then_raise(server, tokenizer):
    server.script(Turn("partial one", finish="abort", abort_message="worker restarted"), "recovered")
    client = client_for(server)
    result = await client.generate(ids(tokenizer, "x"), PARAMS, rid="r", abort_retries=2)
    assert result.finish_reason == "stop" and result.output_ids[:-1] == ids(tokenizer, "recovered")
    rids = [r.body["rid"] for r in server.generate_requests]
    assert rids[0] == "r" and len(set(rids)) == 2
    server.script(*[Turn("cut", finish="abort", abort_message="worker restarted")] * 3)
    with pytest.raises(
        SGLangAbortError, match="aborted the request 3 times without being asked to: worker restarted"
    ):
        await client.generate(ids(tokenizer, "x"), PARAMS, abort_retries=2)
    assert len(server.generate_requests) == 5


async def test_expected_aborts_are_returned(server, tokenizer):
    server.script(Turn("cut short", finish="abort"))
    result = await client_for(server).generate(
        ids(tokenizer, "x"), PARAMS, abort_retries=3, abort_expected=lambda: True
    )
    assert result.finish_reason == "abort" and len(server.generate_requests) == 1


async def test_routed_experts_start_len_is_sent_and_reported(tokenizer):
    with SGLangTestServer(tokenizer, routed_experts=(2, 2)) as server:
        server.script("one", "two")
        client = client_for(server)
        prompt = ids(tokenizer, "a prompt of some tokens")
        first = await client.generate(prompt, PARAMS, return_routed_experts=True)
        assert "routed_experts_start_len" not in server.generate_requests[0].body
        assert first.routed_experts_start_len == 0
        second_input = prompt + first.output_ids + ids(tokenizer, " more")
        held = len(prompt) + len(first.output_ids) - 1
        second = await client.generate(
            second_input, PARAMS, return_routed_experts=True, routed_experts_start_len=held
        )
        assert server.generate_requests[1].body["routed_experts_start_len"] == held
        assert second.routed_experts_start_len == held == second.meta_info["routed_experts_start_len"]
        served = server.meta_infos[second.rid]
        assert "routed_experts_start_len" not in served, "SGLang 0.5.23 does not echo it"
        assert second.routed_experts == served["routed_experts"]
        assert "output_token_logprobs" not in second.meta_info and second.meta_info["finish_reason"]


async def test_400_prompt_plus_max_new_tokens_over_context_is_typed(tokenizer):
    with SGLangTestServer(tokenizer, context_length=100) as server:
        client = client_for(server)
        with pytest.raises(SGLangContextLengthError, match="exceeds the model's maximum context length"):
            await client.generate(list(range(100, 150)), {"max_new_tokens": 60})


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"error": "unknown field `foo`, expected one of `max_new_tokens`"},
            "unknown field `foo`, expected one of `max_new_tokens`",
        ),
        ({"error": {"message": "bad temperature"}}, "bad temperature"),
        ({"object": "error", "message": "Duplicate request ID r", "code": 400}, "Duplicate request ID r"),
        ({"detail": "Not allowed"}, "Not allowed"),
    ],
)
async def test_other_400_carries_the_server_message(server, tokenizer, body, message):
    server.script(Fault(status=400, body=body))
    with pytest.raises(SGLangHTTPError) as info:
        await client_for(server).generate(ids(tokenizer, "x"), PARAMS)
    assert type(info.value) is SGLangHTTPError
    assert info.value.message == message
    assert message in str(info.value)


async def test_unknown_sampling_param_is_a_400_from_the_server(server, tokenizer):
    with pytest.raises(
        SGLangHTTPError, match="unknown field `max_tokens`, expected one of `max_new_tokens`, `stop`"
    ):
        await client_for(server).generate(ids(tokenizer, "x"), {"max_new_tokens": 4, "max_tokens": 4})
    assert len(server.generate_requests) == 1


async def test_dropped_connection_is_retried(server, tokenizer):
    server.script(Fault(drop_connection=True), Fault(drop_connection=True), "fine")
    result = await client_for(server).generate(ids(tokenizer, "x"), PARAMS)
    assert result.output_ids[:-1] == ids(tokenizer, "fine")
    assert len(server.generate_requests) == 3


async def test_exhausted_retries_raise_connection_error(server, tokenizer):
    server.script(*[Fault(status=503)] * 3, "too late")
    with pytest.raises(SGLangConnectionError, match="after 3 attempt"):
        await client_for(server, max_retries=2).generate(ids(tokenizer, "x"), PARAMS)
    assert len(server.generate_requests) == 3
    assert server.pending() == 1


async def test_exhausted_retries_on_dropped_connections(server, tokenizer):
    server.script(*[Fault(drop_connection=True)] * 2)
    with pytest.raises(SGLangConnectionError):
        await client_for(server, max_retries=1).generate(ids(tokenizer, "x"), PARAMS)


async def test_unreachable_server_is_a_connection_error(tokenizer):
    server = SGLangTestServer(tokenizer).start()
    url = server.base_url
    server.stop()
    client = SGLangClient(url, retry_delay=0.01, max_retries=1)
    with pytest.raises(SGLangConnectionError):
        await client.generate([1, 2, 3], PARAMS)
    assert await client.health() is False


async def test_proxies_in_the_environment_are_ignored(server, tokenizer, monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, "http://10.255.255.1:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    server.script("direct")
    client = client_for(server, max_retries=0, timeout=5.0)
    result = await client.generate(ids(tokenizer, "x"), PARAMS)
    assert result.output_ids[:-1] == ids(tokenizer, "direct")
    assert await client.health() is True


async def test_malformed_answer_is_a_protocol_error(server, tokenizer):
    server.script(Fault(status=200, body={"text": "no meta"}))
    with pytest.raises(SGLangProtocolError):
        await client_for(server).generate(ids(tokenizer, "x"), PARAMS)


async def test_length_finish(server, tokenizer):
    server.script(Turn("one two three four five six seven eight"))
    result = await client_for(server).generate(ids(tokenizer, "x"), {"max_new_tokens": 3})
    assert result.finish_reason == "length" and len(result.output_ids) == 3
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") not in result.output_ids


def test_shared_client_from_two_event_loops_in_two_threads(server, tokenizer):
    server.script(*[f"answer {i}" for i in range(6)])
    client = client_for(server)
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        async def run() -> list:
            out = [await client.generate(ids(tokenizer, f"thread {n}"), PARAMS) for _ in range(3)]
            await client.aclose()
            return out

        try:
            results[n] = asyncio.run(run())
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert sorted(len(v) for v in results.values()) == [3, 3]
    assert all(r.finish_reason == "stop" for v in results.values() for r in v)
    assert len(server.generate_requests) == 6


def test_constructor_validation():
    with pytest.raises(ValueError):
        SGLangClient("http://x", max_connections=0)
    with pytest.raises(ValueError):
        SGLangClient("http://x", max_retries=-1)
    with pytest.raises(ValueError):
        SGLangClient("http://x", retry_delay=-1)
    assert SGLangClient("http://x:1/").base_url == "http://x:1"
    with pytest.raises(ValueError, match="not both"):
        SGLangClient("http://x", max_retries=2, retry=RetryPolicy())


def test_one_retry_policy_says_how_requests_are_tried_again():
    policy = RetryPolicy(max_retries=3, delay_s=1.0, abort_resends=2)
    client = SGLangClient("http://x", retry=policy)
    assert client.retry is policy and (client.max_retries, client.retry_delay) == (3, 1.0)
    assert SGLangClient("http://x", max_retries=4, retry_delay=0.5).retry == RetryPolicy(4, 0.5)
    waits = [policy.backoff(n) for n in range(6) for _ in range(50)]
    assert all(0.5 <= w <= 8.0 for w in waits) and len(set(waits)) > 1, (
        "jittered, between delay/2 and 8 delay"
    )
    assert (
        max(policy.backoff(0) for _ in range(50)) <= 1.0 and min(policy.backoff(5) for _ in range(50)) >= 0.5
    )
    assert policy.retries_status(503) and policy.retries_status(429) and not policy.retries_status(400)
    settings = PluginSettings(max_retries=7, retry_delay_s=0.25, server_abort_retries=1)
    assert settings.retry_policy == RetryPolicy(max_retries=7, delay_s=0.25, abort_resends=1)
    with pytest.raises(ValueError):
        RetryPolicy(abort_resends=-1)


async def test_the_attempts_of_a_request_wait_the_backoff_between_them():
    policy = RetryPolicy(max_retries=2, delay_s=0.01)
    assert [n async for n in policy.attempts()] == [0, 1, 2]
    assert [n async for n in policy.attempts(retries=0)] == [0]


async def test_the_policys_abort_resends_are_the_default_of_generate(server, tokenizer):
    server.script(Turn("partial one", finish="abort", abort_message="worker restarted"), "recovered")
    client = client_for(
        server, max_retries=None, retry_delay=None, retry=RetryPolicy(delay_s=0.01, abort_resends=1)
    )
    result = await client.generate(ids(tokenizer, "x"), PARAMS)
    assert result.finish_reason == "stop" and len(server.generate_requests) == 2


async def test_empty_input_ids_rejected_locally(server):
    with pytest.raises(ValueError):
        await client_for(server).generate([], PARAMS)
    assert server.generate_requests == []


async def test_health(server):
    assert await client_for(server).health() is True
    assert [r.path for r in server.requests] == ["/health"]


async def test_abort_one_and_all(server, tokenizer):
    server.script(Turn("a long answer that will be cut", delay_s=600))  # only the abort answers it
    client = client_for(server)
    task = asyncio.create_task(client.generate(ids(tokenizer, "x"), PARAMS, rid="victim"))
    while "victim" not in server.in_flight:
        await asyncio.sleep(0.01)
    await client.abort("victim")
    result = await task
    assert result.finish_reason == "abort"
    assert server.aborted_rids == ["victim"]
    assert server.answers.get("victim", ([], []))[0] == result.output_ids
    await client.abort()
    abort_bodies = [r.body for r in server.requests if r.path == "/abort_request"]
    assert abort_bodies == [{"rid": "victim"}, {"abort_all": True}]


async def test_context_length_comes_from_v1_models_first(server):
    client = client_for(server)
    info = await client.model_info()
    assert info["model_path"] == "Qwen/Qwen3-8B" and "context_length" not in info
    assert (await client.server_info())["context_length"] is None  # stock SGLang without --context-length
    assert await client.context_length() == 4096
    assert await client.context_length() == 4096
    asked = [r.path for r in server.requests if r.path in ("/v1/models", "/model_info", "/server_info")]
    assert asked == ["/model_info", "/server_info", "/v1/models"], (
        "/v1/models answers; asked once, then cached"
    )


async def test_context_length_from_server_info_when_v1_models_is_missing(tokenizer):
    """A router or an older server without /v1/models: /server_info reports the window when it was started
    with --context-length."""
    with SGLangTestServer(tokenizer, context_length=2048, context_length_flag=True) as server:
        server.routes_missing = {"/v1/models"}
        client = client_for(server)
        assert await client.context_length() == 2048
        assert [r.path for r in server.requests] == ["/v1/models", "/server_info"]


async def test_context_length_of_an_unreachable_server_is_a_connection_error(tokenizer):
    """Asked as often as a request is retried; then the turn cannot be sent either."""
    server = SGLangTestServer(tokenizer).start()
    url = server.base_url
    server.stop()
    client = SGLangClient(url, retry_delay=0.01, max_retries=2)
    with pytest.raises(SGLangConnectionError, match=r"cannot learn the context window .* failed 3 time"):
        await client.context_length()


# -- where the real SGLang 0.5.23 is less kind (issues 24.1 and 28.1): its scheduler aborts every request whose
# id STARTS with the aborted one (and aborts a disconnected client's request); a server still loading answers
# 503 on every route, or reports no window at all. The 400 texts are SGLang 0.5.23's own (recorded answers).

PROMPT = [9707, 11, 1879, 0]  # "Hello, world!"
# SGLang 0.5.23's context refusals, as its server answered them (sglang-0.5.23-answers/error_*.json)
INPUT_TOO_LONG = "The input (1100 tokens) is longer than the model's context length (1024 tokens)."
TOTAL_TOO_LONG = (
    "Requested token count exceeds the model's maximum context length of 1024 tokens. You requested a total "
    "of 1100 tokens: 1000 tokens from the input messages and 100 tokens for the completion. Please reduce the "
    "number of tokens in the input messages or the completion to fit within the limit."
)
SCHEDULER_BOUND = (
    "Input length (1020 tokens) exceeds the maximum allowed length (1018 tokens). Use a shorter input or "
    "enable --allow-auto-truncate."
)


def prefix_pairs(rids: list[str]) -> list[tuple[str, str]]:
    """Pairs of ids one of which SGLang's prefix-matching abort of the other would reach."""
    return [(a, b) for a, b in itertools.permutations(rids, 2) if b.startswith(a)]


# -- request ids ------------------------------------------------------------------------------------------


async def test_no_request_id_is_a_prefix_of_another(server):
    """Retries after transient failures and resends after server aborts: every attempt an id of its own."""
    server.script(
        Fault(status=503),
        Fault(drop_connection=True),
        Turn("cut", finish="abort", abort_message="worker restarted"),
        Fault(status=502),
        Turn("cut again", finish="abort", abort_message="worker restarted"),
        "fine",
    )
    client = client_for(server)
    result = await client.generate(PROMPT, PARAMS, abort_retries=2)
    assert result.finish_reason == "stop"
    rids = [r.body["rid"] for r in server.generate_requests]
    assert len(rids) == 6 and len(set(rids)) == 6
    assert prefix_pairs(rids) == [], "SGLang's abort of one attempt would kill another"
    assert result.rid == rids[-1], "the answer is the last attempt's"
    server.script("again")
    await client.generate(PROMPT, PARAMS, abort_retries=2)
    rids.append(server.generate_requests[-1].body["rid"])
    assert prefix_pairs(rids) == [], "nor of another request's"
    await client.aclose()


async def test_a_timeout_is_reported_as_a_timeout_and_each_attempt_aborted_by_its_id(server):
    """Each attempt outlasts the client's timeout: the client gives it up, aborts it by its exact id (a router
    may not pass the disconnect on), sends a fresh one, and at last says it timed out."""
    server.script(*[Turn("slow", delay_s=600)] * 2)  # only an abort answers them
    client = client_for(server, timeout=1.0, max_retries=1)
    with pytest.raises(
        SGLangTimeoutError, match=r"timed out: no answer within the 1\.0 s request timeout in 2"
    ):
        await client.generate(PROMPT, PARAMS, abort_retries=3)
    rids = [r.body["rid"] for r in server.generate_requests]
    assert len(rids) == 2 and prefix_pairs(rids) == []
    aborts = [r.body for r in server.requests if r.path == "/abort_request"]
    assert aborts == [{"rid": rid} for rid in rids], "each given-up attempt aborted, by its own id, in order"
    await client.aclose()


async def test_abort_by_handle_reaches_each_attempt_and_nothing_else(server):
    """A caller's handle holds the ids of its attempts in flight: aborting it reaches the one running (the
    retry after a 503), not another caller's request, and no attempt is sent after it."""
    server.script(Fault(status=503), Turn("mine", delay_s=600), key="a")
    server.script(Turn("theirs", delay_s=600), key="b")
    client = client_for(server)
    handle = RequestHandle()
    mine = asyncio.create_task(
        client.generate(PROMPT, PARAMS, routing_key="a", handle=handle, abort_retries=3)
    )
    theirs = asyncio.create_task(client.generate(PROMPT, PARAMS, routing_key="b"))
    while len(server.in_flight) < 2 or not handle.rids:
        await asyncio.sleep(0.01)
    (running,) = handle.rids
    first = server.generate_requests[0].body["rid"]
    assert running != first and running in server.in_flight, "the retry is the attempt in flight"
    await client.abort(handle)
    result = await mine
    assert result.finish_reason == "abort", "an abort the caller asked for is not sent again"
    assert server.aborted_rids == [running]
    assert not theirs.done() and len(server.in_flight) == 1
    again = await client.generate(PROMPT, PARAMS, handle=handle)
    assert again.finish_reason == "abort" and again.output_ids == []
    assert len(server.generate_requests) == 3, "nothing is sent once the handle is aborted"
    await client.abort()
    assert (await theirs).finish_reason == "abort"
    await client.aclose()


# -- the context window -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "window"),
    [
        (INPUT_TOO_LONG, 1024),
        (TOTAL_TOO_LONG, 1024),
        (SCHEDULER_BOUND, 1018 + 6),  # the scheduler's bound is the window less SGLang's margin
        ("Request prompt exceeds the KV memory budget: input_len=99.", None),
    ],
)
async def test_a_context_refusal_teaches_the_window(tokenizer, message, window):
    with SGLangTestServer(tokenizer, report_window=False) as server:
        server.script(Fault(status=400, body={"error": {"message": message}}))
        client = client_for(server)
        assert await client.context_length() is None, "the server answers, but says no window"
        with pytest.raises(SGLangContextLengthError) as info:
            await client.generate(PROMPT, PARAMS)
        assert info.value.window == window
        assert await client.context_length() == window
        await client.aclose()


async def test_the_smallest_window_named_wins(tokenizer, caplog):
    """/v1/models names the context; the scheduler then refuses at a smaller KV pool's bound, which nothing the
    server served contradicts: the window changes, said once at WARNING."""
    caplog.set_level(logging.INFO, logger="slime_strands.provider.client")
    with SGLangTestServer(tokenizer, context_length=4096) as server:
        server.script(Fault(status=400, body={"error": {"message": SCHEDULER_BOUND}}))
        client, url = client_for(server), server.base_url
        assert await client.context_length() == 4096
        with pytest.raises(SGLangContextLengthError):
            await client.generate(PROMPT, PARAMS)
        assert await client.context_length() == 1024
        await client.aclose()
    found = window_lines(caplog)
    assert found == [
        (
            "INFO",
            f"SGLang at {url}: context window unknown -> 4096 tokens: the server reports it",
        ),
        (
            "WARNING",
            f"SGLang at {url}: context window 4096 tokens -> 1024 tokens: a refusal of 4 input tokens "
            "named it; nothing the server served contradicts it",
        ),
    ]


def window_lines(caplog) -> list[tuple[str, str]]:
    return [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name == "slime_strands.provider.client" and "context window" in r.getMessage()
    ]


LONG = PROMPT * 300  # 1,200 tokens: more than the limit SCHEDULER_BOUND names


async def test_a_limit_below_an_input_the_server_served_is_an_anomaly(tokenizer, caplog):
    """The server served 1,200 tokens of input; a refusal naming 1,018 contradicts it: the window stays, one
    WARNING names the server, the limit and the input, and the same limit named again is counted at DEBUG."""
    caplog.set_level(logging.DEBUG, logger="slime_strands.provider.client")
    with SGLangTestServer(tokenizer, context_length=4096) as server:
        server.script("fine", *[Fault(status=400, body={"error": {"message": SCHEDULER_BOUND}})] * 2)
        client, url = client_for(server), server.base_url
        assert await client.context_length() == 4096
        await client.generate(LONG, PARAMS)
        for _ in range(2):
            with pytest.raises(SGLangContextLengthError):
                await client.generate(PROMPT, PARAMS)
        assert await client.context_length() == 4096 and client.window.tokens == 4096
        await client.aclose()
    anomalies = [(r.levelname, r.getMessage()) for r in caplog.records if "an anomaly" in r.getMessage()]
    assert [level for level, _ in anomalies] == ["WARNING", "DEBUG"]
    line = anomalies[0][1]
    assert line.startswith(
        f"SGLang at {url} named a context window of 1024 tokens, which a request of 1200 input tokens "
        "(2 generated) it served contradicts"
    )
    assert "the window stays 4096 tokens" in line and line.endswith(SCHEDULER_BOUND)
    assert anomalies[1][1].endswith(f"(this limit named 2 times). The server said: {SCHEDULER_BOUND}")


async def test_a_learned_limit_a_later_answer_contradicts_is_undone(tokenizer, caplog):
    """Nothing was served when the refusal came, so its limit was taken; a request sent before (sized for the
    window then) is served with more input than that limit allows: the window goes back, said at WARNING."""
    caplog.set_level(logging.WARNING, logger="slime_strands.provider.client")
    with SGLangTestServer(tokenizer, context_length=4096) as server:
        server.script(Fault(status=400, body={"error": {"message": SCHEDULER_BOUND}}), "fine")
        client, url = client_for(server), server.base_url
        assert await client.context_length() == 4096
        with pytest.raises(SGLangContextLengthError):
            await client.generate(PROMPT, PARAMS)
        assert client.window.tokens == 1024
        await client.generate(LONG, PARAMS)
        assert await client.context_length() == 4096
        await client.aclose()
    (_, learned), (_, undone) = window_lines(caplog)
    assert "4096 tokens -> 1024 tokens" in learned
    assert undone == (
        f"SGLang at {url}: context window 1024 tokens -> 4096 tokens: a request of 1200 input tokens "
        "(2 generated) it served contradicts the limit of 1024 tokens a refusal named: an anomaly"
    )


async def test_window_discovery_waits_out_a_server_answering_503_everywhere(tokenizer):
    """The first questions fall in the server's 503 window: they are asked again with the backoff of a
    request, so the window is known before any turn is sent (never None for want of asking)."""
    with SGLangTestServer(tokenizer, context_length=2048, unavailable_s=1.5) as server:
        client = client_for(server, retry_delay=0.05, max_retries=60)
        assert await client.context_length() == 2048
        asked = [r.path for r in server.requests]
        assert asked[-1] == "/v1/models" and set(asked) <= {"/v1/models", "/server_info", "/model_info"}
        await client.aclose()


async def test_concurrent_turns_share_one_discovery(server):
    client = client_for(server)
    windows = await asyncio.gather(*(client.context_length() for _ in range(16)))
    assert windows == [4096] * 16
    assert [r.path for r in server.requests] == ["/v1/models"], "asked once for 16 waiting turns"
    await client.aclose()
