"""The code environment through slime's REAL ``generate_and_rm`` (the unmodified snapshot): the agent with the code
settings (configs/strands_code.yaml) tries its program with the Python tool, answers with a fenced program, and
``slime_strands.reward.code_reward`` (slime's ``--custom-rm-path``) grades it against the row's tests in the real
sandbox. Rewards, statuses and the invariants of every trajectory are checked; a hostile final program scores 0
and the step goes on.

Needs slime's source (``slime_helpers.slime_source``; CI always has it) and an isolating sandbox (CI requires it).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
from slime_helpers import SLIME_LOOP_FLAGS, SLIME_PARAMS, make_args

from slime_strands.agent.record import EpisodeRecord, Termination
from slime_strands.reward import CODE_METADATA_KEY
from slime_strands.settings import PluginSettings
from slime_strands.testing import SGLangTestServer
from slime_strands.testing.invariants import assert_sample_matches_server

pytestmark = pytest.mark.timeout(300)

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "strands_code.yaml"
LABEL = json.dumps(
    {"entry_point": "add", "setup": "", "tests": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]}
)
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
HOSTILE = "import os\nos._exit(0)\n"


def call(code: str) -> str:
    arguments = json.dumps({"name": "execute_python_code", "arguments": {"code": code}})
    return f"Let me try it.\n<tool_call>\n{arguments}\n</tool_call>"


def final(program: str) -> str:
    return f"Here is the program.\n\n```python\n{program}```"


def code_args(server: SGLangTestServer):
    settings = PluginSettings.from_yaml(CONFIG, other_keys=False)
    assert settings.reward.kind == "code"
    strands = {
        "system_prompt": settings.system_prompt,
        "tools": list(settings.tools),
        "reward": {"kind": "code", "code": {"timeout_s": 5.0}},
    }
    flags = {**SLIME_LOOP_FLAGS, "custom_rm_path": "slime_strands.reward.code_reward"}
    return make_args(server, **flags, strands=strands)


async def test_generate_and_rm_grades_the_final_program_in_the_sandbox(slime, tokenizer):
    scripts = {
        "right after trying it": (call(RIGHT + "print(add(2, 3))"), final(RIGHT)),
        "right at once": (final(RIGHT),),
        "wrong": (call(WRONG + "print(add(2, 3))"), final(WRONG)),
        "no program": ("I would add the numbers.",),
        "exits before the tests": (final(HOSTILE),),
    }
    expected = {"right after trying it": 1.0, "right at once": 1.0}
    statuses = {
        "right after trying it": "passed",
        "right at once": "passed",
        "wrong": "failed",
        "no program": "no_program",
        "exits before the tests": "crashed",
    }
    with SGLangTestServer(tokenizer, context_length=8192) as server:
        args = code_args(server)
        samples = {}
        for name, turns in scripts.items():
            sample = slime.Sample(
                prompt="Write add(a, b).", label=LABEL, index=0, session_id=str(uuid.uuid4())
            )
            server.script(*turns, key=sample.session_id)
            samples[name] = sample
        done = await asyncio.gather(
            *(slime.generate_and_rm(args, s, dict(SLIME_PARAMS)) for s in samples.values())
        )
        for name, sample in zip(samples, done, strict=True):
            assert sample.status.name == "COMPLETED", (name, sample.status)
            assert_sample_matches_server(sample, server, routing_key=sample.session_id)
            record = EpisodeRecord.of(sample)
            assert record is not None and record.termination is Termination.END_TURN
            assert sample.reward == expected.get(name, 0.0), (name, sample.metadata.get(CODE_METADATA_KEY))
            verdict = sample.metadata[CODE_METADATA_KEY]
            assert verdict["status"] == statuses[name], (name, verdict)
        tried = samples["right after trying it"]
        assert EpisodeRecord.of(tried).tool_iters == 1
        assert "5" in tried.response  # the tool's output (the program printed add(2, 3)) is in the trajectory
