"""The slime-strands command: template probe, settings validation, server check."""

from __future__ import annotations

import copy
import re

import pytest
from conftest import qwen3_tokenizer_path
from family_kit import family_tokenizer

from slime_strands.cli import main
from slime_strands.testing import SGLangTestServer


def test_check_template_accepts_qwen3(capsys):
    assert main(["check-template", qwen3_tokenizer_path()]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok\n") == 3
    assert out.count("family: Qwen2.5 / Qwen3 / Hermes") == 3
    assert "tool parser: hermes (the chat template renders tool calls in this format)" in out
    assert "end of turn: closing token ('<|im_end|>')" in out
    assert "token-in/token-out: safe" in out


@pytest.mark.parametrize(
    ("name", "parser", "end"),
    [
        ("glm45", "glm45", "end of turn: next role tag ('<|user|>', '<|observation|>')"),
        ("deepseekv31", "deepseekv31", "end of turn: closing token ('<｜end▁of▁sentence｜>')"),
        ("llama3", "llama3", "end of turn: closing token ('<|eot_id|>')"),
    ],
)
def test_check_template_reports_each_family(tmp_path, capsys, name, parser, end):
    family_tokenizer(name).save_pretrained(tmp_path)
    assert main(["check-template", str(tmp_path), "--enable-thinking", "none"]) == 0
    out = capsys.readouterr().out
    assert f"tool parser: {parser} (" in out and end in out and "token-in/token-out: safe" in out
    if name == "llama3":  # SGLang stops on it for every tokenizer that has it
        assert "end of sequence: '<|eom_id|>' (also end a turn)" in out


def test_check_template_says_why_no_parser_fits(tokenizer, tmp_path, capsys):
    unknown = copy.deepcopy(tokenizer)
    unknown.chat_template = tokenizer.chat_template.replace("<tool_call>", "[TOOL_CALLS]").replace(
        "</tool_call>", "[/TOOL_CALLS]"
    )
    unknown.save_pretrained(tmp_path)
    assert main(["check-template", str(tmp_path), "--enable-thinking", "none"]) == 1
    out = capsys.readouterr().out
    assert "NOT usable" in out and "tool parser: none (tool_parser: auto found no parser" in out
    assert "no registered parser reads back" in out and "[TOOL_CALLS]" in out
    assert "token-in/token-out: safe" in out, "rendering is fine; only the parser is unknown"
    # Named explicitly, hermes is checked against what the template renders: it finds no <tool_call> there.
    assert (
        main(["check-template", str(tmp_path), "--enable-thinking", "none", "--tool-parser", "hermes"]) == 1
    )
    out = capsys.readouterr().out
    assert "NOT usable" in out and "hermes cannot read the tool call the chat template renders" in out
    assert "it finds no tool call" in out and "[TOOL_CALLS]" in out


@pytest.mark.parametrize(
    ("name", "parser", "why"),
    [
        ("glm45", "hermes", "bad_json: the tool call is not valid JSON"),  # GLM-4.6's <arg_key> calls
        ("hermes", "glm45", "missing_name"),  # Qwen3's JSON calls
        ("qwen3_coder", "hermes", "bad_json"),
        ("llama3", "deepseekv31", "it finds no tool call"),
    ],
)
def test_check_template_refuses_a_named_parser_that_cannot_read_the_template(
    tmp_path, capsys, name, parser, why
):
    family_tokenizer(name).save_pretrained(tmp_path)
    argv = ["check-template", str(tmp_path), "--enable-thinking", "none", "--tool-parser", parser]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "enable_thinking=None: NOT usable" in out and f"tool parser: {parser} (set explicitly, but" in out
    assert f"{parser} cannot read the tool call the chat template renders" in out and why in out
    assert "probe_tool" in out, "the rendered call is shown"
    assert main(["check-template", str(tmp_path), "--enable-thinking", "none", "--tool-parser", name]) == 0
    out = capsys.readouterr().out
    assert ": ok" in out and "set explicitly; it reads the tool call the chat template renders" in out


def test_check_template_rejects_history_dependent_tool_rendering(tokenizer, tmp_path, capsys):
    broken = copy.deepcopy(tokenizer)
    # Tool results rendered with their index in the conversation: incremental rendering cannot match.
    broken.chat_template = tokenizer.chat_template.replace(
        "{{- '\\n<tool_response>\\n' }}", "{{- '\\n<tool_response n=' ~ loop.index0 ~ '>\\n' }}"
    )
    assert broken.chat_template != tokenizer.chat_template
    broken.save_pretrained(tmp_path)
    assert main(["check-template", str(tmp_path), "--enable-thinking", "none"]) == 1
    out = capsys.readouterr().out
    assert (
        "NOT usable" in out
        and "token-in/token-out: NOT safe: incremental rendering does not reproduce" in out
    )


def test_validate_config(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text("strands:\n  max_tool_iters: 3\n  sandbox: {timeout_s: 5}\n")
    assert main(["validate-config", str(good)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("strands:\n  max_tool_iter: 3\n")
    assert main(["validate-config", str(bad)]) == 1
    assert "unknown setting(s) max_tool_iter" in capsys.readouterr().out
    bad.write_text('strands:\n  system_prompt: "unterminated\n')
    assert main(["validate-config", str(bad)]) == 1
    assert capsys.readouterr().out.startswith(f"{bad}: invalid: {bad}: not valid YAML: ")


def test_check_server(tokenizer, capsys):
    with SGLangTestServer(tokenizer, context_length=4096) as server:
        assert main(["check-server", server.base_url]) == 0
    out = capsys.readouterr().out
    assert "/health: ok" in out and "context length: 4096" in out
    assert main(["check-server", "http://127.0.0.1:9"]) == 3  # cannot be reached: 3, as every command


@pytest.mark.parametrize("argv", [[], ["nope"]])
def test_usage_errors(argv):
    with pytest.raises(SystemExit):
        main(argv)


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("eval", ["--base-url", "--tokenizer", "--data", "--n", "--concurrency", "--limit", "--config", "--out",
                  "--wandb-project", "pass@k", "examples:"]),
        ("inspect", ["--index", "--html", "--tokens", "--list", "--low-logprob", "loss mask 1", "examples:"]),
        ("drift", ["--index", "--json", "re-tokenized", "re-rendered", "examples:"]),
        ("check-template", ["--enable-thinking", "--tool-parser", "examples:"]),
        ("validate-config", ["path", "examples:"]),
        ("check-server", ["url", "examples:"]),
    ],
)  # fmt: skip
def test_every_command_has_complete_help(capsys, command, expected):
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for text in [*expected, "exit status:", "0 done", "2 usage or input error", "130 interrupted"]:
        assert text in out, text


OWN_STATUSES = {
    "eval": {0, 1, 2, 3, 130},
    "inspect": {0, 2, 130},
    "drift": {0, 2, 130},
    "check-template": {0, 1, 2, 130},
    "validate-config": {0, 1, 2, 130},
    "check-server": {0, 2, 3, 130},
}
"""What each command can exit with: 1 only where a check or an eval finds a problem, 3 only where a server is
asked (check-server, eval); argparse's usage errors (2) and Ctrl-C (130) everywhere."""


@pytest.mark.parametrize("command", sorted(OWN_STATUSES))
def test_every_commands_help_lists_its_own_exit_statuses(capsys, command):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    table = out.split("exit status:\n", 1)[1]
    listed = {int(line.split()[0]) for line in table.splitlines() if re.match(r"^  \d+ ", line)}
    assert listed == OWN_STATUSES[command], table
    assert out.count("exit status:") == 1


def test_the_statuses_a_command_returns_are_in_its_help(capsys, tmp_path):
    """Two commands run to the status their help lists (and the other's help does not)."""
    assert main(["check-server", "http://127.0.0.1:9"]) == 3 and 3 in OWN_STATUSES["check-server"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("strands:\n  max_tool_iter: 3\n")
    assert main(["validate-config", str(bad)]) == 1 and 1 in OWN_STATUSES["validate-config"]
    assert 1 not in OWN_STATUSES["check-server"] and 3 not in OWN_STATUSES["validate-config"]


def test_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in ("eval", "inspect", "drift", "check-template", "validate-config", "check-server"):
        assert f"\n    {command}" in out, command


def _error_line(stderr: str, command: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"slime-strands {command}: error: ") and " -- hint: " in lines[0]
    return lines[0]


def test_check_template_with_a_wrong_tokenizer_path_is_one_line(capsys, tmp_path):
    assert main(["check-template", str(tmp_path / "no" / "such" / "model")]) == 2
    assert "not found: no such file or folder" in _error_line(capsys.readouterr().err, "check-template")
    assert main(["check-template", str(tmp_path)]) == 2  # a folder without a tokenizer
    assert f"cannot load a tokenizer from '{tmp_path}'" in _error_line(
        capsys.readouterr().err, "check-template"
    )


def test_validate_config_missing_file(capsys, tmp_path):
    assert main(["validate-config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: no such file" in _error_line(capsys.readouterr().err, "validate-config")


def test_check_server_unreachable_says_what_to_do(capsys):
    assert main(["check-server", "http://127.0.0.1:9"]) == 3
    captured = capsys.readouterr()
    assert "/health: NOT healthy" in captured.out
    assert "sglang.launch_server" in _error_line(captured.err, "check-server")
