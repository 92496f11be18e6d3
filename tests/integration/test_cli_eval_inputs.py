"""``slime-strands eval`` refuses inputs that would fail every request before it sends one: sampling values
SGLang refuses, prompts longer than the server's window, a misspelled plugin section. Real processes, the
real Qwen3 tokenizer, the SGLang-protocol test server over HTTP."""

from __future__ import annotations

import pytest
from cli_helpers import error_line, eval_argv, run_cli, run_cli_process, write_config, write_data

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
