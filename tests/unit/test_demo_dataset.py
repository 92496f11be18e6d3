"""``python -m data_prep.prepare --dataset demo``: a few arithmetic problems built in, written offline in
dapo-math-17k's row format, with labels that are the problems' true answers."""

from __future__ import annotations

import json
import sys

from data_prep import prepare as dp
from data_prep.demo import DAPO_PROMPT, PROBLEMS
from slime_strands.testing.math_policy import read_expression


def test_demo_is_written_offline_in_dapo_format(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "datasets", None)  # no hub library: importing it would fail
    out = tmp_path / "demo.jsonl"
    assert dp.main(["--dataset", "demo", "--out", str(out)]) == 0
    assert "wrote 8" in capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(PROBLEMS) == 8
    for row, (problem, answer) in zip(rows, PROBLEMS, strict=True):
        assert row == {
            "prompt": [{"role": "user", "content": DAPO_PROMPT.format(problem=problem)}],
            "label": str(answer),
        }
        assert row["prompt"][0]["content"].startswith("Solve the following math problem step by step.")
    assert dp.main(["--dataset", "demo", "--out", str(out), "--limit", "3"]) == 0
    assert len(out.read_text().splitlines()) == 3


def test_every_label_is_the_true_answer():
    """Each label is the value of the problem's arithmetic (computed here by Python, independently of the demo
    policy); the word problem is the one the policy cannot read."""
    unreadable = []
    for problem, answer in PROBLEMS:
        expression = read_expression(problem)
        if expression is None:
            unreadable.append(problem)
            continue
        assert eval(expression, {"__builtins__": {}}) == answer, problem  # literals and operators only
    assert unreadable == [PROBLEMS[-1][0]]
    assert PROBLEMS[-1][1] == 60 * 3 + 45 * 2
