"""MCP tools against the REAL server (issue 42): ``slime-strands eval`` with a shared calculator and a notebook
per episode (the real MCP servers of ``tests/mcp_servers``). A grammar makes the tiny model write the MCP calls;
the server renders the MCP tools' schemas in the prompt and every row's tokens are what the server saw and
answered. Each episode's notebook is its own, and no server outlives the command."""

from __future__ import annotations

import re

import pytest
from cli_helpers import check_row, eval_argv, latest, read_rows, run_cli, write_config, write_data
from mcp_kit import children, stdio_server, wait_for

from real_sglang.real_helpers import call, one_of

pytestmark = [pytest.mark.real_sglang, pytest.mark.timeout(600)]


def test_eval_with_mcp_tools_on_the_real_server(proxy, tmp_path, capsys):
    data = write_data(tmp_path / "math.jsonl", [{"prompt": "What is 2 + 3?", "label": "5"}])
    calls = (call("notebook_write", text="2+3"), call("notebook_read"), call("calc_add", a=2, b=3))
    config = write_config(
        tmp_path / "plugin.yaml",
        max_tool_iters=3,
        sampling_params={"regex": one_of(*calls)},
        mcp_servers=[  # allow-lists: every schema is in the prompt, and the tier's window is 1018 tokens
            stdio_server("calc", "calc", tools=["add"]),
            stdio_server("notebook", "notebook", scope="episode", tools=["write", "read"]),
        ],
    )
    out = tmp_path / "traj.jsonl"
    argv = eval_argv(proxy.base_url, data, "--n", "4", "--temperature", "1", "--config", str(config))
    code, stdout, stderr = run_cli(capsys, *argv, "--out", str(out))
    assert code == 0, stderr
    rows = latest(read_rows(out))
    assert sorted(rows) == ["0:0", "0:1", "0:2", "0:3"], stdout
    for row in rows.values():
        check_row(row, proxy)
        assert (row.status, row.termination) == ("TRUNCATED", "tool_limit"), row.key
        assert row.record.tool_calls == 3 and row.record.tool_errors == 0, row.key
        decoded = row.response
        shown = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", decoded, flags=re.S)
        writes = 0
        for made, answer in zip(re.findall(r'"name": "(\w+)"', decoded), shown, strict=False):
            if made == "notebook_write":
                writes += 1
                assert answer == f"{writes} lines", "each episode's notebook holds its own writes only"
            elif made == "calc_add":
                assert answer == "5"
        names = [tool["function"]["name"] for tool in row.tools or []]
        assert {"calc_add", "notebook_write", "notebook_read"} <= set(names)
    assert wait_for(lambda: not children()), "no MCP server outlives the command"
