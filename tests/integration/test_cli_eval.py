"""``slime-strands eval`` end to end: the real Qwen3 tokenizer, a real Strands agent, real HTTP to the
SGLang-protocol test server (each episode scripted under its routing key, which is its row key)."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_helpers import (
    CALL_ADD,
    as_foreground,
    check_row,
    eval_argv,
    latest,
    read_rows,
    run_cli,
    write_config,
    write_data,
)
from helpers import verify_workers

from data_prep.install_hints import install_command
from slime_strands.testing import Fault, SGLangTestServer, Turn

pytestmark = pytest.mark.timeout(120)

BAD_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2}\n</tool_call>'  # invalid JSON


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=8192) as srv:
        yield srv


@pytest.fixture
def data(tmp_path):
    return write_data(
        tmp_path / "math.jsonl",
        [
            {"prompt": [{"role": "user", "content": "What is 2 + 3?"}], "label": "5"},
            {"prompt": "What is 6 * 7?", "label": "42"},
            {"prompt": "What is 3 + 4?", "label": "7", "metadata": {"dataset": "other"}},
        ],
    )


def script_first_run(server: SGLangTestServer) -> None:
    """Prompt 0: 4/4 right with a tool call; prompt 1: 1/4 (a malformed call, a cut-off turn); prompt 2: 0/4,
    sample 3 FAILS (a 400 the client does not retry)."""
    for s in range(4):
        server.script(CALL_ADD, "The sum is 5.\nAnswer: \\boxed{5}", key=f"0:{s}")
    server.script("Answer: \\boxed{42}", key="1:0")
    server.script(BAD_CALL, "Answer: \\boxed{41}", key="1:1")
    server.script("Answer: \\boxed{40}", key="1:2")
    server.script(
        Turn("Answer: \\boxed{4" + " 4" * 8192, finish="length"), key="1:3"
    )  # writes past its budget
    for s in range(3):
        server.script(f"Answer: \\boxed{{{s}}}", key=f"2:{s}")
    server.script(Fault(400, {"error": {"message": "scripted refusal"}}), key="2:3")


def test_eval_resume_and_pass_at_k(server, data, tmp_path, capsys):
    out = tmp_path / "traj.jsonl"
    config = write_config(tmp_path / "plugin.yaml")
    script_first_run(server)
    before = verify_workers()  # an earlier test's, on its own loop
    code, stdout, stderr = run_cli(
        capsys,
        *eval_argv(
            server.base_url,
            data,
            "--n",
            "4",
            "--concurrency",
            "3",
            "--config",
            str(config),
            "--out",
            str(out),
        ),
    )
    assert code == 1, "a FAILED trajectory makes the exit status 1"
    assert verify_workers() <= before, "the math-verify workers the eval started stop with it"
    assert "1 trajectory FAILED:\n  1: the server refused the request (HTTP 400: scripted refusal)" in stderr
    assert "rerun of the same command" not in stderr, "a rerun would send the same request"
    assert (
        "eval: 12/12 done, 0 running, 1 failed" in stderr
    )  # the progress line (not a terminal: plain lines)
    first = read_rows(out)
    assert sorted(r.key for r in first) == sorted(f"{p}:{s}" for p in range(3) for s in range(4))
    failed = latest(first)["2:3"]
    assert (
        failed.status == "FAILED" and failed.termination == "failure" and "scripted refusal" in failed.error
    )
    assert failed.reward == 0.0 and failed.segments == [] and failed.messages == [], (
        "nothing generated: no tokens"
    )
    for row in first:
        check_row(row, server)

    # A kill: the episode 1:2 was running (its line is missing) and a line was cut half-way.
    lines = out.read_text().splitlines(keepends=True)
    kept = [line for line in lines if json.loads(line)["key"] != "1:2"]
    out.write_text("".join(kept) + lines[0][:57])
    served = len(server.generate_requests)
    server.script("Answer: \\boxed{41}", key="1:2")
    server.script("I think it is 8.\nAnswer: \\boxed{8}", key="2:3")
    code, stdout, stderr = run_cli(
        capsys,
        *eval_argv(
            server.base_url,
            data,
            "--n",
            "4",
            "--concurrency",
            "3",
            "--config",
            str(config),
            "--out",
            str(out),
        ),
    )
    assert code == 0, stderr
    rerun = server.generate_requests[served:]
    assert sorted(r.headers["x-smg-routing-key"] for r in rerun) == ["1:2", "2:3"], (
        "only the missing and FAILED rows run"
    )
    assert "2 trajectories generated, 10 resumed" in stdout
    assert out.read_bytes().endswith(b"\n"), "the cut line is gone, every line is whole"
    rows = read_rows(out)
    final = latest(rows)
    assert len(final) == 12 and len(rows) == 13  # 2:3's FAILED line stays; the later line wins
    assert final["2:3"].status == "COMPLETED" and final["1:2"].reward == 0.0
    check_row(final["1:2"], server, since=served)
    check_row(final["2:3"], server, since=served)

    # Rewards are slime's eval accuracy; the trajectory rows say how each episode went.
    assert [final[f"0:{s}"].reward for s in range(4)] == [1.0] * 4
    assert [final[f"1:{s}"].reward for s in range(4)] == [1.0, 0.0, 0.0, 0.0]
    assert final["1:1"].record.parse_errors == {"bad_json": 1}
    # its turn was sized by the server's 8192-token window (the budget, 16384, is larger): cut by the window
    assert final["1:3"].status == "TRUNCATED" and final["1:3"].termination == "context_full"
    assert final["0:0"].record.tool_calls == 1 and final["0:0"].record.turns == 2
    assert final["0:0"].dataset == "math" and final["2:0"].dataset == "other"

    # The summary, by hand. Prompt 0: c=4 of n=4; prompt 1: c=1; prompt 2: c=0.
    # pass@1 = mean(c/n); pass@2 = mean(1 - C(n-c,2)/C(n,2)) = (1 + (1 - 3/6) + 0)/3; pass@4 = (1 + 1 + 0)/3.
    table = _table(stdout)
    assert table["all"]["accuracy"] == "0.417" and table["all"]["pass@1"] == "0.417"
    assert table["all"]["pass@2"] == "0.500" and table["all"]["pass@4"] == "0.667"
    # math: prompts 0 and 1 -> accuracy 5/8, pass@2 = (1 + 0.5)/2, pass@4 = 1; other: nothing right.
    assert (table["math"]["accuracy"], table["math"]["pass@2"], table["math"]["pass@4"]) == (
        "0.625",
        "0.750",
        "1.000",
    )
    assert (table["other"]["accuracy"], table["other"]["pass@4"]) == ("0.000", "0.000")
    assert table["all"]["prompts"] == "3" and table["all"]["samples"] == "12"
    turns = sum(r.record.turns for r in final.values()) / 12
    calls = sum(r.record.tool_calls for r in final.values()) / 12
    assert table["all"]["turns"] == f"{turns:.2f}" and table["all"]["tool calls"] == f"{calls:.2f}"
    assert table["all"]["parse errors"] == "8.3%" and table["all"]["truncated"] == "8.3%"
    assert table["all"]["failed"] == "0.0%"


def test_rerun_of_a_finished_eval_runs_nothing(server, data, tmp_path, capsys):
    out = tmp_path / "traj.jsonl"
    config = write_config(tmp_path / "plugin.yaml")
    for p, answer in enumerate(["5", "42", "6"]):
        for s in range(2):
            server.script(f"Answer: \\boxed{{{answer}}}", key=f"{p}:{s}")
    argv = eval_argv(server.base_url, data, "--n", "2", "--config", str(config), "--out", str(out))
    assert run_cli(capsys, *argv)[0] == 0
    served = len(server.generate_requests)
    code, stdout, stderr = run_cli(capsys, *argv)
    assert code == 0 and len(server.generate_requests) == served
    assert "0 trajectories generated, 6 resumed" in stdout and "eval: 6/6 done" in stderr
    assert _table(stdout)["all"]["accuracy"] == "0.667"
    code, stdout, _ = run_cli(
        capsys,
        *eval_argv(
            server.base_url, data, "--n", "1", "--limit", "2", "--config", str(config), "--out", str(out)
        ),
    )
    assert code == 0 and "0 trajectories generated, 2 resumed" in stdout, "a smaller plan takes its rows only"
    assert _table(stdout)["math"]["samples"] == "2" and "pass@2" not in stdout


def _interrupt(argv: list[str], ready: Callable[[], bool]) -> str:
    """``slime-strands argv`` in a real process, Ctrl-C (SIGINT) once ``ready()``: exit status 130, no traceback.
    Returns its stderr."""
    tests = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(
        [sys.executable, "-m", "slime_strands.cli", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_foreground,
    )
    try:
        deadline = time.monotonic() + 90  # a safety net for a hung process, not a speed requirement
        while time.monotonic() < deadline and process.poll() is None and not ready():
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    return stderr


def _waiting(server: SGLangTestServer, keys: set[str]) -> bool:
    """Whether a request of each of ``keys`` reached the server."""
    return keys <= {r.headers.get("x-smg-routing-key") for r in server.generate_requests}


def test_interrupted_eval_stops_cleanly_and_resumes(server, data, tmp_path, capsys):
    """Ctrl-C (SIGINT) on a real process while two episodes wait on the server: exit 130, whole lines only,
    and the rerun finishes just those two."""
    out = tmp_path / "traj.jsonl"
    config = write_config(tmp_path / "plugin.yaml")
    for s in range(2):
        server.script("Answer: \\boxed{5}", key=f"0:{s}")
        server.script(
            Turn("Answer: \\boxed{42}", delay_s=120), key=f"1:{s}"
        )  # still running at the interrupt
    argv = eval_argv(
        server.base_url, data, "--n", "2", "--limit", "2", "--config", str(config), "--out", str(out)
    )
    stderr = _interrupt(
        argv, lambda: out.exists() and out.read_text().count("\n") == 2 and _waiting(server, {"1:0", "1:1"})
    )
    assert (
        f"interrupted; finished trajectories are in {out} -- hint: rerun the same command to resume" in stderr
    )
    assert sorted(row.key for row in read_rows(out)) == ["0:0", "0:1"] and out.read_bytes().endswith(b"\n")
    server.script("Answer: \\boxed{42}", key="1:0")
    server.script("Answer: \\boxed{7}", key="1:1")
    code, stdout, _ = run_cli(capsys, *argv)
    assert code == 0 and "2 trajectories generated, 2 resumed" in stdout
    assert _table(stdout)["math"]["accuracy"] == "0.750"


def test_interrupted_before_anything_finished_says_nothing_was_written(server, data, tmp_path):
    """Ctrl-C while every episode still waits on the server: no trajectory finished, and the line says so
    instead of pointing at a file that holds none."""
    out = tmp_path / "traj.jsonl"
    for s in range(2):
        server.script(Turn("Answer: \\boxed{5}", delay_s=120), key=f"0:{s}")
    argv = eval_argv(server.base_url, data, "--n", "2", "--limit", "1", "--out", str(out))
    stderr = _interrupt(argv, lambda: _waiting(server, {"0:0", "0:1"}))
    assert stderr.splitlines()[-1] == (
        f"slime-strands eval: error: interrupted before any trajectory finished: nothing was written to {out} "
        "-- hint: rerun the same command to start again"
    )
    assert not out.exists() or read_rows(out) == []


def _table(stdout: str) -> dict[str, dict[str, str]]:
    """The summary table parsed back (columns are separated by two or more spaces)."""
    import re

    lines = [line for line in stdout.splitlines() if line.strip()]
    header = re.split(r"\s{2,}", lines[0].strip())
    rows = {}
    for line in lines[2:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) == len(header):
            rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def test_eval_without_out_and_reasoning_in_messages(server, data, tmp_path, capsys):
    config = write_config(tmp_path / "plugin.yaml")
    server.script("<think>\nSimple.\n</think>\n\nAnswer: \\boxed{5}", key="0:0")
    code, stdout, stderr = run_cli(
        capsys, *eval_argv(server.base_url, data, "--n", "1", "--limit", "1", "--config", str(config))
    )
    assert code == 0, stderr
    assert "1 trajectories generated, 0 resumed (not saved" in stdout
    assert _table(stdout)["math"]["accuracy"] == "1.000"


def test_eval_writes_messages_tools_and_template_settings(server, data, tmp_path, capsys):
    out = tmp_path / "traj.jsonl"
    config = write_config(tmp_path / "plugin.yaml", enable_thinking=False, system_prompt="Be brief.")
    server.script(CALL_ADD, "<think>\nok\n</think>\n\nAnswer: \\boxed{5}", key="0:0")
    code, _, stderr = run_cli(
        capsys,
        *eval_argv(
            server.base_url,
            data,
            "--n",
            "1",
            "--limit",
            "1",
            "--config",
            str(config),
            "--out",
            str(out),
            "--temperature",
            "0.6",
        ),
    )
    assert code == 0, stderr
    (row,) = read_rows(out)
    check_row(row, server)
    assert row.chat_template_kwargs == {"enable_thinking": False}
    assert [t["function"]["name"] for t in row.tools] == ["add", "echo"]
    roles = [m["role"] for m in row.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert row.messages[0]["content"] == "Be brief."
    assert row.messages[2]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}
    assert row.messages[3]["content"] == "5" and row.messages[4]["reasoning_content"].strip() == "ok"
    sent = server.generate_requests[0].body["sampling_params"]
    assert sent["temperature"] == 0.6 and sent["max_new_tokens"] <= 16384
    assert row.response.endswith("Answer: \\boxed{5}<|im_end|>")
    assert row.prompt_index == 0 and row.sample == 0 and row.label == "5"


@pytest.mark.skipif(sys.platform != "linux", reason="reads wandb's offline run files")
def test_eval_logs_to_wandb_offline(server, data, tmp_path, capsys, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is optional: pip install 'slime-strands[wandb]'")
    from wandb.proto import wandb_internal_pb2

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = write_config(tmp_path / "plugin.yaml")
    server.script("Answer: \\boxed{5}", key="0:0")
    server.script("Answer: \\boxed{6}", key="0:1")
    import wandb

    try:
        code, _, stderr = run_cli(
            capsys,
            *eval_argv(server.base_url, data, "--n", "2", "--limit", "1", "--config", str(config)),
            "--wandb-project",
            "t",
        )
    finally:
        wandb.teardown()  # wandb's service process would live as long as the process that started it (pytest)
    assert code == 0, stderr
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    (table_file,) = run_dir.glob("files/media/table/eval/trajectories_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"][:2] == ["key", "dataset"]
    assert [(r[0], r[5], r[6]) for r in table["data"]] == [
        ("0:0", 1.0, "COMPLETED"),
        ("0:1", 0.0, "COMPLETED"),
    ]
    summary = {}
    for raw in _wandb_records(next(run_dir.glob("run-*.wandb"))):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "summary":
            summary.update(
                {item.key: json.loads(item.value_json) for item in record.summary.update if item.key}
            )
    assert summary["eval/math/accuracy"] == 0.5 and summary["eval/math/pass@2"] == 1.0
    assert summary["eval/math/samples"] == 2.0


def _wandb_records(path: Path):
    """Records of a ``.wandb`` file (LevelDB log format: 32 KiB blocks, chunks with a 7-byte header)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, payload = 7, b""
    while position + 7 <= len(data):
        left = 32768 - position % 32768
        if left < 7:
            position += left
            continue
        _, length, kind = struct.unpack_from("<IHB", data, position)
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            payload = chunk
        elif kind == 3:
            payload += chunk
        elif kind == 4:
            yield payload + chunk
        else:
            return


# -- errors: one line with a hint, a meaningful exit status ---------------------------------------------


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got {lines}"
    assert lines[0].startswith("slime-strands eval: error: ") and " -- hint: " in lines[0]
    return lines[0]


def test_server_unreachable(data, tmp_path, capsys):
    config = write_config(tmp_path / "plugin.yaml")
    code, _, stderr = run_cli(capsys, *eval_argv("http://127.0.0.1:9", data, "--config", str(config)))
    assert code == 3
    line = _one_error_line(stderr)
    assert "cannot reach the SGLang server at http://127.0.0.1:9" in line and "check-server" in line


def test_server_is_checked_before_the_tokenizer_loads(data, tmp_path, capsys):
    """A server that is not there is said before the tokenizer loads (a hub tokenizer takes 12-22 s): with no
    server AND no tokenizer, the error is the server's (exit status 3), not the tokenizer's (2)."""
    argv = eval_argv("http://127.0.0.1:9", data, "--config", str(write_config(tmp_path / "plugin.yaml")))
    argv[argv.index("--tokenizer") + 1] = "/nonexistent/models/Qwen3-8B"
    code, _, stderr = run_cli(capsys, *argv)
    line = _one_error_line(stderr)
    assert code == 3, line
    assert "cannot reach the SGLang server at http://127.0.0.1:9" in line and "tokenizer" not in line


def test_tokenizer_not_found(server, data, capsys):
    argv = eval_argv(server.base_url, data)
    argv[argv.index("--tokenizer") + 1] = "/nonexistent/models/Qwen3-8B"
    code, _, stderr = run_cli(capsys, *argv)
    assert code == 2
    line = _one_error_line(stderr)
    assert "tokenizer '/nonexistent/models/Qwen3-8B' not found" in line and "hub id" in line
    assert [r.path for r in server.requests] == ["/health"], (
        "only /health is asked before the inputs are checked"
    )


def test_tokenizer_folder_without_tokenizer(server, data, tmp_path, capsys):
    empty = tmp_path / "not-a-checkpoint"
    empty.mkdir()
    argv = eval_argv(server.base_url, data)
    argv[argv.index("--tokenizer") + 1] = str(empty)
    code, _, stderr = run_cli(capsys, *argv)
    assert code == 2
    assert f"cannot load a tokenizer from '{empty}'" in _one_error_line(stderr)


def test_bad_data_rows_are_named_by_line(server, tmp_path, capsys):
    data = write_data(
        tmp_path / "bad.jsonl",
        [
            {"prompt": "fine", "label": "1"},
            '{"prompt": "broken", "label": ',
            {"prompt": "no label"},
            "",
            {
                "prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                "label": "3",
            },
            {"prompt": [{"role": "tool", "content": "q"}], "label": "3"},
        ],
    )
    code, _, stderr = run_cli(capsys, *eval_argv(server.base_url, data))
    assert code == 2
    line = _one_error_line(stderr)
    assert f"{data}: 4 bad row(s): line 2: invalid JSON" in line
    assert "line 3: no label" in line and "line 5: the prompt's last message must come from the user" in line
    assert "(and 1 more)" in line and "data_prep.prepare" in line
    assert not server.requests
    code, _, stderr = run_cli(
        capsys, *eval_argv(server.base_url, data, "--limit", "1", "--config", "/nonexistent.yaml")
    )
    assert code == 2 and "/nonexistent.yaml: no such config file" in _one_error_line(stderr), (
        "--limit 1 reads row 1 only"
    )


def test_missing_data_file_and_bad_config(server, tmp_path, data, capsys):
    code, _, stderr = run_cli(capsys, *eval_argv(server.base_url, tmp_path / "nope.jsonl"))
    assert code == 2 and "no such data file" in _one_error_line(stderr)
    code, _, stderr = run_cli(
        capsys, *eval_argv(server.base_url, data, "--out", str(tmp_path / "no" / "t.jsonl"))
    )
    assert code == 2 and "does not exist or is not writable" in _one_error_line(stderr)
    bad = tmp_path / "bad.yaml"
    bad.write_text("strands:\n  max_tool_iter: 3\n")
    code, _, stderr = run_cli(capsys, *eval_argv(server.base_url, data, "--config", str(bad)))
    assert code == 2 and "unknown setting(s) max_tool_iter" in _one_error_line(stderr)
    tool = write_config(tmp_path / "tool.yaml", tools=["rollout_tools.nope"])
    code, _, stderr = run_cli(capsys, *eval_argv(server.base_url, data, "--config", str(tool)))
    assert code == 2 and "module 'rollout_tools' has no attribute 'nope'" in _one_error_line(stderr)
    assert not server.generate_requests


def test_a_config_typo_names_the_settings_file_and_the_check_of_it(server, data, tmp_path, capsys):
    bad = tmp_path / "typo.yaml"
    bad.write_text("strands:\n  max_tool_iter: 3\n")
    code, _, stderr = run_cli(capsys, *eval_argv(server.base_url, data, "--config", str(bad)))
    line = _one_error_line(stderr)
    assert code == 2
    message, hint = line.split(" -- hint: ")
    assert message.startswith(f"slime-strands eval: error: {bad}: unknown setting(s) max_tool_iter"), line
    assert f"slime-strands validate-config {bad}" in hint and "check-template" not in hint, line
    assert not server.generate_requests


def test_ray_not_installed_gets_no_hint_about_settings_checks(server, data, tmp_path, capsys, monkeypatch):
    """The message says the fix (install Ray, or a local sandbox); validate-config and check-template would
    find nothing wrong, so no hint sends the user there."""
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    config = write_config(tmp_path / "plugin.yaml")
    code, _, stderr = run_cli(
        capsys, *eval_argv(server.base_url, data, "--config", str(config), "--sandbox-placement", "ray")
    )
    (line,) = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2
    assert line.startswith("slime-strands eval: error: sandbox.placement: ray needs Ray"), line
    assert "pip install 'slime-strands[ray]'" in line
    assert "validate-config" not in line and "check-template" not in line, line


def test_wandb_not_installed(server, data, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    code, _, stderr = run_cli(capsys, *eval_argv(server.base_url, data, "--wandb-project", "p"))
    assert code == 2
    assert f"--wandb-project needs wandb, which is not installed -- hint: {install_command('wandb')}" in (
        _one_error_line(stderr)
    )


def test_resume_refuses_a_file_of_other_data(server, data, tmp_path, capsys):
    out = tmp_path / "traj.jsonl"
    config = write_config(tmp_path / "plugin.yaml")
    server.script("Answer: \\boxed{5}", key="0:0")
    assert (
        run_cli(
            capsys,
            *eval_argv(
                server.base_url, data, "--n", "1", "--limit", "1", "--config", str(config), "--out", str(out)
            ),
        )[0]
        == 0
    )
    other = write_data(tmp_path / "other.jsonl", [{"prompt": "What is 1 + 1?", "label": "2"}])
    code, _, stderr = run_cli(
        capsys, *eval_argv(server.base_url, other, "--n", "1", "--config", str(config), "--out", str(out))
    )
    assert code == 2
    line = _one_error_line(stderr)
    assert f"{out}:1: holds a trajectory of another prompt at index 0" in line and "new --out" in line


def test_usage_errors(server, data, capsys):
    argv = eval_argv(server.base_url, data)
    argv[argv.index("--base-url") + 1] = "127.0.0.1:30000"
    code, _, stderr = run_cli(capsys, *argv)
    assert code == 2 and "is not an http(s) URL" in _one_error_line(stderr)
    for url, said in (("http://127.0.0.1:30000:", "has no valid port"), ("http://:30000", "has no host")):
        argv[argv.index("--base-url") + 1] = url  # a typo: one line, not the HTTP client's traceback
        code, _, stderr = run_cli(capsys, *argv)
        assert code == 2 and f"--base-url {url!r} {said}" in _one_error_line(stderr)
    with pytest.raises(SystemExit) as exited:
        run_cli(capsys, *eval_argv(server.base_url, data, "--n", "0"))
    assert exited.value.code == 2
    assert "--n: must be at least 1, got 0" in capsys.readouterr().err


# -- sampling params: the config's strands.sampling_params and --sampling-param ---------------------------


def test_sampling_params_of_the_config_and_the_flags_reach_every_turn(server, data, tmp_path, capsys):
    """Precedence: --sampling-param over the config's sampling_params over --temperature / --top-p (a grammar
    replaces a lower level's grammar: SGLang takes one per request); a
    max_new_tokens among them caps each turn while --max-response-len stays the whole response's budget."""
    out = tmp_path / "traj.jsonl"
    config = write_config(
        tmp_path / "plugin.yaml",
        sampling_params={
            "regex": "(.|\\n)*",
            "top_k": 20,
            "stop": ["</answer>"],
            "logit_bias": {"151643": -100.0},
            "temperature": 0.3,
        },
    )
    server.script(CALL_ADD, "The sum is 5.\nAnswer: \\boxed{5}", key="0:0")
    flags = ["--sampling-param", "top_k=5", "--sampling-param", "min_p=0.05"]
    flags += ["--sampling-param", "max_new_tokens=64", "--sampling-param", 'structural_tag="{}"']
    code, _, stderr = run_cli(
        capsys,
        *eval_argv(
            server.base_url, data, "--n", "1", "--limit", "1", "--config", str(config), "--out", str(out),
            "--temperature", "0.9", "--max-response-len", "100", *flags,
        ),
    )  # fmt: skip
    assert code == 0, stderr
    (row,) = read_rows(out)
    check_row(row, server)
    assert row.status == "COMPLETED"
    first, second = (r.body["sampling_params"] for r in server.generate_requests)
    for sent in (first, second):
        assert sent["stop"] == ["</answer>"] and sent["structural_tag"] == "{}"
        assert "regex" not in sent, "the flag's grammar replaces the config's (SGLang takes one)"
        assert sent["logit_bias"] == {"151643": -100.0} and sent["min_p"] == 0.05
        assert sent["top_k"] == 5, "the flag wins over the config"
        assert sent["temperature"] == 0.3, "the config wins over --temperature"
    assert first["max_new_tokens"] == 64, "max_new_tokens caps the turn"
    used = len(server.generate_requests[1].body["input_ids"]) - len(
        server.generate_requests[0].body["input_ids"]
    )
    assert second["max_new_tokens"] == min(64, 100 - used), "the whole response's budget stays in charge"


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("top_k", "--sampling-param 'top_k' is not KEY=JSON"),
        ("stop=[</answer>]", "--sampling-param 'stop=[</answer>]': the value is not JSON"),
        ("regex=a+", "the value is not JSON"),
        ("max_tokens=64", "--sampling-param: 'max_tokens' is not a sampling param SGLang"),
        ("max_new_tokens=0", "--sampling-param.max_new_tokens: must be a positive integer"),
    ],
)
def test_bad_sampling_param_flags_are_one_line(server, data, capsys, flag, says):
    code, _, stderr = run_cli(capsys, *eval_argv(server.base_url, data, "--sampling-param", flag))
    assert code == 2
    assert says in _one_error_line(stderr)
    assert not server.requests, "nothing is sent before the inputs are checked"


def test_an_unknown_key_in_the_configs_sampling_params_is_named(server, data, tmp_path, capsys):
    config = write_config(tmp_path / "plugin.yaml", sampling_params={"top_k": 20, "best_of": 2})
    code, _, stderr = run_cli(capsys, *eval_argv(server.base_url, data, "--config", str(config)))
    assert code == 2
    assert "sampling_params: 'best_of' is not a sampling param SGLang" in _one_error_line(stderr)
    assert not server.requests
