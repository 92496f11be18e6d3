"""``slime-strands eval`` refuses inputs that would fail every request before it sends one: sampling values
SGLang refuses, prompts longer than the server's window, a misspelled plugin section. Real processes, the
real Qwen3 tokenizer, the SGLang-protocol test server over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

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

from slime_strands.testing import SGLangTestServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=4096) as srv:
        yield srv


@pytest.fixture
def data(tmp_path):
    return write_data(tmp_path / "math.jsonl", [{"prompt": "What is 2 + 3?", "label": "5"}])


def test_a_negative_temperature_is_refused_before_any_request(server, data, tmp_path):
    config = write_config(tmp_path / "plugin.yaml")
    code, stdout, stderr = run_cli_process(
        *eval_argv(server.base_url, data, "--config", str(config), "--temperature", "-1")
    )
    assert code == 2, stderr
    line = error_line(stderr, "eval")
    assert "--temperature: must be a number >= 0 (0 is greedy), got -1.0" in line
    assert not server.requests and stdout == ""


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--top-p", "0"], "--top-p: must be a number in (0, 1], got 0.0"),
        (["--top-p", "1.5"], "--top-p: must be a number in (0, 1], got 1.5"),
        (["--temperature", "nan"], "--temperature: must be a number >= 0 (0 is greedy), got nan"),
        (["--sampling-param", "top_k=0"], "--sampling-param top_k: must be -1 or an integer >= 1"),
        (["--sampling-param", "top_k=2.5"], "--sampling-param top_k: must be -1 or an integer >= 1"),
        (["--sampling-param", "min_p=1.5"], "--sampling-param min_p: must be a number in [0, 1], got 1.5"),
        (
            ["--sampling-param", 'min_p="low"'],
            "--sampling-param min_p: must be a number in [0, 1], got 'low'",
        ),
        (["--sampling-param", "repetition_penalty=0"], "repetition_penalty: must be a number in (0, 2]"),
        (
            ["--sampling-param", "min_new_tokens=50", "--sampling-param", "max_new_tokens=10"],
            "--sampling-param min_new_tokens: must be at most max_new_tokens (10), got 50",
        ),
    ],
)
def test_out_of_range_sampling_flags_are_one_line(server, data, tmp_path, capsys, flags, says):
    config = write_config(tmp_path / "plugin.yaml")
    code, _, stderr = run_cli(capsys, *eval_argv(server.base_url, data, "--config", str(config), *flags))
    assert code == 2
    assert says in error_line(stderr, "eval")
    assert not server.requests


def test_an_out_of_range_value_in_the_configs_sampling_params_names_the_file(server, data, tmp_path, capsys):
    config = write_config(tmp_path / "plugin.yaml", sampling_params={"top_k": 20, "presence_penalty": 3})
    code, _, stderr = run_cli(capsys, *eval_argv(server.base_url, data, "--config", str(config)))
    assert code == 2
    line = error_line(stderr, "eval")
    assert f"{config}: strands.sampling_params.presence_penalty: must be a number in [-2, 2], got 3" in line
    assert not server.requests


def test_values_at_the_edges_of_the_ranges_run(server, data, tmp_path, capsys):
    config = write_config(tmp_path / "plugin.yaml", sampling_params={"top_k": -1, "min_p": 0})
    server.script("Answer: \\boxed{5}", key="0:0")
    code, _, stderr = run_cli(
        capsys,
        *eval_argv(
            server.base_url, data, "--n", "1", "--config", str(config), "--temperature", "0", "--top-p", "1"
        ),
    )
    assert code == 0, stderr
    sent = server.generate_requests[0].body["sampling_params"]
    assert (sent["temperature"], sent["top_p"], sent["top_k"], sent["min_p"]) == (0.0, 1.0, -1, 0)


def test_a_misspelt_section_stops_the_eval_instead_of_running_the_defaults(server, data, tmp_path):
    config = tmp_path / "plugin.yaml"
    config.write_text("strand:\n  tools: [rollout_tools.add]\n  max_tool_iters: 1\n")
    code, _, stderr = run_cli_process(*eval_argv(server.base_url, data, "--config", str(config)))
    assert code == 2, stderr
    assert f"{config}: unknown top-level key 'strand': did you mean 'strands'?" in error_line(stderr, "eval")
    assert not server.requests


# -- prompts longer than the window ------------------------------------------------------------------------


def _rendered_tokens(tokenizer, prompt: str) -> int:
    """What the episode's first request holds, computed here with the tokenizer's own chat template."""
    from slime_strands.agent.runtime import import_tools
    from slime_strands.cli.eval.rows import template_tools
    from slime_strands.settings import PluginSettings

    settings = PluginSettings(tools=("rollout_tools.add", "rollout_tools.echo"))
    messages = [{"role": "system", "content": settings.system_prompt}, {"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(
        messages, tools=template_tools(import_tools(settings)), tokenize=False, add_generation_prompt=True
    )
    return len(tokenizer.encode(text, add_special_tokens=False))


def test_a_prompt_longer_than_the_window_is_refused_before_any_request(server, tmp_path):
    huge = "Add these numbers: " + " ".join(str(i % 97) for i in range(1_000_000))  # ~3.5 MB
    data = write_data(
        tmp_path / "mixed.jsonl",
        [
            {"prompt": "What is 2 + 3?", "label": "5"},
            {"prompt": huge, "label": "1"},
            {"prompt": "1 + 1?", "label": "2"},
        ],
    )
    out = tmp_path / "traj.jsonl"
    config = write_config(tmp_path / "plugin.yaml")
    code, _, stderr = run_cli_process(
        *eval_argv(server.base_url, data, "--n", "4", "--config", str(config), "--out", str(out))
    )
    assert code == 2, stderr
    line = error_line(stderr, "eval")
    window = server.context_length - 6  # SGLang's scheduler keeps 6 tokens of the window
    assert (
        f"{data}: 1 prompt(s) leave no room to generate in the {window} tokens a trajectory may hold: line 2 ("
        in line
    )
    assert "--context-length" in line
    assert not server.generate_requests and not out.exists(), "nothing sent, nothing written"


@pytest.mark.parametrize("room", [1, 0])
def test_the_window_is_checked_to_the_token(tokenizer, tmp_path, capsys, room):
    """A prompt with room for exactly one generated token runs (cut by the window); one token more is refused."""
    prompt = "What is 2 + 3? " * 50
    window = _rendered_tokens(tokenizer, prompt) + room
    data = write_data(tmp_path / "math.jsonl", [{"prompt": prompt, "label": "5"}])
    config = write_config(tmp_path / "plugin.yaml")
    out = tmp_path / "traj.jsonl"
    with SGLangTestServer(tokenizer, context_length=window + 6) as srv:
        srv.script("Answer: \\boxed{5}", key="0:0")
        code, _, stderr = run_cli(
            capsys, *eval_argv(srv.base_url, data, "--n", "1", "--config", str(config), "--out", str(out))
        )
        if room:
            assert code == 0, stderr
            (row,) = read_rows(out)
            check_row(row, srv)
            assert row.status == "TRUNCATED" and row.termination == "context_full"
            assert len(row.segments[0]) == window and row.record.generated_tokens == 1
        else:
            assert code == 2 and f"line 1 ({window} tokens)" in error_line(stderr, "eval")
            assert not srv.generate_requests


def test_a_row_holds_no_more_than_its_trajectory(tokenizer, tmp_path, capsys):
    """A server that reports no window refuses the too-long prompt itself: the FAILED row holds the prompt once
    and no tokens (nothing was generated), not the prompt's tokens with a zero mask and zero logprobs."""
    prompt = "Add these numbers: " + " ".join(str(i % 97) for i in range(20_000))
    data = write_data(tmp_path / "long.jsonl", [{"prompt": prompt, "label": "1"}])
    config = write_config(tmp_path / "plugin.yaml")
    out = tmp_path / "traj.jsonl"
    with SGLangTestServer(tokenizer, context_length=4096, report_window=False) as srv:
        code, _, stderr = run_cli(
            capsys, *eval_argv(srv.base_url, data, "--n", "2", "--config", str(config), "--out", str(out))
        )
        assert srv.generate_requests, "the server was asked, and refused"
    assert code == 1, stderr
    for line in out.read_text().splitlines():
        row = json.loads(line)
        assert row["status"] == "FAILED" and row["error"] == "no token generated (context_full)"
        assert len(line) < len(prompt) + 4000, "the prompt once, and a few fields"
        assert row["segments"] == [] and row["messages"] == []
    assert "the prompt left no room to generate (context_full)" in stderr
    assert "a rerun fails the same way" in stderr


def test_the_wandb_hint_matches_the_install(server, data, tmp_path):
    """Without wandb, the hint is the pip command for THIS install: ``pip install -e '<clone>[wandb]'`` for
    the README's editable install (a plain ``pip install 'slime-strands[wandb]'`` would fetch another copy),
    even with the clone's own ``*.egg-info`` (no PEP 610 record) first on the path, as it is when run there."""
    missing = tmp_path / "site"
    (missing / "wandb").mkdir(parents=True)
    (missing / "wandb" / "__init__.py").write_text("raise ImportError('No module named wandb')\n")
    code, _, stderr = run_cli_process(
        *eval_argv(server.base_url, data, "--wandb-project", "p"), path=[missing]
    )
    assert code == 2, stderr
    hint = f"pip install -e '{Path(__file__).resolve().parents[2]}[wandb]'"  # the eval runs from this clone
    assert f"--wandb-project needs wandb, which is not installed -- hint: {hint} (or drop" in error_line(
        stderr, "eval"
    )
    assert not server.requests
