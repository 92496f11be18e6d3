"""The demo server end to end: ``slime-strands eval`` with the shipped math config (the REAL sandbox runs the
policy's programs) against it, in-process and as ``python -m slime_strands.testing``; Ctrl-C stops the process
cleanly; a real Strands agent of every model family solves a problem against it.

Every trajectory is checked against what the server saw and answered (the trajectory invariants)."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import as_foreground, check_row, latest, read_rows, run_cli, token_manager
from family_kit import SUPPORTED, family_tokenizer
from helpers import make_agent, make_model
from strands import tool

from data_prep import prepare as data_prep
from slime_strands.sandbox import execute_python_code
from slime_strands.template.tokenizer_loading import DEMO_TOKENIZER
from slime_strands.testing.demo_server import DemoServerOptions, build_demo_server
from slime_strands.testing.invariants import assert_trajectory_invariants
from slime_strands.trajectories.file import TrajectoryRow

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "strands_math.yaml")
WORD_PROBLEM = 7  # the demo dataset's last problem: the policy cannot read it as an expression
PRINTED = re.compile(r"<tool_response>\nanswer = (-?\d+)\n</tool_response>")
BOXED = re.compile(r"Answer: \\boxed\{(-?\d+)\}<\|im_end\|>$")


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "demo.jsonl"
    assert data_prep.main(["--dataset", "demo", "--out", str(out), "--quiet"]) == 0
    return out


def _eval(capsys: Any, base_url: str, data: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    argv = ["eval", "--base-url", base_url, "--tokenizer", DEMO_TOKENIZER, "--data", str(data)]
    return run_cli(capsys, *argv, "--config", CONFIG, "--out", str(out), *extra)


def _check_answer(row: TrajectoryRow) -> None:
    """One call, one answer: the number the sandbox printed for the policy's program, graded against the label."""
    assert (row.status, row.termination) == ("COMPLETED", "end_turn"), row.error
    assert row.record.turns == 2 and row.record.tool_calls == 1
    printed = PRINTED.findall(row.response)
    answer = BOXED.search(row.response)
    assert len(printed) == 1 and answer is not None, row.response
    assert answer.group(1) == printed[0], "the answer is what the program printed"
    assert row.reward == float(answer.group(1) == row.label)


def test_eval_on_the_demo_server(tokenizer, demo_data, tmp_path, capsys):
    out = tmp_path / "traj.jsonl"
    server = build_demo_server(tokenizer, DemoServerOptions(port=0, seed=0))
    with server:
        code, stdout, stderr = _eval(
            capsys, server.base_url, demo_data, out, "--n", "2", "--concurrency", "4"
        )
        assert code == 0, stderr
        rows = latest(read_rows(out))
        assert len(rows) == 16
        for row in rows.values():
            check_row(row, server)
            _check_answer(row)
    assert not any(row.correct for row in rows.values() if row.prompt_index == WORD_PROBLEM)
    accuracy = sum(row.correct for row in rows.values()) / len(rows)
    assert 0 < accuracy < 1
    assert re.search(rf"^demo\s+8\s+16\s+{accuracy:.3f}\s", stdout, re.M), stdout
    # 2 requests per trajectory, no retry, no refusal (stop() above raised on nothing)
    assert len(server.generate_requests) == 32
    assert {r.headers["x-smg-routing-key"] for r in server.generate_requests} == set(rows)


def _start(*argv: str) -> tuple[subprocess.Popen[str], str]:
    """``python -m slime_strands.testing argv`` and the URL of its ready line."""
    proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "slime_strands.testing", *argv],  # SIGABRT: every stack
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        preexec_fn=as_foreground,  # Ctrl-C stops it as in a user's terminal, however this test run was started
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until it serves (or exits: an empty line)
    ready = re.match(r"demo server ready at (http://127\.0\.0\.1:\d+): ", line)
    if ready is None or "it calls only execute_python_code" not in line:  # where users meet it, it says so
        proc.kill()
        pytest.fail(f"no ready line saying which tool the policy calls: {line!r} {proc.communicate()}")
    return proc, ready.group(1)


def test_the_demo_server_process_serves_until_ctrl_c(demo_data, tmp_path, capsys):
    proc, url = _start("--port", "0", "--seed", "5", "--wrong-rate", "0.5")
    try:
        out = tmp_path / "traj.jsonl"
        code, _, stderr = _eval(capsys, url, demo_data, out, "--limit", "4", "--n", "2")
        assert code == 0, stderr
        rows = latest(read_rows(out))
        for row in rows.values():
            _check_answer(row)
            for segment in row.segments:
                assert_trajectory_invariants(token_manager(segment))
        accuracy = sum(row.correct for row in rows.values()) / len(rows)
        assert 0 < accuracy < 1, "seed 5 slips on some of the 8 trajectories, not all"
        # A request no script foresaw (any token ids, no routing key) gets a turn, never a 500.
        body = json.dumps({"input_ids": [151644, 872, 198, 17, 488, 220, 17], "sampling_params": {}})
        request = urllib.request.Request(
            f"{url}/generate", body.encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            generated = json.load(answer)
        assert generated["output_ids"] and generated["meta_info"]["finish_reason"]["type"] == "stop"
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            # A server that ignored Ctrl-C must not outlive the test: SIGABRT ends it with its threads' stacks.
            proc.send_signal(signal.SIGABRT)
            stdout, stderr = proc.communicate()
            pytest.fail(f"the demo server did not stop within 60 s of Ctrl-C: {stdout!r} {stderr[-2000:]!r}")
    assert proc.returncode == 0, stderr
    assert stderr == ""
    assert stdout.strip() == "demo server stopped after 17 /generate requests"


def test_a_port_in_use_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "slime_strands.testing", "--port", str(port)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"python -m slime_strands.testing: error: cannot listen on 127.0.0.1:{port}: Address already in use "
        "-- hint: stop what uses that port or pass another --port (0: any free one)"
    ]


@pytest.mark.parametrize("name", SUPPORTED)
async def test_an_agent_of_every_family_solves_a_problem(name):
    """The policy writes each family's own tool-call format (the template's rendering): the client's parser
    reads the call, the sandbox runs it, the policy reads the result back and answers."""
    tokenizer = family_tokenizer(name)
    with build_demo_server(tokenizer, DemoServerOptions(port=0, wrong_rate=0.0)) as server:
        model = make_model(tokenizer, server)
        agent = make_agent(model, [execute_python_code])
        result = await agent.invoke_async("What is (125 - 17) * 3? Use Python.")
        assert_trajectory_invariants(model.token_manager, server)
    assert model.parse_errors == {}
    assert len(server.generate_requests) == 2
    tool_results = [
        block["toolResult"]
        for message in agent.messages
        for block in message["content"]
        if "toolResult" in block
    ]
    assert [r["content"][0]["text"] for r in tool_results] == ["answer = 324"]
    assert str(result).strip().endswith("Answer: \\boxed{324}")


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


NO_TOOL_LIST = {"deepseekv3", "deepseekv31"}
"""Families whose chat template writes no tool list (DeepSeek V3/R1's and V3.1's: their users describe tools in the
system prompt themselves), so no policy can see which tools a request offers: the demo policy calls its own."""


@pytest.mark.parametrize("name", sorted(set(SUPPORTED) - NO_TOOL_LIST))
async def test_an_agent_with_its_own_tools_gets_an_answer_without_a_call(name):
    """A user's own tool (not the policy's execute_python_code) and a system prompt that names the policy's tool
    in prose: the policy calls nothing, answers at once and says why; no call to an unknown tool."""
    tokenizer = family_tokenizer(name)
    with build_demo_server(tokenizer, DemoServerOptions(port=0, wrong_rate=0.0)) as server:
        model = make_model(tokenizer, server)
        prompt = "Use the `execute_python_code` tool when you can; otherwise answer directly."
        agent = make_agent(model, [add], system_prompt=prompt)
        result = await agent.invoke_async("What is (125 - 17) * 3?")
        assert_trajectory_invariants(model.token_manager, server)
    assert model.parse_errors == {} and len(server.generate_requests) == 1
    text = tokenizer.decode(model.token_manager.token_ids[model.token_manager.prompt_length :])
    assert "The demo policy calls only execute_python_code, which this request does not offer" in text
    assert str(result).strip().endswith("Answer: \\boxed{324}")


@pytest.mark.parametrize("name", sorted(NO_TOOL_LIST))
def test_a_template_without_a_tool_list_is_taken_to_offer_the_policys_tool(name):
    from slime_strands.template.render import ChatRenderer
    from slime_strands.testing.math_policy import _ToolList

    tool_list = _ToolList.of(ChatRenderer(family_tokenizer(name), probe=False))
    assert tool_list.before_name is None and tool_list.offers("any prompt")


def test_bad_arguments_are_one_line(tmp_path, capsys):
    from slime_strands.testing.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main(["--wrong-rate", "2"])
    assert exited.value.code == 2
    assert "argument --wrong-rate: must be between 0 and 1, got 2.0" in capsys.readouterr().err
    missing = str(tmp_path / "no" / "such" / "model")
    assert main(["--tokenizer", missing]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"python -m slime_strands.testing: error: tokenizer {missing!r} not found: no such file or folder -- hint: "
    )


def test_listening_on_every_address_gives_a_loopback_url(tokenizer):
    with build_demo_server(tokenizer, DemoServerOptions(host="0.0.0.0", port=0)) as server:
        assert server.base_url == f"http://127.0.0.1:{server.port}"
        with urllib.request.urlopen(f"{server.base_url}/v1/models", timeout=30) as answer:
            models = json.load(answer)
    assert [card["id"] for card in models["data"]] == ["slime-strands/demo-math-policy"]
