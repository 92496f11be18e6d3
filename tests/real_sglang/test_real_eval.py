"""``slime-strands eval`` end to end against the REAL server, and issue 24's defect 3: grammar sampling params
from the plugin settings (``strands: {sampling_params: {...}}``) and from ``--sampling-param KEY=JSON``.

Every row's tokens are checked against what the server saw and answered for its episode (routing key = row key).
"""

from __future__ import annotations

import json

import pytest
from cli_helpers import check_row, eval_argv, latest, read_rows, run_cli, write_config, write_data

from real_sglang.real_helpers import ANSWER, CALL_ADD, literal, one_of

pytestmark = [pytest.mark.real_sglang, pytest.mark.timeout(600)]


@pytest.fixture
def data(tmp_path):
    return write_data(
        tmp_path / "math.jsonl",
        [
            {"prompt": [{"role": "user", "content": "What is 2 + 3?"}], "label": "5"},
            {"prompt": "What is 1 + 4?", "label": "5", "metadata": {"dataset": "other"}},
        ],
    )


def run_eval(capsys, proxy, data, tmp_path, *extra: str, **settings):
    out = tmp_path / "traj.jsonl"
    config = write_config(tmp_path / "plugin.yaml", max_tool_iters=2, **settings)
    code, stdout, stderr = run_cli(
        capsys,
        *eval_argv(proxy.base_url, data, "--n", "2", "--temperature", "0", "--config", str(config)),
        "--out",
        str(out),
        *extra,
    )
    assert code == 0, stderr
    rows = latest(read_rows(out))
    assert sorted(rows) == ["0:0", "0:1", "1:0", "1:1"], stdout
    for row in rows.values():
        check_row(row, proxy)
    return rows, stdout


def test_eval_with_a_regex_in_the_plugin_settings(proxy, data, tmp_path, capsys):
    """The settings' grammar makes the model call the tool, then the limit ends each episode (TRUNCATED)."""
    rows, stdout = run_eval(capsys, proxy, data, tmp_path, sampling_params={"regex": literal(CALL_ADD)})
    for row in rows.values():
        assert (row.status, row.termination) == ("TRUNCATED", "tool_limit"), row.key
        assert row.record.tool_calls == 2 and row.record.turns == 3
    assert all(e.body["sampling_params"]["regex"] == literal(CALL_ADD) for e in proxy.generations())
    assert "math" in stdout and "other" in stdout


def test_eval_with_sampling_params_on_the_command_line(proxy, data, tmp_path, capsys):
    """``--sampling-param`` takes any key the server accepts as JSON: a grammar for the answer, and a stop list."""
    rows, _ = run_eval(
        capsys,
        proxy,
        data,
        tmp_path,
        "--sampling-param",
        "regex=" + json.dumps(literal(ANSWER)),
        "--sampling-param",
        "stop_token_ids=[151643]",
    )
    for row in rows.values():
        assert (row.status, row.termination, row.reward) == ("COMPLETED", "end_turn", 1.0), row.key
    for exchange in proxy.generations():
        params = exchange.body["sampling_params"]
        assert params["regex"] == literal(ANSWER) and 151643 in params["stop_token_ids"], params
        assert params["temperature"] == 0.0


def test_eval_grammar_with_a_tool_call_or_an_answer(proxy, data, tmp_path, capsys):
    """A grammar that allows either: whichever the model writes, the episode is exact and ends cleanly."""
    rows, _ = run_eval(capsys, proxy, data, tmp_path, sampling_params={"regex": one_of(CALL_ADD, ANSWER)})
    for row in rows.values():
        assert row.status in ("COMPLETED", "TRUNCATED") and row.termination in ("end_turn", "tool_limit"), row
        assert row.record.parse_errors == {}, row.record


def test_eval_unconstrained_random_model(proxy, data, tmp_path, capsys):
    """No grammar: the random-weight model writes arbitrary ids (special tokens, broken UTF-8, stray tags).
    Every row is exact and ends in a valid status; only the server's answers were trained on."""
    out = tmp_path / "traj.jsonl"
    config = write_config(tmp_path / "plugin.yaml", max_tool_iters=2)
    argv = eval_argv(proxy.base_url, data, "--n", "2", "--config", str(config), "--max-response-len", "96")
    code, stdout, stderr = run_cli(capsys, *argv, "--out", str(out))
    rows = latest(read_rows(out))
    assert sorted(rows) == ["0:0", "0:1", "1:0", "1:1"], stdout + stderr
    for row in rows.values():
        assert row.status in ("COMPLETED", "TRUNCATED"), (row.key, row.status, row.termination, row.error)
        check_row(row, proxy)
    assert code == 0, stderr
