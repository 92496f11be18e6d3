"""Resuming ``slime-strands eval --out``: rows of another configuration are refused (one line naming what
differs), never reported as the new run's; what does not change a trajectory (the base URL, the tokenizer's
path, retries, --n, --concurrency) resumes. The real Qwen3 tokenizer, real HTTP to the test server."""

from __future__ import annotations

import json

import pytest
from cli_helpers import (
    check_row,
    error_line,
    eval_argv,
    read_rows,
    run_cli,
    run_cli_process,
    write_config,
    write_data,
)
from conftest import qwen3_tokenizer_path

from slime_strands.testing import SGLangTestServer, Turn

pytestmark = pytest.mark.timeout(180)

ANSWERS = ["5", "42"]


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=8192) as srv:
        srv.responder = _answer
        yield srv


def _answer(body, headers):
    """Every episode answers its prompt's label (prompt index = the routing key's first part)."""
    return Turn(f"Answer: \\boxed{{{ANSWERS[int(headers['x-smg-routing-key'].split(':')[0])]}}}")


@pytest.fixture
def data(tmp_path):
    return write_data(
        tmp_path / "math.jsonl",
        [{"prompt": "What is 2 + 3?", "label": "5"}, {"prompt": "What is 6 * 7?", "label": "42"}],
    )


@pytest.fixture
def first_run(server, data, tmp_path, capsys):
    """A finished eval: 2 prompts x 2 samples with the test tools."""
    out = tmp_path / "traj.jsonl"
    config = write_config(tmp_path / "plugin.yaml")
    argv = eval_argv(server.base_url, data, "--n", "2", "--config", str(config), "--out", str(out))
    code, stdout, stderr = run_cli(capsys, *argv)
    assert code == 0 and "4 trajectories generated, 0 resumed" in stdout, stderr
    for row in read_rows(out):
        check_row(row, server)
    return out, config, argv


def _refused(capsys, argv, server, out, what):
    sent = len(server.generate_requests)
    before = out.read_bytes()
    code, stdout, stderr = run_cli(capsys, *argv)
    assert code == 2, stdout + stderr
    line = error_line(stderr, "eval")
    assert f"{out}:1: was written with other settings: {what}" in line and " differ -- hint: " in line, line
    assert "rerun with the settings that wrote it to resume, or write to a new --out file" in line
    assert len(server.generate_requests) == sent and out.read_bytes() == before, (
        "nothing run, nothing written"
    )
    return line


def _swap(argv, flag, value):
    argv = list(argv)
    argv[argv.index(flag) + 1] = value
    return argv


def test_another_temperature_is_refused_in_a_real_process(first_run, server):
    out, _, argv = first_run
    code, stdout, stderr = run_cli_process(*argv, "--temperature", "0.6")
    assert code == 2, stdout + stderr
    line = error_line(stderr, "eval")
    assert f"{out}:1: was written with other settings: the sampling params (--temperature" in line
    assert "the plugin settings" not in line and "the tokenizer" not in line, "only what differs"
    assert "or write to a new --out file" in line
    assert len(read_rows(out)) == 4


def test_each_part_of_the_configuration_is_named(first_run, server, tokenizer, tmp_path, capsys):
    out, _, argv = first_run
    _refused(capsys, [*argv, "--sampling-param", "top_k=20"], server, out, "the sampling params")
    _refused(capsys, [*argv, "--max-response-len", "2048"], server, out, "the sampling params")
    other = write_config(tmp_path / "other.yaml", max_tool_iters=2)
    _refused(capsys, _swap(argv, "--config", str(other)), server, out, "the plugin settings (--config)")
    fewer = write_config(tmp_path / "fewer.yaml", tools=["rollout_tools.add"])
    _refused(capsys, _swap(argv, "--config", str(fewer)), server, out, "the tools (strands.tools)")
    template = tmp_path / "other-template"
    changed = type(tokenizer).from_pretrained(qwen3_tokenizer_path())
    changed.chat_template = tokenizer.chat_template.replace("<|im_start|>system", "<|im_start|>system\n")
    changed.save_pretrained(template)
    line = _refused(
        capsys, _swap(argv, "--tokenizer", str(template)), server, out, "the tokenizer or its chat template"
    )
    assert "the plugin settings" not in line
    with SGLangTestServer(tokenizer, context_length=8192, model_path="Qwen/Qwen3-4B") as another:
        _refused(capsys, _swap(argv, "--base-url", another.base_url), another, out, "the served model")


def test_what_does_not_change_a_trajectory_resumes(first_run, server, tokenizer, tmp_path, capsys):
    """Another base URL for the same model, a copy of the tokenizer elsewhere, other retries and concurrency:
    the rows are resumed; a larger --n adds samples."""
    out, _, argv = first_run
    copy = tmp_path / "tokenizer-copy"
    type(tokenizer).from_pretrained(qwen3_tokenizer_path()).save_pretrained(copy)
    retries = write_config(tmp_path / "retries.yaml", max_retries=5, retry_delay_s=0.5, request_timeout_s=60)
    with SGLangTestServer(tokenizer, context_length=8192) as same_model:
        same_model.responder = _answer
        rerun = _swap(
            _swap(_swap(argv, "--base-url", same_model.base_url), "--tokenizer", str(copy)),
            "--config",
            str(retries),
        )
        code, stdout, stderr = run_cli(capsys, *rerun, "--concurrency", "3")
        assert code == 0 and "0 trajectories generated, 4 resumed" in stdout, stderr
        code, stdout, stderr = run_cli(capsys, *_swap(rerun, "--n", "3"))
        assert code == 0 and "2 trajectories generated, 4 resumed" in stdout, stderr
        rows = read_rows(out)
        assert sorted(r.key for r in rows) == ["0:0", "0:1", "0:2", "1:0", "1:1", "1:2"]
        for row in rows[4:]:
            check_row(row, same_model)
        assert len({row.config for row in rows}) == 1, "one configuration in the file"


def test_rows_without_a_digest_are_refused(first_run, server, capsys):
    out, _, argv = first_run
    lines = out.read_text().splitlines()
    assert all(
        set(json.loads(line)["config"]) == {"settings", "sampling", "tokenizer", "tools", "model"}
        for line in lines
    )
    old = [json.dumps({k: v for k, v in json.loads(line).items() if k != "config"}) for line in lines]
    out.write_text("\n".join(old) + "\n")
    code, _, stderr = run_cli(capsys, *argv)
    assert code == 2
    line = error_line(stderr, "eval")
    assert f"{out}:1: has rows without a configuration digest (written by an older slime-strands)" in line
    assert "new --out" in line
