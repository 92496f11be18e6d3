"""``slime-strands eval --config`` with ``mcp_servers``: the same MCP tools as in slime's rollout (a shared
calculator, a notebook per episode), real MCP servers, real Strands agents; the rows hold the MCP tools' specs
(what the template rendered) and every server is gone when the command returns."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from cli_helpers import check_row, eval_argv, latest, read_rows, run_cli, write_config, write_data
from mcp_kit import ANSWER, call, children, stdio_server, wait_for
from tokenizer_kit import qwen3_tokenizer_path
from transformers import AutoTokenizer

from slime_strands.testing import SGLangTestServer

pytestmark = pytest.mark.timeout(300)


def test_eval_runs_episodes_with_mcp_tools(tokenizer, tmp_path, capsys):
    data = write_data(tmp_path / "math.jsonl", [{"prompt": "What is 2 + 3?", "label": "5"}] * 3)
    servers = [stdio_server("calc", "calc"), stdio_server("notebook", "notebook", scope="episode")]
    config = write_config(tmp_path / "plugin.yaml", mcp_servers=servers)
    out = tmp_path / "traj.jsonl"
    with SGLangTestServer(tokenizer, context_length=8192) as server:
        for p in range(3):
            for s in range(2):
                server.script(
                    call("notebook_write", text=f"row {p}:{s}"),
                    call("notebook_read"),
                    call("calc_add", a=2, b=3),
                    ANSWER,
                    key=f"{p}:{s}",
                )
        argv = eval_argv(server.base_url, data, "--n", "2", "--concurrency", "6", "--config", str(config))
        code, _, stderr = run_cli(capsys, *argv, "--out", str(out))
        assert code == 0, stderr
        rows = latest(read_rows(out))
        assert sorted(rows) == [f"{p}:{s}" for p in range(3) for s in range(2)]
        for key, row in rows.items():
            assert row.status == "COMPLETED" and row.reward == 1.0, (key, row.error)
            check_row(row, server)
            text = tokenizer.decode(row.segments[0].token_ids)
            shown = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, flags=re.S)
            assert shown == ["1 lines", f"row {key}", "5"], "each episode saw only its own notebook"
            names = [tool["function"]["name"] for tool in row.tools or []]
            assert {"calc_add", "notebook_write", "notebook_read"} <= set(names)
            assert '"name": "notebook_write"' in text
    assert wait_for(lambda: not children()), "no MCP server outlives the command"
    assert json.loads(out.read_text().splitlines()[0])["key"]


def test_the_example_config_runs_as_documented(tokenizer, tmp_path, capsys, monkeypatch):
    """configs/strands_mcp.yaml (docs/mcp.md's example) run from the repository's root with ``python`` the
    environment's: its shared arithmetic and per-episode notebook answer as the docs say."""
    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)
    monkeypatch.setenv(
        "PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    )
    data = write_data(tmp_path / "math.jsonl", [{"prompt": "What is 2 * 3 + 4?", "label": "10"}])
    with SGLangTestServer(tokenizer, context_length=8192) as server:
        for s in range(2):
            server.script(
                call("math_multiply", a=2, b=3),
                call("notes_write", text=f"2*3 = 6 ({s})"),
                call("math_add", a=6, b=4),
                call("notes_read"),
                "Answer: \\boxed{10}",
                key=f"0:{s}",
            )
        argv = eval_argv(server.base_url, data, "--n", "2", "--config", "configs/strands_mcp.yaml")
        code, _, stderr = run_cli(capsys, *argv, "--out", str(tmp_path / "out.jsonl"))
        assert code == 0, stderr
        for key, row in latest(read_rows(tmp_path / "out.jsonl")).items():
            assert row.reward == 1.0, (key, row.error)
            text = tokenizer.decode(row.segments[0].token_ids)
            shown = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, flags=re.S)
            assert shown == ["6.0", "1 lines", "10.0", f"2*3 = 6 ({key[-1]})"]
    assert wait_for(lambda: not children())


def test_validate_config_starts_the_servers_and_lists_their_tools(tmp_path, capsys, monkeypatch):
    """``validate-config`` checks the MCP servers as the first sample would: the example config's tools are
    listed with their servers; a server that exits at start is the file's one invalid line, with its stderr."""
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    monkeypatch.setenv(
        "PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    )
    code, stdout, _ = run_cli(capsys, "validate-config", "configs/strands_mcp.yaml")
    assert code == 0, stdout
    assert stdout.splitlines()[:3] == [
        "configs/strands_mcp.yaml: ok",
        "  tools: none",
        "  MCP tools: math_add (math, shared), math_multiply (math, shared), notes_write (notes, episode), "
        "notes_read (notes, episode)",
    ]
    broken = write_config(tmp_path / "broken.yaml", mcp_servers=[stdio_server("exits", "notes")])
    code, stdout, _ = run_cli(capsys, "validate-config", str(broken))
    assert code == 1
    (line,) = stdout.splitlines()
    assert line.startswith(f"{broken}: invalid: MCP server 'notes' (")
    assert line.endswith("stderr: starting the notes server | fatal: cannot open /nonexistent/notes.db")
    assert wait_for(lambda: not children())


def test_check_template_probes_the_template_with_the_mcp_tools(tmp_path, capsys):
    """``check-template --config``: the file's MCP servers are started, their allow-listed tools (prefixed)
    offered in the probe beside the Python tools, each checked to be shown by the template's prompt and its
    call (arguments from the tool's schema) read back by the parser; no server is left. A template that shows
    only the probe's own tool is NOT usable, naming the MCP tools it hides; a server that exits at start makes
    the file invalid, with its stderr."""
    servers = [
        stdio_server("calc", "calc", tools=["add", "stats"]),
        stdio_server("notebook", "notebook", scope="episode", tools=["write"]),
    ]
    config = write_config(tmp_path / "plugin.yaml", mcp_servers=servers)
    tokenizer = qwen3_tokenizer_path()
    argv = ["check-template", tokenizer, "--enable-thinking", "false", "--config", str(config)]
    code, stdout, _ = run_cli(capsys, *argv)
    assert code == 0, stdout
    assert (
        "  tools (5, offered in the probe): add, echo, calc_add, calc_stats, notebook_write: "
        "each shown, each call read back"
    ) in stdout.splitlines()
    assert wait_for(lambda: not children()), "the servers were stopped"

    hiding = AutoTokenizer.from_pretrained(tokenizer)
    hiding.chat_template = hiding.chat_template.replace(
        "{%- for tool in tools %}", "{%- for tool in tools if tool.function.name == 'probe_tool' %}"
    )
    hiding.save_pretrained(tmp_path / "hiding")
    argv[1] = str(tmp_path / "hiding")
    code, stdout, _ = run_cli(capsys, *argv)
    assert code == 1
    assert "enable_thinking=False: NOT usable" in stdout
    for name in ("calc_add", "calc_stats", "notebook_write"):
        assert f"    {name}: not shown by the chat template's prompt" in stdout.splitlines()
    assert wait_for(lambda: not children())

    broken = write_config(tmp_path / "broken.yaml", mcp_servers=[stdio_server("exits", "notes")])
    code, stdout, _ = run_cli(capsys, "check-template", tokenizer, "--config", str(broken))
    assert code == 1
    (line,) = stdout.splitlines()
    assert line.startswith(f"{broken}: invalid: MCP server 'notes' (")
    assert line.endswith("stderr: starting the notes server | fatal: cannot open /nonexistent/notes.db")
