"""The README's library example, run as written against the SGLang-protocol test server: the block after its
marker, with only the tokenizer id and the server URL made the test's (a real Qwen3 tokenizer, a local server).

The server answers with a Python call and then the answer; the example's agent (``build_agent`` / ``run_agent``,
the public fast path) runs the call in the real sandbox, and the trajectory it prints is checked against what the
server saw and sent.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import qwen3_tokenizer_path
from helpers import EMPTY_THINK, call_text

from slime_strands.testing import SGLangTestServer
from slime_strands.testing.invariants import assert_trajectory_invariants

pytestmark = pytest.mark.timeout(120)

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- tests/integration/test_readme_library.py runs the next block"


def _library_block() -> str:
    text = README.read_text(encoding="utf-8")
    assert MARKER in text, "the README lost its library example's marker"
    found = re.search(r"```python\n(.*?)```", text[text.index(MARKER) :], re.S)
    assert found, "no python block after the library example's marker"
    return found.group(1)


def test_the_readme_library_example_runs_as_written(tokenizer, capsys):
    block = _library_block()
    for written in ('"qwen3-demo"', '"http://localhost:30000"'):
        assert written in block, f"the example no longer names {written}: update this test"
    code = call_text("execute_python_code", {"code": "print(pow(2, 100, 7))"})
    with SGLangTestServer(tokenizer) as server:
        server.script(EMPTY_THINK + code, EMPTY_THINK + "2**100 mod 7 is 2.")
        block = block.replace('"qwen3-demo"', repr(qwen3_tokenizer_path()))  # the same, unless overridden
        block = block.replace('"http://localhost:30000"', repr(server.base_url))
        namespace: dict[str, object] = {"__name__": "readme_library"}
        exec(compile(block, str(README), "exec"), namespace)
        tm = namespace["tm"]
        assert_trajectory_invariants(tm, server)  # type: ignore[arg-type]
        assert len(server.generate_requests) == 2
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "end_turn None 1 Counter()", printed[0]
    result = tokenizer.decode(tm.token_ids[tm.prompt_length :])  # type: ignore[attr-defined]
    assert "<tool_response>\n2\n</tool_response>" in result, result


def test_the_readme_library_example_prints_no_torch_notice(tokenizer):
    """The same block in a fresh interpreter that cannot import PyTorch (as on a machine without it): the
    tokenizer loads and the agent runs, and transformers' "PyTorch was not found" notice is not printed."""
    block = _library_block()
    code = call_text("execute_python_code", {"code": "print(pow(2, 100, 7))"})
    with SGLangTestServer(tokenizer) as server:
        server.script(EMPTY_THINK + code, EMPTY_THINK + "2**100 mod 7 is 2.")
        script = "import sys\nsys.modules['torch'] = None\n" + block.replace(
            '"http://localhost:30000"', repr(server.base_url)
        )
        result = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=README.parent
        )
        assert len(server.generate_requests) == 2
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "end_turn None 1 Counter()"
    assert "PyTorch was not found" not in result.stderr, result.stderr
