"""``slime-strands eval`` when its server dies mid-run: a real eval process, a real server process killed with
SIGKILL (connections reset, then refused). The eval stops by itself with exit status 3 and one line, keeps the
rows that finished, writes no FAILED row for the episodes in flight, and the rerun runs exactly those."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import (
    check_row,
    cli_env,
    eval_argv,
    read_rows,
    run_cli,
    run_cli_process,
    start_cli,
    write_config,
    write_data,
)
from conftest import qwen3_tokenizer_path

from slime_strands.testing import Fault, SGLangTestServer, Turn

pytestmark = pytest.mark.timeout(240)

ANSWER = "Answer: \\boxed{5}"
HELD = ["1:0", "1:1", "2:0", "2:1"]


def _start_standin() -> subprocess.Popen[str]:
    script = Path(__file__).resolve().parents[1] / "standin_process.py"
    argv = [sys.executable, str(script), "--tokenizer", qwen3_tokenizer_path(), "--answer", ANSWER]
    for key in HELD:
        argv += ["--hold", key]
    return subprocess.Popen(argv, env=cli_env(), stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize(
    ("retries", "delay_s"),
    [
        (60, 1.0),  # the defaults: minutes of retries before an episode would give up
        (1, 0.01),  # episodes give up at once: they end FAILED before the watch notices, and are not written
    ],
)
def test_the_eval_stops_within_seconds_when_its_server_is_killed(
    tokenizer, tmp_path, capsys, retries, delay_s
):
    data = write_data(
        tmp_path / "math.jsonl", [{"prompt": f"What is {i} + 5 - {i}?", "label": "5"} for i in range(3)]
    )
    config = write_config(tmp_path / "plugin.yaml", max_retries=retries, retry_delay_s=delay_s)
    out = tmp_path / "traj.jsonl"
    standin = _start_standin()
    evaluation = None
    try:
        url = standin.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        argv = eval_argv(
            url, data, "--n", "2", "--concurrency", "8", "--config", str(config), "--out", str(out)
        )
        evaluation = start_cli(*argv)
        held = {standin.stdout.readline().split()[-1] for _ in HELD}
        assert held == set(HELD), "every held episode waits on the server"
        while not out.exists() or out.read_text().count("\n") < 2:  # the two quick ones are written
            assert evaluation.poll() is None, evaluation.communicate()
            time.sleep(0.05)
        os.kill(standin.pid, signal.SIGKILL)
        standin.wait()
        _, stderr = evaluation.communicate(timeout=90)  # a safety net: without the watch this takes minutes
    finally:
        for process in (standin, evaluation):
            if process is not None and process.poll() is None:
                process.kill()
                process.communicate()
    assert evaluation.returncode == 3, stderr
    last = stderr.strip().splitlines()[-1]
    assert last == (
        f"slime-strands eval: error: the server at {url} stopped answering (2 trajectories done, rerun to "
        "resume) -- hint: start it again (or see why it died), then rerun the same command: the trajectories "
        "that were running are run again"
    )
    assert "Traceback" not in stderr
    rows = read_rows(out)
    assert sorted(row.key for row in rows) == ["0:0", "0:1"], "no FAILED row for the episodes in flight"
    assert all(row.status == "COMPLETED" and row.reward == 1.0 for row in rows)

    print(stderr)  # shown when the test fails: what a user sees
    with SGLangTestServer(tokenizer, context_length=8192) as server:  # started again, on another port
        server.responder = lambda body, headers: Turn(ANSWER)
        code, stdout, stderr = run_cli(capsys, *_rebase(argv, server.base_url))
        assert code == 0, stderr
        assert "4 trajectories generated, 2 resumed" in stdout
        keys = sorted(r.headers["x-smg-routing-key"] for r in server.generate_requests)
        assert keys == sorted(HELD), "the rerun runs exactly the episodes that were in flight"
        final = {row.key: row for row in read_rows(out)}
        assert len(final) == 6 and all(row.status == "COMPLETED" for row in final.values())
        for key in HELD:
            check_row(final[key], server)


def _rebase(argv, url):
    argv = list(argv)
    argv[argv.index("--base-url") + 1] = url
    return argv


def test_failed_rows_are_grouped_by_cause_and_rerun_is_said_only_where_it_helps(tokenizer, tmp_path):
    """Dropped connections through every retry (the server is alive: the run goes on, the row is written, a
    rerun fixes it) and the server's 400 (a rerun would fail the same way), in a real eval process."""
    data = write_data(
        tmp_path / "math.jsonl", [{"prompt": f"What is {i} + 5 - {i}?", "label": "5"} for i in range(2)]
    )
    config = write_config(tmp_path / "plugin.yaml", max_retries=2, retry_delay_s=0.01)
    out = tmp_path / "traj.jsonl"
    refusal = Fault(400, {"error": {"message": "scripted refusal"}})
    with SGLangTestServer(tokenizer, context_length=8192) as server:
        server.script(*[Fault(drop_connection=True)] * 3, key="0:0")
        server.script(refusal, key="0:1")
        server.script(refusal, key="1:0")
        server.script(ANSWER, key="1:1")
        code, stdout, stderr = run_cli_process(
            *eval_argv(server.base_url, data, "--n", "2", "--config", str(config), "--out", str(out))
        )
        rows = {row.key: row for row in read_rows(out)}
        check_row(rows["1:1"], server)
    assert code == 1, stderr
    assert "4 trajectories generated, 0 resumed" in stdout
    lines = stderr.strip().splitlines()[-3:]
    assert lines[0] == "3 trajectories FAILED:"
    assert lines[1].startswith(
        "  2: the server refused the request (HTTP 400: scripted refusal) (e.g. SGLangHTTPError: SGLang answered "
        "HTTP 400: scripted refusal): a rerun fails the same way"
    )
    assert lines[2].startswith("  1: the server could not be reached") and lines[2].endswith(
        ": a rerun of the same command retries them"
    )
    assert rows["0:0"].status == "FAILED" and rows["0:0"].error.startswith("SGLangConnectionError: ")
    assert rows["1:1"].status == "COMPLETED" and rows["1:1"].reward == 1.0
