"""The slime-strands command: template probe, settings validation, server check."""

from __future__ import annotations

import copy

import pytest
from conftest import qwen3_tokenizer_path

from slime_strands.cli import main
from slime_strands.testing import SGLangTestServer


def test_check_template_accepts_qwen3(capsys):
    assert main(["check-template", qwen3_tokenizer_path()]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok") == 3 and "'<|im_end|>' = id 151645" in out


def test_check_template_rejects_history_dependent_tool_rendering(tokenizer, tmp_path, capsys):
    broken = copy.deepcopy(tokenizer)
    # Tool results rendered with their index in the conversation: incremental rendering cannot match.
    broken.chat_template = tokenizer.chat_template.replace(
        "{{- '\\n<tool_response>\\n' }}", "{{- '\\n<tool_response n=' ~ loop.index0 ~ '>\\n' }}"
    )
    assert broken.chat_template != tokenizer.chat_template
    broken.save_pretrained(tmp_path)
    assert main(["check-template", str(tmp_path), "--enable-thinking", "none"]) == 1
    assert "NOT usable" in capsys.readouterr().out


def test_validate_config(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text("strands:\n  max_tool_iters: 3\n  sandbox: {timeout_s: 5}\n")
    assert main(["validate-config", str(good)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("strands:\n  max_tool_iter: 3\n")
    assert main(["validate-config", str(bad)]) == 1
    assert "unknown setting(s) max_tool_iter" in capsys.readouterr().out


def test_check_server(tokenizer, capsys):
    with SGLangTestServer(tokenizer, context_length=4096) as server:
        assert main(["check-server", server.base_url]) == 0
    out = capsys.readouterr().out
    assert "/health: ok" in out and "context length: 4096" in out
    assert main(["check-server", "http://127.0.0.1:9"]) == 1


@pytest.mark.parametrize("argv", [[], ["nope"]])
def test_usage_errors(argv):
    with pytest.raises(SystemExit):
        main(argv)
