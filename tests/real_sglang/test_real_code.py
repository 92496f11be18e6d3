"""The code environment against the REAL SGLang server (issue 43): an episode with the code settings
(configs/strands_code.yaml: its system prompt, the Python tool, ``reward.kind: code``) in which grammar-constrained
sampling makes the random-weight Qwen3 write a fenced final program; ``code_reward`` grades it in the real sandbox
against each problem's tests. The same program is right for one problem (1.0, ``passed``) and wrong for another
(0.0, ``failed`` with the failing test's first lines), and every trajectory is checked against what the server saw
and answered.

The code settings' prompt (system prompt and the tool's spec, ~350 tokens) and the program fit the tier's window
(1,024 tokens) as they are: nothing is cut to fit.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from real_sglang.real_helpers import GREEDY, check_record, literal, run
from slime_strands.agent.record import METADATA_KEY, Termination
from slime_strands.reward import CODE_METADATA_KEY, code_reward
from slime_strands.settings import PluginSettings
from slime_strands.testing.slime_types import Sample

pytestmark = [pytest.mark.real_sglang, pytest.mark.timeout(600)]

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "strands_code.yaml"
PROGRAM = "def add(a, b):\n    return a + b\n"
ANSWER = f"Here is the program.\n\n```python\n{PROGRAM}```"
PROMPT = 'Complete the function:\n```python\ndef add(a, b):\n    """{doc}"""\n```'
PROBLEMS = {
    "right": ("Return a + b.", ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]),
    "wrong": ("Return a - b.", ["assert add(5, 3) == 2"]),
}
"""The program the grammar writes (``a + b``) is right for the first problem and wrong for the second."""


def code_settings() -> PluginSettings:
    settings = PluginSettings.from_yaml(CONFIG, other_keys=False)
    assert settings.reward.kind == "code", settings.reward
    assert list(settings.tools) == ["slime_strands.sandbox.execute_python_code"], settings.tools
    return settings


@pytest.mark.parametrize("problem", sorted(PROBLEMS))
async def test_a_grammar_written_program_is_graded_by_code_reward(proxy, tokenizer, problem):
    doc, tests = PROBLEMS[problem]
    settings = code_settings()
    key = f"code-{problem}"
    record = await run(
        proxy,
        tokenizer,
        {**GREEDY, "regex": literal(ANSWER)},
        plugin=settings,
        prompt=PROMPT.format(doc=doc),
        key=key,
    )
    assert record.termination is Termination.END_TURN, record.error
    assert (record.turns, record.tool_calls, record.parse_errors) == (1, 0, {})
    (exchange,) = check_record(record, proxy, key)
    assert exchange.answer["text"] == ANSWER  # the grammar held, the model's end of turn closed it
    sent = tokenizer.decode(exchange.body["input_ids"])  # the code settings' prompt and tool reached it
    assert settings.system_prompt in sent and '"name": "execute_python_code"' in sent, sent
    ends = ("<|im_end|>", "<|endoftext|>")  # the model may end its turn with either end id
    assert record.response in [ANSWER + end for end in ends], record.response

    label = json.dumps({"entry_point": "add", "setup": "", "tests": tests})
    sample = Sample(label=label, response=record.response)
    sample.metadata = {METADATA_KEY: record.to_metadata()}  # as generate writes it: the final turn's length
    reward = await code_reward(types.SimpleNamespace(strands=settings), sample)
    verdict = sample.metadata[CODE_METADATA_KEY]
    assert verdict["backend"] and verdict["total"] == len(tests), verdict
    outcome = (reward, verdict["status"], verdict["passed"])
    if problem == "right":
        assert outcome == (1.0, "passed", 2) and verdict["detail"] == "", verdict
    else:
        assert outcome == (0.0, "failed", 0), verdict
        detail = verdict["detail"]  # the failing test's first lines
        assert detail.startswith("test 0:") and "assert add(5, 3) == 2" in detail, verdict
