r"""The demo server's policy: a scripted "model" that solves math problems the way the math agent is meant to,
so the whole pipeline (eval, the sandbox, inspect, drift, slime's rollout) can be tried without a GPU.

For each ``/generate`` request it decodes the input ids (the trajectory so far) and writes, in the chat
template's own format (its tool-call format: hermes for Qwen3), one of two turns:

1. before its own call: one ``execute_python_code`` call whose program computes the problem, the arithmetic
   expression it reads in the first user message (``37 * 12 + 5``, ``2^10 - 24``, ``(125 - 17) * 3``); a problem
   it cannot read gets a guess, the sum of the numbers in it (usually wrong);
2. after its call: ``Answer: \boxed{N}``, N being the number the program printed (read from the tool result in
   the input), or the value of its program when the tool printed none.

It calls no other tool: a request whose tool list does not hold ``execute_python_code`` (a user's own tools) gets
the answer at once, worked out without a tool, and says so (a template that writes no tool list, as DeepSeek
V3.1's, shows nothing of what is offered: the policy then calls its tool); to test an agent with its own tools,
script the turns with :meth:`SGLangTestServer.script <slime_strands.testing.SGLangTestServer.script>`.

It slips on purpose: with probability ``wrong_rate`` its program has one number off by one, so that answer is
wrong and an eval's accuracy is neither 0 nor 1. The draw is seeded by ``seed`` and the request's routing key
(``X-SMG-Routing-Key``: eval sends ``<prompt index>:<sample>``, slime the sample's session id), so every
trajectory gets the same answer in every run, whatever the order; requests without a key draw from one seeded
sequence, in arrival order. Sampling params other than the stop rules and ``max_new_tokens`` (which the
server applies) do not change what it writes.
"""

from __future__ import annotations

import ast
import json
import logging
import operator
import random
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..template.probe import render_assistant_turn
from ..template.render import ChatRenderer, TemplateError
from .server import Turn

__all__ = ["MathPolicy", "read_expression"]

logger = logging.getLogger(__name__)

TOOL_NAME = "execute_python_code"
_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Execute a Python 3 program and return what it printed.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the complete Python program to run"}},
            "required": ["code"],
        },
    },
}
_PRINT = 'print("answer =", value)'
"""The last line of every program the policy writes: in the input, it marks the policy's own call."""
_MARKS = (_PRINT, json.dumps(_PRINT)[1:-1])  # as written, and inside a JSON string (hermes' arguments)
_PRINTED = re.compile(r"answer = (-?\d+(?:\.\d+)?)")
_PROGRAM_VALUE = re.compile(r"value = ([\d\s()+\-*/.]+?)(?:\\n|\n)")
_RUN = re.compile(r"[\d()+\-*/^×÷ ]+")
_NUMBER = re.compile(r"\d+")
_OPERATORS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_LARGEST = 10**30
"""Values beyond this are not "simple arithmetic": the policy guesses instead (and never asks the sandbox to
compute a tower of powers)."""


@dataclass(frozen=True)
class _UserTurn:
    """Where the first user message's text sits in a rendered conversation: what the template writes right
    before it (``header``; empty: unknown, the whole text is read) and right after it (``end``: the template's
    end of a user turn, or its generation prompt when a user turn has no end of its own, as in GLM's)."""

    header: str
    end: str

    @classmethod
    def of(cls, renderer: ChatRenderer) -> _UserTurn:
        mark = "PROBLEM-5e1c"
        alone = renderer.render([{"role": "user", "content": mark}], add_generation_prompt=False)
        before, _, after = alone.partition(mark)
        end = after or renderer.facts.generation_prompt
        try:
            system = {"role": "system", "content": "SYSTEM-5e1c"}
            with_system = renderer.render(
                [system, {"role": "user", "content": mark}], add_generation_prompt=False
            )
        except TemplateError:  # a template that refuses a system message: the header is not known
            return cls("", end)
        before_too = with_system.partition(mark)[0]
        common = 0
        while common < min(len(before), len(before_too)) and before[-1 - common] == before_too[-1 - common]:
            common += 1
        return cls(before[len(before) - common :], end)

    def split(self, text: str) -> tuple[str, str]:
        """``(the first user message's text, the text from its start on)``."""
        start = text.find(self.header) if self.header else -1
        start = 0 if start < 0 else start + len(self.header)
        end = text.find(self.end, start) if self.end else -1
        return text[start : None if end < 0 else end], text[start:]


@dataclass(frozen=True)
class _ToolList:
    """How the template writes a tool's name in the tool list of a prompt (``"name": "`` in JSON specs, ``### ``
    in DeepSeek's): the name written so is an offered tool, not a word of a system prompt."""

    before_name: str | None
    """None: the template writes no tool list (every request is taken to offer the tool)."""

    @classmethod
    def of(cls, renderer: ChatRenderer) -> _ToolList:
        user = {"role": "user", "content": "PROBLEM-5e1c"}
        try:  # some templates write the tool list only into a system message (DeepSeek V3.1's)
            system = {"role": "system", "content": "SYSTEM-5e1c"}
            rendered = renderer.render([system, user], tools=[_TOOL], add_generation_prompt=True)
        except TemplateError:  # a template that refuses a system message
            rendered = renderer.render([user], tools=[_TOOL], add_generation_prompt=True)
        at = rendered.find(TOOL_NAME)
        if at < 0:
            return cls(None)
        start = max(rendered.rfind("\n", 0, at) + 1, at - 16)
        return cls(rendered[start:at])

    def offers(self, prompt: str) -> bool:
        """Whether ``prompt`` (up to the end of the first user message) offers the policy's tool."""
        return self.before_name is None or self.before_name + TOOL_NAME in prompt


class MathPolicy:
    """A :attr:`SGLangTestServer.responder <slime_strands.testing.SGLangTestServer.responder>`: see the module
    docstring."""

    def __init__(self, tokenizer: Any, *, seed: int = 0, wrong_rate: float = 0.25) -> None:
        if not 0.0 <= wrong_rate <= 1.0:
            raise ValueError(f"wrong_rate must be in [0, 1], got {wrong_rate}")
        self.tokenizer = tokenizer
        self.seed = seed
        self.wrong_rate = wrong_rate
        self._renderer = ChatRenderer(tokenizer, probe=False)
        self._user_turn = _UserTurn.of(self._renderer)
        self._tool_list = _ToolList.of(self._renderer)
        self._sequence = random.Random(seed)
        self._lock = threading.Lock()
        probe = self._turn(_call_message("", "value = 1"))
        if probe is None or TOOL_NAME not in probe:
            name = getattr(tokenizer, "name_or_path", tokenizer)
            raise ValueError(f"the chat template of {name!r} renders no tool call: the math policy needs one")

    def __call__(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> Turn:
        """The next turn of the request's trajectory (never an error: a failure of the policy itself is logged
        and answered with a plain guess)."""
        try:
            return Turn(self._write(self.tokenizer.decode(body["input_ids"]), headers))
        except Exception:
            logger.exception("the demo math policy failed on a request; answering a guess")
            return Turn("I could not work this out.\n\nAnswer: \\boxed{0}")

    def _write(self, text: str, headers: Mapping[str, str]) -> str:
        problem, rest = self._user_turn.split(text)
        at = max(rest.rfind(mark) for mark in _MARKS)
        if at < 0 and not self._tool_list.offers(text[: len(text) - len(rest) + len(problem)]):
            return self._without_the_tool(problem)
        if at < 0:
            return self._call(problem, self._draw(headers))
        printed = _PRINTED.findall(rest[at:])
        if printed:
            number = _format(printed[-1])
            reasoning = f"The program printed {number}, so that is the answer."
        else:
            programs = _PROGRAM_VALUE.findall(rest)
            value = _value(programs[-1]) if programs else None
            number = "0" if value is None else _format(str(value))
            reasoning = f"The program printed no answer. Working it out by hand: {number}."
        return self._answer(reasoning, number)

    def _without_the_tool(self, problem: str) -> str:
        """The answer at once, worked out without a tool (the expression, else the sum of the numbers): the
        request does not offer the policy's one."""
        value = _value(read_expression(problem) or " + ".join(_NUMBER.findall(problem)) or "0")
        number = "0" if value is None else _format(str(value))
        note = (
            f"The demo policy calls only {TOOL_NAME}, which this request does not offer: no tool was called."
        )
        return self._answer(f"Working it out by hand: {number}.", number, note=note)

    def _answer(self, reasoning: str, number: str, *, note: str = "") -> str:
        """The answer turn; ``note`` goes before the answer line (templates that drop reasoning keep it)."""
        content = (f"{note}\n\n" if note else "") + f"Answer: \\boxed{{{number}}}"
        return (
            self._turn({"role": "assistant", "reasoning_content": reasoning, "content": content}) or content
        )

    def _call(self, problem: str, rng: random.Random) -> str:
        """The turn calling the tool with a program for ``problem``; slips when the draw says so."""
        slip = rng.random() < self.wrong_rate
        expression = read_expression(problem)
        if expression is None:
            reasoning = "I cannot find an expression to compute; adding up the numbers is my best guess."
            program = f"# a guess: the sum of the numbers in the problem\nvalue = {' + '.join(_NUMBER.findall(problem)) or '0'}"
        else:
            reasoning = f"The problem asks for {expression}. I will compute it with Python."
            program = f"# the expression in the problem\nvalue = {_slipped(expression, rng) if slip else expression}"
        turn = self._turn(_call_message(reasoning, program))
        assert turn is not None  # checked at construction
        return turn

    def _turn(self, assistant: Mapping[str, Any]) -> str | None:
        """What the model of this template writes for ``assistant`` (None: the template cannot render it)."""
        rendered = render_assistant_turn(self._renderer, "Solve this problem.", assistant, [_TOOL])
        return None if rendered is None else rendered[0]

    def _draw(self, headers: Mapping[str, str]) -> random.Random:
        key = headers.get("x-smg-routing-key")
        if key:
            return random.Random(f"{self.seed}:{key}")
        with self._lock:
            return random.Random(self._sequence.getrandbits(64))


def _call_message(reasoning: str, program: str) -> dict[str, Any]:
    call = {"name": TOOL_NAME, "arguments": {"code": f"{program}\n{_PRINT}"}}
    return {
        "role": "assistant",
        "reasoning_content": reasoning,
        "content": "",
        "tool_calls": [
            {"id": f"functions.{TOOL_NAME}:0", "type": "function", "function": call}
        ],  # Kimi's id form
    }


def read_expression(problem: str) -> str | None:
    """The last arithmetic expression of integers in ``problem`` (``^`` and ``×`` / ``÷`` written as Python's
    ``**``, ``*``, ``/``), or None when it holds none the policy can compute safely."""
    found = None
    for run in _RUN.findall(problem):
        expression = " ".join(run.replace("^", "**").replace("×", "*").replace("÷", "/").split())
        expression = _balanced(expression)
        try:
            tree = ast.parse(expression, mode="eval")
        except SyntaxError:
            continue
        if isinstance(tree.body, ast.BinOp) and _value(expression) is not None:
            found = expression
    return found


def _balanced(expression: str) -> str:
    """Without the dangling operators and unmatched parentheses at its ends (``(see 3 + 4)`` reads ``3 + 4``,
    ``84 / 7 * 3 (exactly)`` reads ``84 / 7 * 3``)."""
    expression = expression.lstrip(")+*/ ").rstrip("(+-*/ ")
    while expression.startswith("(") and expression.count("(") > expression.count(")"):
        expression = expression[1:].lstrip()
    while expression.endswith(")") and expression.count(")") > expression.count("("):
        expression = expression[:-1].rstrip()
    return expression


def _value(expression: str) -> int | float | None:
    """The value of an arithmetic expression, computed without ``eval``; None for anything else, a division by
    zero or a value beyond :data:`_LARGEST`."""
    try:
        value = _evaluate(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError):
        return None
    return value


def _evaluate(node: ast.AST) -> int | float:
    value: Any
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        value = node.value
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _evaluate(node.operand) * (-1 if isinstance(node.op, ast.USub) else 1)
    elif isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 128 or abs(left) > _LARGEST):
            raise ValueError("too large a power")
        value = _OPERATORS[type(node.op)](left, right)
    else:
        raise ValueError(f"not arithmetic: {ast.dump(node)}")
    if not isinstance(value, (int, float)) or abs(value) > _LARGEST:  # a complex root, a huge value
        raise ValueError(f"not a simple value: {value!r}")
    return value


def _slipped(expression: str, rng: random.Random) -> str:
    """``expression`` with one of its numbers off by one (a misread digit), always of another value."""
    numbers = list(_NUMBER.finditer(expression))
    target = numbers[rng.randrange(len(numbers))]
    number = int(target.group())
    changed = number + 1 if number == 0 or rng.random() < 0.5 else number - 1
    slipped = f"{expression[: target.start()]}{changed}{expression[target.end() :]}"
    return slipped if _value(slipped) not in (None, _value(expression)) else f"{expression} + 1"


def _format(number: str) -> str:
    """A printed number as an answer: an integral one without its ``.0`` (``54.0`` -> ``54``)."""
    whole, dot, fraction = number.partition(".")
    return whole if dot and not fraction.strip("0") else number
