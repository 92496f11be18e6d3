"""Eval prompts: data_prep's JSONL, every bad row named by its line before anything runs."""

from __future__ import annotations

import json
import re

import pytest

from slime_strands.cli.errors import CommandError
from slime_strands.cli.eval.data import load_prompts


def write(tmp_path, *rows, name="aime-2024.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_reads_data_prep_rows(tmp_path):
    path = write(
        tmp_path,
        {"prompt": [{"role": "user", "content": "Find x."}], "label": "34", "metadata": {"year": 2024}},
        "",
        {"prompt": "Plain string prompt", "label": 7, "dataset": "dapo"},
        {
            "prompt": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
            ],
            "label": "1/2",
            "metadata": {"source": "math"},
        },
    )
    first, second, third = load_prompts(path)
    assert (first.index, first.line, first.label, first.dataset) == (0, 1, "34", "aime-2024")
    assert first.metadata == {"year": 2024}
    assert (second.index, second.line, second.prompt, second.dataset) == (
        1,
        3,
        [{"role": "user", "content": "Plain string prompt"}],
        "dapo",
    )
    assert third.dataset == "math" and third.label == "1/2", "labels need not be integers in eval"
    assert first.digest != second.digest and first.digest == load_prompts(path)[0].digest
    assert [p.index for p in load_prompts(path, limit=2)] == [0, 1]


def test_bad_rows_are_all_reported(tmp_path):
    path = write(
        tmp_path,
        {"prompt": "ok", "label": "1"},
        "[1, 2",
        {"label": "1"},
        {"prompt": [{"role": "tool", "content": "x"}, {"role": "user", "content": "q"}], "label": "1"},
        {"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "label": "1"},
        {"prompt": "q", "label": None},
    )
    with pytest.raises(CommandError) as raised:
        load_prompts(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: 5 bad row(s): line 2: invalid JSON (")
    assert "line 3: no prompt" in message and "line 4: message 0 has role 'tool'" in message
    assert "(and 2 more)" in message and "\n" not in message
    assert "data_prep.prepare" in raised.value.hint
    assert len(load_prompts(path, limit=1)) == 1, "rows past --limit are not read"


def test_broken_json_names_the_column_once(tmp_path):
    """An unterminated string is named at the column of its opening quote, in words read once (json's own
    text ends with "starting at"; the row's message adds "at column N")."""
    raw = '{"label": "1", "prompt": "What is 2 + 2?'
    column = raw.index('"What') + 1  # 1-based, as an editor shows it
    path = write(tmp_path, {"prompt": "fine", "label": "1"}, raw, '{"prompt": }')
    with pytest.raises(CommandError) as raised:
        load_prompts(path)
    message = str(raised.value)
    assert f"line 2: invalid JSON (Unterminated string starting at column {column})" in message, message
    assert "line 3: invalid JSON (Expecting value at column 12)" in message, message
    assert not re.search(r"\b(\w+) \1\b", message.removeprefix(str(path))), f"a doubled word: {message}"


def test_missing_unreadable_and_empty_files(tmp_path):
    with pytest.raises(CommandError, match="no such data file") as raised:
        load_prompts(tmp_path / "nope.jsonl")
    assert "python -m data_prep.prepare" in raised.value.hint
    binary = tmp_path / "data.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CommandError, match="cannot read the data file"):
        load_prompts(binary)
    with pytest.raises(CommandError, match="no rows"):
        load_prompts(write(tmp_path, "", name="empty.jsonl"))
