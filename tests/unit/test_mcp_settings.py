"""``strands.mcp_servers``: each server's settings checked strictly, at load, one line naming the key and the fix."""

from __future__ import annotations

import pytest

from slime_strands.settings import McpServerSettings, PluginSettings, SettingsError

STDIO = {"name": "notes", "command": "python", "args": ["-m", "notes"]}


def load(*servers: dict) -> PluginSettings:
    return PluginSettings.from_mapping({"mcp_servers": list(servers)})


def test_a_stdio_server_gets_the_documented_defaults():
    (server,) = load(STDIO).mcp_servers
    assert server == McpServerSettings(name="notes", command="python", args=("-m", "notes"))
    assert (server.transport, server.scope, server.prefix, server.tools) == ("stdio", "shared", "notes", None)
    assert (server.call_timeout_s, server.startup_timeout_s, server.max_live) == (60.0, 30.0, 64)
    assert load({**STDIO, "prefix": None}).mcp_servers[0].prefix is None


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({**STDIO, "comand": "x"}, "unknown setting(s) mcp_servers.comand (did you mean 'command'?)"),
        (
            {**STDIO, "transport": "stdoi"},
            "mcp_servers[notes].transport: unknown transport 'stdoi' (did you mean 'stdio'?)",
        ),
        (
            {**STDIO, "scope": "episodes"},
            "mcp_servers[notes].scope: unknown scope 'episodes' (did you mean 'episode'?)",
        ),
        ({**STDIO, "url": "http://x/mcp"}, "mcp_servers[notes].url does not apply to transport: stdio"),
        (
            {"name": "web", "transport": "streamable_http"},
            "mcp_servers[web]: transport streamable_http needs url",
        ),
        (
            {"name": "web", "transport": "streamable_http", "url": "x"},
            "mcp_servers[web].url must start with http://",
        ),
        (
            {"name": "n", "command": "python", "env": {"A": 1}},
            "mcp_servers.env: expected a mapping of strings to strings",
        ),
        ({**STDIO, "tools": []}, "mcp_servers[notes].tools: a list of distinct MCP tool names"),
        ({**STDIO, "call_timeout_s": 0}, "mcp_servers[notes].call_timeout_s must be > 0"),
        ({**STDIO, "max_live": 8}, "mcp_servers[notes].max_live bounds episode-scope servers"),
        ({**STDIO, "prefix": "no spaces"}, "mcp_servers[notes].prefix: letters, digits"),
        ({"command": "python"}, "mcp_servers: every server needs a name"),
    ],
)
def test_a_bad_server_is_refused_with_the_fix(server, message):
    with pytest.raises(SettingsError) as raised:
        load(server)
    assert str(raised.value).startswith(message), str(raised.value)


def test_two_servers_of_one_name_are_refused():
    with pytest.raises(SettingsError, match="mcp_servers: two servers are named 'notes'"):
        load(STDIO, STDIO)


def test_the_example_config_loads():
    from pathlib import Path

    settings = PluginSettings.from_yaml(
        Path(__file__).resolve().parents[2] / "configs" / "strands_mcp.yaml", other_keys=False
    )
    assert [(s.name, s.scope, s.tools) for s in settings.mcp_servers] == [
        ("math", "shared", ("add", "multiply")),
        ("notes", "episode", ("write", "read")),
    ]
