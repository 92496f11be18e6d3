"""The scenario set for EVERY model family: a real Strands Agent, the family's real tokenizer and chat template,
real HTTP to SGLangTestServer, ``tool_parser`` left on ``auto``.

Plain answer, one call, parallel calls, every malformed-call kind, an unknown tool, a call drafted inside
reasoning, a ``length`` finish, a follow-up user turn and a full context, each with the trajectory invariants
checked against the server's records. Where the template renders the conversation back unchanged the decoded
trajectory must BE the template's full rendering (the stop token that ended a turn counted once).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from conftest import qwen3_tokenizer_path
from family_kit import (
    FAMILIES,
    SUPPORTED,
    Call,
    Family,
    Turn,
    end_tokens,
    family_tokenizer,
    server_turns,
    stop_tokens,
)
from helpers import make_agent, make_model, openai_tools, result_texts
from strands import tool
from strands.types.exceptions import ContextWindowOverflowException, MaxTokensReachedException

from slime_strands.template.render import ChatRenderer
from slime_strands.testing import SGLangTestServer
from slime_strands.testing import Turn as ServerTurn
from slime_strands.testing.invariants import assert_trajectory_invariants

pytestmark = pytest.mark.timeout(60)

CALLS: list[tuple[str, dict[str, Any]]] = []


@pytest.fixture(autouse=True)
def _reset():
    CALLS.clear()


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    CALLS.append(("add", {"a": a, "b": b}))
    return a + b


@tool
def mul(a: int, b: int) -> int:
    """Multiply two integers."""
    CALLS.append(("mul", {"a": a, "b": b}))
    return a * b


@tool
def huge_output(n: int) -> str:
    """Return n lines of output."""
    return "\n".join(f"line {i}: " + "x" * 40 for i in range(n))


@pytest.fixture(params=SUPPORTED, scope="module")
def family(request) -> Family:
    return FAMILIES[request.param]


@pytest.fixture(scope="module")
def tok(family):
    return family_tokenizer(family.name)


def _server(family: Family, tok: Any, *turns: Turn, **kwargs: Any) -> SGLangTestServer:
    server = SGLangTestServer(tok, end_of_turn=stop_tokens(family), **kwargs)  # started by `with`
    server.script(*server_turns(family, tok, turns))
    return server


def _check(model, server) -> None:
    assert_trajectory_invariants(model.token_manager, server)


def _canonical(family: Family, tok: Any, episodes, results, tools, rewritten=()) -> str:
    """The template's full rendering of the scripted conversation (what the trajectory must decode to)."""
    messages: list[dict[str, Any]] = []
    pending, index = list(results), 0
    for user, turns in episodes:
        messages.append({"role": "user", "content": user})
        for turn in turns:
            messages.append(family.canonical_message(turn, index))
            if turn.calls:
                outputs = pending.pop(0)
                messages += [
                    {"role": "tool", "content": out, "tool_call_id": f"functions.{c.name}:{index + i}"}
                    for i, (c, out) in enumerate(zip(turn.valid_calls, outputs, strict=True))
                ]
            index += len(turn.valid_calls)
    return tok.apply_chat_template(
        messages, tools=openai_tools(*tools), tokenize=False, add_generation_prompt=False
    )


def _assert_canonical(family, tok, model, episodes, results, tools, rewritten=(), last_stop=None) -> None:
    decoded = tok.decode(model.token_manager.token_ids)
    expected = _canonical(family, tok, episodes, results, tools).rstrip("\n")
    last_stop = last_stop or family.stop(episodes[-1][1][-1])
    assert decoded.endswith(last_stop), "the trajectory ends on the model's stop token"
    for written, in_template in family.closed_in_template_by.items():
        decoded, last_stop = decoded.replace(written, in_template), last_stop.replace(written, in_template)
    if not expected.endswith(
        last_stop
    ):  # the next role tag ends a GLM turn: the model wrote it, no template did
        expected += last_stop
    pos = 0
    for piece in rewritten:
        at = decoded.find(piece, pos)
        assert at >= 0, f"expected the template rewrite to drop {piece!r}"
        decoded, pos = decoded[:at] + decoded[at + len(piece) :], at
    assert decoded == expected, _diff(decoded, expected)


def _diff(got: str, expected: str) -> str:
    n = next(
        (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
        min(len(got), len(expected)),
    )
    return f"at char {n}:\ntrajectory: {got[max(0, n - 150) : n + 150]!r}\ncanonical:  {expected[max(0, n - 150) : n + 150]!r}"


def test_auto_selects_the_family_parser(family, tok):
    with _server(family, tok) as server:
        model = make_model(tok, server)
        assert model.tool_parser.name == family.name


async def test_plain_answer(family, tok):
    answer = family.answer("The answer is 5.")
    with _server(family, tok, answer) as server:
        model = make_model(tok, server)
        result = await make_agent(model, [add]).invoke_async("What is 2+3?")
        assert result.stop_reason == "end_turn" and "The answer is 5." in str(result)
        _check(model, server)
        assert [s.kind for s in model.token_manager.spans] == ["prompt", "generated"]
        sent = server.generate_requests[0].body["sampling_params"]["stop_token_ids"]
        assert set(sent) == {tok.convert_tokens_to_ids(t) for t in end_tokens(family, tok)}
        _assert_canonical(family, tok, model, [("What is 2+3?", [answer])], [], [add])


async def test_one_call(family, tok):
    turns = [family.call_turn(Call("add", {"a": 2, "b": 3})), family.answer("The answer is 5.")]
    with _server(family, tok, *turns) as server:
        model = make_model(tok, server)
        result = await make_agent(model, [add]).invoke_async("What is 2+3?")
        assert result.stop_reason == "end_turn"
        assert CALLS == [("add", {"a": 2, "b": 3})] and not model.parse_errors
        _check(model, server)
        tm = model.token_manager
        assert [s.kind for s in tm.spans] == ["prompt", "generated", "observation", "generated"]
        generated, observation = tm.spans[1], tm.spans[2]
        stop_id = tok.convert_tokens_to_ids(family.call_stop)
        assert generated.token_ids[-1] == stop_id, "the model's own stop token closes its turn"
        ends = {tok.convert_tokens_to_ids(t) for t in stop_tokens(family)}
        assert observation.token_ids[0] not in ends, "the turn is closed once"
        assert tok.decode(list(observation.token_ids)).count("5") >= 1
        rewritten = family.rewritten_after_answer
        _assert_canonical(family, tok, model, [("What is 2+3?", turns)], [["5"]], [add], rewritten)


async def test_parallel_calls(family, tok):
    turns = [
        family.call_turn(Call("add", {"a": 2, "b": 3}), Call("mul", {"a": 4, "b": 5}), content="Both."),
        family.answer("5 and 20."),
    ]
    with _server(family, tok, *turns) as server:
        model = make_model(tok, server)
        agent = make_agent(model, [add, mul])
        await agent.invoke_async("Compute 2+3 and 4*5.")
        assert sorted(CALLS) == [("add", {"a": 2, "b": 3}), ("mul", {"a": 4, "b": 5})]
        assert result_texts(agent) == [["5", "20"]]
        _check(model, server)
        observation = tok.decode(list(model.token_manager.spans[2].token_ids))
        assert observation.index("5") < observation.index("20"), "results in call order"
        if family.parallel_in_template:
            episodes = [("Compute 2+3 and 4*5.", turns)]
            rewritten = family.rewritten_after_answer
            _assert_canonical(family, tok, model, episodes, [["5", "20"]], [add, mul], rewritten)


@tool
def configure(options: dict, tags: list[str], verbose: bool, note: str | None = None) -> str:
    """Configure a run."""
    CALLS.append(("configure", {"options": options, "tags": tags, "verbose": verbose, "note": note}))
    return "configured"


async def test_object_array_boolean_and_null_arguments(family, tok):
    """Every non-scalar argument as the family's template writes it (Qwen3-Coder's: Python's str(), via
    Jinja's string filter) runs the tool with the values the model meant."""
    arguments = {"options": {"depth": 2, "names": ["a", "b's"]}, "tags": ["x"], "verbose": True, "note": None}
    turns = [family.call_turn(Call("configure", arguments)), family.answer("Done.")]
    with _server(family, tok, *turns) as server:
        model = make_model(tok, server)
        agent = make_agent(model, [configure])
        await agent.invoke_async("Configure it.")
        ran = [("configure", arguments)]
        assert ran == CALLS and not model.parse_errors
        assert result_texts(agent) == [["configured"]]
        _check(model, server)
        rewritten = family.rewritten_after_answer
        _assert_canonical(
            family, tok, model, [("Configure it.", turns)], [["configured"]], [configure], rewritten
        )


MARKUP: list[str] = []


@tool
def echo_markup() -> str:
    """Print text that looks like special tokens."""
    return "".join(MARKUP)


async def test_special_looking_tool_output_stays_plain_text(family, tok):
    """A tool that prints the family's end tokens and role tags gets them shown as TEXT: encoded as ordinary
    tokens, they cannot end the observation, forge a turn or open reasoning (a peer encodes them as the real
    special tokens)."""
    MARKUP[:] = [*end_tokens(family, tok), "<|im_start|>assistant", "<think>", "<|user|>", "<|assistant|>"]
    turns = [family.call_turn(Call("echo_markup", {})), family.answer("Done.")]
    with _server(family, tok, *turns) as server:
        model = make_model(tok, server)
        agent = make_agent(model, [echo_markup])
        assert str(await agent.invoke_async("Echo.")).strip() == "Done."
        _check(model, server)
        observation = list(model.token_manager.spans[2].token_ids)
        assert "".join(MARKUP) in tok.decode(observation)
        renderer = ChatRenderer(tok)
        after = model.token_manager.spans[1].token_ids[-1]
        _, plain = renderer.encode_continuation([{"role": "tool", "content": "plain"}], after=after)
        # Special tokens only: added tokens that are not special (Qwen3's <think>, <tool_call>) are ordinary
        # vocabulary that any encoding of the text gives.
        specials = {i for i, t in tok.added_tokens_decoder.items() if t.special}
        assert sorted(t for t in observation if t in specials) == sorted(t for t in plain if t in specials)


# (family, an end token of its model that is not one of its template's stop tokens). Written out so that
# collecting the tests loads no tokenizer; the test below checks it against the tokenizers.
END_OF_SEQUENCE_CASES = [
    ("glm45", "<|endoftext|>"),
    ("glm47", "<|endoftext|>"),
    ("hermes", "<|endoftext|>"),
    ("kimi_k2", "<|eom_id|>"),
    ("llama3", "<|end_of_text|>"),
    ("mistral", "<|eom_id|>"),
    ("qwen3_coder", "<|endoftext|>"),
]


def test_the_end_of_sequence_cases_are_every_end_token_beyond_the_stop_tokens():
    computed = [
        (name, token)
        for name in SUPPORTED
        for token in end_tokens(FAMILIES[name], family_tokenizer(name))
        if token not in stop_tokens(FAMILIES[name])
    ]
    assert computed == END_OF_SEQUENCE_CASES


async def test_a_stop_token_only_the_server_knows_is_stripped_too():
    """SGLang also stops on ids of a generation_config.json that does not sit beside the tokenizer (one loaded
    by hub id): the token the server reports it matched is stripped from the answer like a known one."""
    family = FAMILIES["hermes"]
    tok = copy.deepcopy(family_tokenizer("hermes"))
    tok.name_or_path = qwen3_tokenizer_path()  # the tokenizer files alone: no generation_config.json
    end_of_text = tok.convert_tokens_to_ids("<|endoftext|>")
    # the server's generation_config.json declares <|endoftext|> an end id, as Qwen3's does
    eos = (*stop_tokens(family), "<|endoftext|>")
    with SGLangTestServer(tok, end_of_turn=stop_tokens(family), eos_tokens=eos) as server:
        server.script(ServerTurn("It is 5.", stop_token_id=end_of_text))
        model = make_model(tok, server)
        result = await make_agent(model, [add]).invoke_async("What is 2+3?")
        assert end_of_text not in server.generate_requests[0].body["sampling_params"]["stop_token_ids"]
        assert str(result).strip() == "It is 5."
        _check(model, server)


@pytest.mark.parametrize(("name", "token"), END_OF_SEQUENCE_CASES)
async def test_turn_that_ends_on_an_end_of_sequence_token(name, token):
    """The model's end-of-sequence tokens (tokenizer eos, generation_config.json, <|eom_id|>) end a turn like the
    template's own: the text the agent returns never holds one, and a follow-up is rendered after it."""
    family, tok = FAMILIES[name], family_tokenizer(name)
    end_id = tok.convert_tokens_to_ids(token)
    first = [family.call_turn(Call("add", {"a": 2, "b": 3})), Turn(content="It is 5.")]
    second = [family.answer("Now 6.")]
    with _server(family, tok) as server:
        script = server_turns(family, tok, [*first, *second])
        script[1] = ServerTurn(script[1].text, stop_token_id=end_id)
        server.script(*script)
        model = make_model(tok, server)
        agent = make_agent(model, [add])
        result = await agent.invoke_async("What is 2+3?")
        assert str(result).strip() == "It is 5.", f"{token} stays out of the answer"
        assert model.token_manager.spans[3].token_ids[-1] == end_id
        await agent.invoke_async("Add one more.")
        _check(model, server)
        follow_up = tok.decode(list(model.token_manager.spans[4].token_ids))
        assert follow_up.startswith(family.answer_stop), "the template's own end of the turn follows it"
        # The trajectory is the template's rendering with the end token where the model wrote it.
        rewritten = (*family.rewritten_after_follow_up, token)
        episodes = [("What is 2+3?", first), ("Add one more.", second)]
        _assert_canonical(family, tok, model, episodes, [["5"]], [add], rewritten)


@pytest.mark.parametrize(
    ("name", "case"),
    [(name, case) for name in SUPPORTED for case in sorted(FAMILIES[name].bad_calls)],
)
async def test_malformed_call_reaches_the_model_as_an_error(name, case):
    family, tok = FAMILIES[name], family_tokenizer(name)
    bad = family.bad_calls[case]
    turns = [Turn(calls=[bad]), family.answer("Sorry.")]
    with _server(family, tok, *turns) as server:
        model = make_model(tok, server)
        agent = make_agent(model, [add])
        result = await agent.invoke_async("What is 2+3?")
        assert result.stop_reason == "end_turn"
        assert CALLS == [], "a malformed call is never executed"
        assert dict(model.parse_errors) == {bad.kind: 1}
        results = result_texts(agent)
        assert len(results) == 1 and results[0][0].startswith(f"Error: invalid tool call ({bad.kind}): ")
        if case == "unknown_tool":
            assert "unknown tool 'subtract'" in results[0][0] and "available tools: add" in results[0][0]
        _check(model, server)
        shown = tok.decode(list(model.token_manager.spans[2].token_ids))
        assert f"Error: invalid tool call ({bad.kind})" in shown, "the model reads the reason"


async def test_call_inside_reasoning_is_not_executed(family, tok):
    turn = Turn(
        content="The answer is 5.",
        reasoning="Maybe I could call",
        reasoning_calls=[Call("add", {"a": 2, "b": 3})],
    )
    with _server(family, tok, turn) as server:
        model = make_model(tok, server)
        result = await make_agent(model, [add]).invoke_async("What is 2+3?")
        assert result.stop_reason == "end_turn" and str(result).strip() == "The answer is 5."
        assert CALLS == [] and dict(model.parse_errors) == {"inside_reasoning": 1}
        _check(model, server)
        assert len(server.generate_requests) == 1


async def test_length_finish(family, tok):
    call = family.call_turn(Call("add", {"a": 2, "b": 3}))
    limit = max(40, len(tok.encode(family.text(call), add_special_tokens=False)) + 1)  # the call turn fits
    long = Turn(content="word " * 400)
    with _server(family, tok, call, long) as server:
        model = make_model(tok, server, params={"max_new_tokens": limit})
        agent = make_agent(model, [add])
        with pytest.raises(MaxTokensReachedException):
            await agent.invoke_async("What is 2+3?")
        _check(model, server)
        last = model.token_manager.spans[-1]
        assert last.kind == "generated" and len(last) == limit and last.info.finish_reason == "length"
        assert not set(last.token_ids) & {tok.convert_tokens_to_ids(t) for t in end_tokens(family, tok)}
        # The partial message Strands keeps is the text of ALL its tokens: none ended the turn, none is dropped.
        (block,) = [b for b in agent.messages[-1]["content"] if "text" in b]
        decoded = tok.decode(list(last.token_ids))
        assert decoded.endswith(block["text"]) and block["text"].count("word") == decoded.count("word") > 0


async def test_follow_up_user_turn(family, tok):
    first = [family.call_turn(Call("add", {"a": 2, "b": 3})), Turn(content="It is 5.")]
    second = [family.answer("Now 6.")]
    with _server(family, tok, *first, *second) as server:
        model = make_model(tok, server)
        agent = make_agent(model, [add])
        await agent.invoke_async("What is 2+3?")
        after_first = model.token_manager.token_ids
        await agent.invoke_async("Add one more.")
        _check(model, server)
        tm = model.token_manager
        assert tm.token_ids[: len(after_first)] == after_first, "the same trajectory continues"
        follow_up = tm.spans[4]
        assert follow_up.kind == "observation" and "Add one more." in tok.decode(list(follow_up.token_ids))
        answer_stop = tok.convert_tokens_to_ids(family.answer_stop)
        assert tm.spans[3].token_ids[-1] == answer_stop and follow_up.token_ids[0] != answer_stop
        episodes = [("What is 2+3?", first), ("Add one more.", second)]
        rewritten = family.rewritten_after_follow_up
        _assert_canonical(family, tok, model, episodes, [["5"]], [add], rewritten)


async def test_context_full(family, tok):
    call = family.call_turn(Call("huge_output", {"n": 400}))
    with _server(family, tok, call) as probe_server:
        probe = make_model(tok, probe_server)
        with pytest.raises(Exception):  # noqa: B017 - only the first turn's size is wanted
            await make_agent(probe, [huge_output]).invoke_async("Print.")
        used = len(probe.token_manager)
    with _server(family, tok, call, context_length=used + 20) as server:
        model = make_model(tok, server)
        with pytest.raises(ContextWindowOverflowException):
            await make_agent(model, [huge_output]).invoke_async("Print.")
        _check(model, server)
        tm = model.token_manager
        assert [s.kind for s in tm.spans] == ["prompt", "generated"] and len(tm) == used
        assert len(server.generate_requests) == 1


@pytest.mark.parametrize(
    ("name", "enable_thinking", "prompt_end", "first", "answer", "after_tools"),
    [
        (
            "hermes",
            False,
            "<|im_start|>assistant\n<think>\n\n</think>\n\n",
            "{call}",
            "The answer is 5.",
            None,
        ),
        ("glm45", False, "<|assistant|>\n<think></think>", "\n{call}", "\nThe answer is 5.", None),
        ("glm47", False, "<|assistant|></think>", "{call}", "The answer is 5.", None),
        (
            "glm47",
            None,
            "<|assistant|><think>",
            "Add them.</think>{call}",
            "Got 5.</think>The answer is 5.",
            None,
        ),
        # DeepSeek writes no generation prompt after a tool result: the model continues after it.
        (
            "deepseekv31",
            True,
            "<｜Assistant｜><think>",
            "Add them.</think>{call}",
            "The answer is 5.",
            "<｜tool▁output▁end｜>",
        ),
        (
            "deepseekv32",
            True,
            "<｜Assistant｜><think>",
            "Add them.</think>{call}",
            "Got 5.</think>The answer is 5.",
            "</function_results>\n\n<think>",
        ),
        (
            "deepseekv32",
            False,
            "<｜Assistant｜></think>",
            "{call}",
            "The answer is 5.",
            "</function_results>\n\n</think>",
        ),
        (
            "minimax-m2",
            None,
            "]~b]ai\n<think>\n",
            "Add them.\n</think>\n\n{call}",
            "Got 5.\n</think>\n\nThe answer is 5.",
            None,
        ),
    ],
)
async def test_generation_prompts_that_open_or_close_reasoning(
    name, enable_thinking, prompt_end, first, answer, after_tools
):
    """Thinking flags: the generation prompt writes an empty think block (the output has none) or opens one
    (the output starts in reasoning and a call before its </think> would not run)."""
    family, tok = FAMILIES[name], family_tokenizer(name)
    call = family.calls_text([Call("add", {"a": 2, "b": 3})])
    with SGLangTestServer(tok, end_of_turn=stop_tokens(family)) as server:
        server.script(
            ServerTurn(first.format(call=call), stop_token_id=tok.convert_tokens_to_ids(family.call_stop)),
            ServerTurn(answer, stop_token_id=tok.convert_tokens_to_ids(family.answer_stop)),
        )
        model = make_model(tok, server, enable_thinking=enable_thinking)
        result = await make_agent(model, [add]).invoke_async("What is 2+3?")
        assert CALLS == [("add", {"a": 2, "b": 3})] and not model.parse_errors
        assert str(result).strip() == "The answer is 5."
        _check(model, server)
        first_prompt = tok.decode(server.generate_requests[0].body["input_ids"])
        assert first_prompt.endswith(prompt_end)
        second_prompt = tok.decode(server.generate_requests[1].body["input_ids"])
        assert second_prompt.endswith(after_tools or prompt_end)
