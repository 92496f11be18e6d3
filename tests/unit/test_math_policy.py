"""The demo server's math policy on the real Qwen3 tokenizer: what it reads in a problem, the call it writes
(hermes, parsed back by the client's own parser), the answer it gives from the tool's output, its seeded slips,
and that it answers every request, whatever the input."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest

from slime_strands.template.probe import select_tool_parser
from slime_strands.template.render import ChatRenderer
from slime_strands.testing.math_policy import _TOOL, TOOL_NAME, MathPolicy, read_expression

SCHEMAS = {TOOL_NAME: _TOOL["function"]["parameters"]}


@pytest.mark.parametrize(
    ("problem", "expression"),
    [
        ("What is 37 * 12 + 5?", "37 * 12 + 5"),
        ("Compute 2^10 - 24.", "2**10 - 24"),
        ("What is (125 - 17) * 3?", "(125 - 17) * 3"),
        ("Find 84 ÷ 7 × 3 (exactly).", "84 / 7 * 3"),
        ("In 2024, (see 3 + 4) what is left?", "3 + 4"),
        ("A train at 60 mph for 3 hours: how far?", None),
        ("What is 9^9^9?", None),  # a tower of powers is not "simple arithmetic": never sent to the sandbox
        ("What is 5 / 0?", None),
        ("What is -7?", None),
    ],
)
def test_read_expression(problem, expression):
    assert read_expression(problem) == expression


def _prompt(tokenizer: Any, problem: str) -> tuple[ChatRenderer, str]:
    renderer = ChatRenderer(tokenizer)
    messages = [
        {"role": "system", "content": "You are careful. Answer: \\boxed{<answer>}; use the tool."},
        {
            "role": "user",
            "content": f"Solve the following problem.\n\n{problem}\n\nRemember the Answer line.",
        },
    ]
    return renderer, renderer.render(messages, tools=[_TOOL])


def _ids(tokenizer: Any, text: str) -> dict[str, Any]:
    return {"input_ids": tokenizer.encode(text, add_special_tokens=False)}


def _call(tokenizer: Any, policy: MathPolicy, problem: str, key: str | None = "0:0") -> tuple[str, str]:
    """The policy's first turn for ``problem``, and the program of its call, read by the client's parser."""
    renderer, prompt = _prompt(tokenizer, problem)
    text = policy(_ids(tokenizer, prompt), {"x-smg-routing-key": key} if key else {}).text
    parsed = select_tool_parser(renderer).parse(text, starts_in_reasoning=False, tools=SCHEMAS)
    assert [c.name for c in parsed.calls] == [TOOL_NAME], text
    return text, parsed.calls[0].input["code"]


def _program_value(program: str) -> int:
    namespace: dict[str, Any] = {}
    exec(program.replace("print(", "(lambda *a: None)("), {"__builtins__": {}}, namespace)  # literals only
    return int(namespace["value"])


def test_first_turn_calls_the_tool_with_the_problem_in_hermes(tokenizer):
    text, program = _call(tokenizer, MathPolicy(tokenizer, wrong_rate=0.0), "What is 37 * 12 + 5?")
    assert text.startswith("<think>\nThe problem asks for 37 * 12 + 5.")
    assert "<tool_call>\n" in text and text.endswith("</tool_call>")
    assert program.splitlines()[1:] == ["value = 37 * 12 + 5", 'print("answer =", value)']
    assert _program_value(program) == 449


def test_a_problem_it_cannot_read_gets_a_guess(tokenizer):
    problem = "A train travels at 60 miles per hour for 3 hours, then at 45 for 2 hours. How far?"
    _, program = _call(tokenizer, MathPolicy(tokenizer, wrong_rate=0.0), problem)
    assert "value = 60 + 3 + 45 + 2" in program


def _after_tool(tokenizer: Any, policy: MathPolicy, problem: str, output: str) -> str:
    """The policy's turn after its call came back with ``output``, the conversation rendered by the template."""
    renderer, prompt = _prompt(tokenizer, problem)
    call = policy(_ids(tokenizer, prompt), {"x-smg-routing-key": "0:0"}).text
    result = (
        f"{renderer.end_of_turn}\n<|im_start|>user\n<tool_response>\n{output}\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    return policy(_ids(tokenizer, prompt + call + result), {}).text


@pytest.mark.parametrize(
    ("output", "answer"),
    [
        ("answer = 449", "449"),
        ("answer = 54.0", "54"),
        ("answer = 3.5", "3.5"),
        ("answer = 123456789012345678901", "123456789012345678901"),
        ("[sandbox error: no isolating sandbox backend works here]", "449"),  # its own program, by hand
        ("[timeout: killed after 10.0 s]", "449"),
    ],
)
def test_the_answer_is_what_the_tool_printed(tokenizer, output, answer):
    text = _after_tool(tokenizer, MathPolicy(tokenizer, wrong_rate=0.0), "What is 37 * 12 + 5?", output)
    assert text.endswith(f"Answer: \\boxed{{{answer}}}")
    assert text.startswith("<think>\n") and "<tool_call>" not in text


def test_slips_are_seeded_by_the_routing_key(tokenizer):
    problem, right = "What is 37 * 12 + 5?", 449
    keys = [f"{p}:{s}" for p in range(10) for s in range(8)]
    policy = MathPolicy(tokenizer, seed=3, wrong_rate=0.25)
    values = {key: _program_value(_call(tokenizer, policy, problem, key)[1]) for key in keys}
    wrong = [key for key, value in values.items() if value != right]
    assert 8 <= len(wrong) <= 32, "about a quarter of 80 draws"  # fixed seed: the count is deterministic
    assert all(abs(values[key] - right) > 0 for key in wrong)
    again = MathPolicy(tokenizer, seed=3, wrong_rate=0.25)  # another server, keys in another order
    assert {key: _program_value(_call(tokenizer, again, problem, key)[1]) for key in reversed(keys)} == values
    other = MathPolicy(tokenizer, seed=4, wrong_rate=0.25)
    assert {key: _program_value(_call(tokenizer, other, problem, key)[1]) for key in keys} != values


@pytest.mark.parametrize(("rate", "right"), [(0.0, True), (1.0, False)])
def test_wrong_rate_bounds(tokenizer, rate, right):
    policy = MathPolicy(tokenizer, wrong_rate=rate)
    for key in ("0:0", "1:0", "2:3", None):
        for problem, value in (("What is 37 * 12 + 5?", 449), ("Compute 2^10 - 24.", 1000)):
            assert (_program_value(_call(tokenizer, policy, problem, key)[1]) == value) is right


def test_without_routing_keys_the_draws_follow_one_seeded_sequence(tokenizer):
    def run(seed: int) -> list[int]:
        policy = MathPolicy(tokenizer, seed=seed, wrong_rate=0.5)
        return [_program_value(_call(tokenizer, policy, "What is 37 * 12 + 5?", None)[1]) for _ in range(12)]

    first = run(7)
    assert first == run(7) and len(set(first)) > 1


def test_every_request_gets_a_turn(tokenizer, caplog):
    policy = MathPolicy(tokenizer)
    for ids in ([0], list(range(1000, 1400)), tokenizer.encode("no template at all: 2 + 2")):
        turn = policy({"input_ids": ids}, {})
        assert turn.text and turn.finish == "stop"
    with caplog.at_level(logging.ERROR):
        turn = policy({"no_input_ids": True}, {})  # the policy itself fails: logged, and still answered
    assert re.search(r"Answer: \\boxed\{0\}$", turn.text or "")
    assert "the demo math policy failed" in caplog.text


def test_a_template_that_cannot_render_tool_calls_is_refused(tokenizer):
    import copy

    plain = copy.deepcopy(tokenizer)
    plain.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(ValueError, match="renders no tool call"):
        MathPolicy(plain)


def test_wrong_rate_must_be_a_probability(tokenizer):
    with pytest.raises(ValueError, match="wrong_rate"):
        MathPolicy(tokenizer, wrong_rate=1.5)


def test_a_request_without_its_tool_gets_the_answer_at_once(tokenizer):
    """Only the user's own tool is offered, and the system prompt names the policy's tool in prose: the policy
    calls nothing (a call would be an unknown tool), answers, and says why."""
    renderer = ChatRenderer(tokenizer)
    own = {
        "type": "function",
        "function": {"name": "add", "description": "Add.", "parameters": {"type": "object"}},
    }
    messages = [
        {"role": "system", "content": f"Use the `{TOOL_NAME}` tool when it is there."},
        {"role": "user", "content": "What is 37 * 12 + 5?"},
    ]
    for tools in ([own], None):
        prompt = renderer.render(messages, tools=tools)
        text = MathPolicy(tokenizer)(_ids(tokenizer, prompt), {"x-smg-routing-key": "0:0"}).text
        assert "<tool_call>" not in text
        assert text.endswith(
            f"The demo policy calls only {TOOL_NAME}, which this request does not offer: no tool was called.\n\n"
            "Answer: \\boxed{449}"
        ), text
