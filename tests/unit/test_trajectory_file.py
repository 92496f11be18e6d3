"""The trajectory file: rows read back exactly, malformed rows named by line, a line torn by a kill skipped by
readers and cut off by the next writer."""

from __future__ import annotations

import dataclasses
import json

import pytest

from slime_strands.agent.record import EpisodeRecord, Termination
from slime_strands.cli.errors import CommandError
from slime_strands.cli.trajectory_keys import find_row, latest_rows
from slime_strands.code_grading import CodeVerdict
from slime_strands.trajectories.config_digest import ConfigDigest
from slime_strands.trajectories.file import (
    SCHEMA,
    SavedSegment,
    SavedSpan,
    TrajectoryFileError,
    TrajectoryRow,
    TrajectoryWriter,
    has_torn_tail,
    iter_rows,
    row_key,
)


def make_row(prompt_index: int = 0, sample: int = 0, **changes) -> TrajectoryRow:
    segment = SavedSegment(
        token_ids=[1, 2, 3, 4, 5],
        loss_mask=[0, 0, 1, 1, 0],
        logprobs=[0.0, 0.0, -0.25, -1.5e-7, 0.0],
        spans=[
            SavedSpan("prompt", 0, 2),
            SavedSpan("generated", 2, 4, "stop"),
            SavedSpan("observation", 4, 5),
        ],
    )
    values = dict(
        key=row_key(prompt_index, sample),
        prompt_index=prompt_index,
        sample=sample,
        dataset="d",
        prompt=[{"role": "user", "content": "q ✓"}],
        label="5",
        prompt_digest="abc",
        tokenizer="tok",
        messages=[{"role": "user", "content": "q ✓"}, {"role": "assistant", "content": "a"}],
        segments=[segment],
        response="a",
        reward=1.0,
        status="COMPLETED",
        record=EpisodeRecord(Termination.END_TURN, evaluation=True, turns=1),
        tools=[{"type": "function", "function": {"name": "add"}}],
        chat_template_kwargs={"enable_thinking": False},
        config=ConfigDigest("s" * 16, "p" * 16, "t" * 16, "o" * 16, "m" * 16),
    )
    if "error" in changes:  # the record's
        values["record"] = dataclasses.replace(values["record"], error=changes.pop("error"))
    values.update(changes)
    return TrajectoryRow(**values)


FAILED = CodeVerdict(
    "failed",
    passed=0,
    total=1,
    detail="test 0:\n  assert candidate(3.5) == 0.5\nAssertionError",
    failures=("test 0:\n  assert candidate(3.5) == 0.5\nAssertionError",),
    backend="bwrap",
    duration_s=0.25,
)


def write(path, rows):
    writer = TrajectoryWriter(path)
    for row in rows:
        writer.append(row)
    writer.close()


def test_rows_round_trip_exactly(tmp_path):
    described = dataclasses.replace(make_row().segments[0], info={"kind": "subagent", "name": "solver"})
    rows = [
        make_row(0, 0),
        make_row(0, 1, reward=0.0, error="why \udcff", segments=[described, described]),  # a lone surrogate
        make_row(1, 0, config=None),  # written before rows carried their configuration
        make_row(2, 0, reward=0.0, code=FAILED),  # a code reward's verdict
    ]
    path = tmp_path / "t.jsonl"
    write(path, rows)
    assert [row for _, row in iter_rows(path)] == rows
    assert [number for number, _ in iter_rows(path)] == [1, 2, 3, 4]
    first = json.loads(path.read_text().splitlines()[0])
    assert first["schema"] == SCHEMA and first["key"] == "0:0" and "q ✓" in path.read_text()
    assert first["config"] == {
        "settings": "s" * 16,
        "sampling": "p" * 16,
        "tokenizer": "t" * 16,
        "tools": "o" * 16,
        "model": "m" * 16,
    }
    assert find_row(path, "-2")[1] == rows[2] and find_row(path, "0:0") == (1, rows[0])
    assert first["code"] is None and find_row(path, "2:0")[1].code == FAILED
    assert rows[0].correct and not rows[1].correct


def test_a_row_holds_the_typed_episode_record(tmp_path):
    record = EpisodeRecord(
        Termination.TOOL_LIMIT, evaluation=True, turns=3, tool_calls=2, parse_errors={"bad_json": 1}
    )
    data = make_row(record=record).to_json()
    assert (data["termination"], data["metrics"]["turns"], data["metrics"]["parse_errors"]) == (
        "tool_limit",
        3,
        {"bad_json": 1},
    )
    data["metrics"]["counted_by_a_later_version"] = 7  # a newer writer's counter: read, not refused
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(data) + "\n")
    ((_, row),) = iter_rows(path)
    assert row.record == record and row.termination == "tool_limit" and row.error is None
    assert row.record.tool_calls == 2 and sum(row.record.parse_errors.values()) == 1


def test_a_torn_last_line_is_skipped_then_cut(tmp_path):
    path = tmp_path / "t.jsonl"
    write(path, [make_row(0, 0)])
    whole = path.read_bytes()
    path.write_bytes(whole + whole[:40])  # killed while writing the second line
    assert has_torn_tail(path)
    assert [row.key for _, row in iter_rows(path)] == ["0:0"]
    write(path, [make_row(0, 1)])
    assert not has_torn_tail(path)
    assert [row.key for _, row in iter_rows(path)] == ["0:0", "0:1"]
    assert path.read_bytes().startswith(whole) and path.read_bytes().count(b"\n") == 2


def test_cutting_a_torn_line_longer_than_the_read_chunk(tmp_path):
    path = tmp_path / "t.jsonl"
    write(path, [make_row(0, 0)])
    good = path.read_bytes()
    path.write_bytes(good + b"x" * 200_000)  # a huge half-written row
    write(path, [])
    assert path.read_bytes() == good
    path.write_bytes(b"y" * 70_000)  # only a torn line
    write(path, [])
    assert path.read_bytes() == b""


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema="v0"), "schema is 'v0'"),
        (lambda d: d.pop("label"), "row: 'label' missing"),
        (lambda d: d["segments"][0]["loss_mask"].pop(), "5 token_ids, 4 loss_mask and 5 logprobs differ"),
        (lambda d: d["segments"][0]["spans"].pop(), "spans cover 4 of 5 tokens"),
        (lambda d: d["segments"][0]["spans"][1].update(start=3), "spans must cover the tokens in order"),
        (lambda d: d.update(sample="1"), "sample must be an integer"),
        (lambda d: d["metrics"].update(turns="2"), "turns must be an integer"),
        (lambda d: d.update(termination="done"), "unknown termination 'done'"),
        (lambda d: d.update(metrics=[1]), "metrics must be an object"),
        (lambda d: d.update(code={"status": "failed", "failures": []}), "code: 'passed' missing"),
        (lambda d: d.update(code=FAILED.to_metadata() | {"failures": [1]}), "failures must be strings"),
    ],
)
def test_malformed_rows_are_named_by_line(tmp_path, mutate, message):
    data = make_row().to_json()
    mutate(data)
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(make_row().to_json()) + "\n" + json.dumps(data) + "\n")
    with pytest.raises(TrajectoryFileError, match="not a trajectory row") as raised:
        list(iter_rows(path))
    assert str(raised.value).startswith(f"{path}:2: ") and message in str(raised.value)
    assert "slime-strands eval --out" in raised.value.hint


def test_rows_are_found_by_key_not_by_line(tmp_path):
    """Lines come in completion order, a retried key twice: --index names the key, its later line wins."""
    path = tmp_path / "t.jsonl"
    failed = make_row(
        0,
        1,
        status="FAILED",
        record=EpisodeRecord(Termination.FAILED, evaluation=True),
        segments=[],
        messages=[],
    )
    retried = make_row(0, 1, reward=0.0)
    write(path, [make_row(2, 0), failed, make_row(0, 0), make_row(10, 1), retried])
    assert [row.key for _, row in latest_rows(path)] == ["0:0", "0:1", "2:0", "10:1"], "numeric key order"
    assert find_row(path) == (3, make_row(0, 0)), "the first key by default"
    assert find_row(path, "0:1") == (5, retried) and find_row(path, "2") == (1, make_row(2, 0))
    assert find_row(path, "-1")[1].key == "10:1" and find_row(path, "-4")[1].key == "0:0"
    written_otherwise = tmp_path / "sorted-keys.jsonl"  # a key the writer did not put first is still found
    written_otherwise.write_text(json.dumps(retried.to_json(), sort_keys=True) + "\n")
    assert find_row(written_otherwise, "0:1") == (1, retried)


def test_find_row_errors(tmp_path):
    path = tmp_path / "t.jsonl"
    write(path, [make_row(0, 0), make_row(1, 0)])
    with pytest.raises(CommandError, match="no trajectory with key 2:0: the file holds keys 0:0 to 1:0 "):
        find_row(path, "2")
    with pytest.raises(CommandError, match="no trajectory at --index -3"):
        find_row(path, "-3")
    with pytest.raises(CommandError, match="'1/2' is not a row key"):
        find_row(path, "1/2")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(CommandError) as raised:
        find_row(empty, "0")
    assert "no trajectories" in str(raised.value) and "run `slime-strands eval" in raised.value.hint
    with pytest.raises(TrajectoryFileError, match="no such trajectory file"):
        find_row(tmp_path / "missing.jsonl", "0")


def test_a_failed_episode_row_holds_no_tokens_and_a_bounded_error():
    """An episode that generated nothing has no trajectory: its row holds the prompt once, no tokens, and at
    most ERROR_CHARS of the error (a server's error body can echo a whole request)."""
    from slime_strands.agent.record import EpisodeRecord, Termination
    from slime_strands.cli.eval.data import EvalPrompt
    from slime_strands.cli.eval.rows import ERROR_CHARS, episode_row
    from slime_strands.provider.token_manager import TokenManager

    prompt_only = TokenManager()
    prompt_only.add_prompt(list(range(50_000)))
    error = "SGLangHTTPError: SGLang answered HTTP 422: " + "input_ids " * 5_000
    record = EpisodeRecord(
        Termination.FAILED,
        evaluation=True,
        error=error,
        trajectory=prompt_only,
        system_prompt="Be brief.",
        messages=[{"role": "user", "content": [{"text": "q"}]}],
    )
    prompt = EvalPrompt(index=0, line=1, prompt=[{"role": "user", "content": "q"}], label="1", dataset="d")
    config = ConfigDigest("s" * 16, "p" * 16, "t" * 16, "o" * 16, "m" * 16)
    row = episode_row(
        prompt, 0, record, 0.0, tokenizer="tok", tools=None, chat_template_kwargs={}, config=config
    )
    assert row.segments == [] and row.messages == [] and row.prompt == prompt.prompt
    assert (
        len(row.error) <= ERROR_CHARS + 60
        and row.error.startswith(error[:100])
        and row.error.endswith(error[-100:])
    )
    assert "characters cut" in row.error
    assert len(json.dumps(row.to_json())) < 2 * ERROR_CHARS
