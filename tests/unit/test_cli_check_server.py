"""``slime-strands check-server --wait``: a server started in the background (SGLang loading its weights, the demo
server loading its tokenizer) is waited for, within a bound, instead of being reported down at once."""

from __future__ import annotations

from slime_strands.cli import main
from slime_strands.cli.errors import EXIT_SERVER
from slime_strands.testing import SGLangTestServer


def _health_answers(server: SGLangTestServer) -> int:
    return sum(r.path == "/health" for r in server.requests)


def test_wait_keeps_asking_until_the_server_answers(tokenizer, capsys):
    # 503 on every route for 1 s from its first request: a server still loading.
    with SGLangTestServer(tokenizer, context_length=4096, unavailable_s=1.0) as server:
        assert main(["check-server", server.base_url, "--wait", "60"]) == 0
        asked = _health_answers(server)
    out = capsys.readouterr().out
    assert "/health: ok" in out and "context length: 4096" in out
    assert asked >= 2, "the first /health got a 503: it asked again"


def test_without_wait_a_loading_server_is_not_healthy(tokenizer, capsys):
    with SGLangTestServer(tokenizer, unavailable_s=60.0) as server:
        assert main(["check-server", server.base_url]) == EXIT_SERVER
        assert _health_answers(server) == 1
    assert "/health: NOT healthy" in capsys.readouterr().out


def test_wait_gives_up_at_its_bound_and_says_so(capsys):
    assert main(["check-server", "http://127.0.0.1:9", "--wait", "0.5"]) == EXIT_SERVER
    captured = capsys.readouterr()
    assert "/health: NOT healthy" in captured.out
    assert "cannot reach a healthy SGLang server at http://127.0.0.1:9 within 0.5 s" in captured.err


def test_a_dead_port_exits_with_the_status_the_help_and_docs_give(capsys):
    """One answer everywhere: the exit status of a server that cannot be reached, as the command's help table,
    ``cli/errors.py`` and docs/cli.md give it, is what check-server exits with (it exited 1 while they said 3)."""
    import re
    from pathlib import Path

    from slime_strands.cli import _EXIT_CODES

    assert main(["check-server", "http://127.0.0.1:9"]) == EXIT_SERVER
    capsys.readouterr()
    (help_line,) = [line for line in _EXIT_CODES.splitlines() if "cannot be reached" in line]
    assert help_line.split()[0] == str(EXIT_SERVER) and "check-server" in help_line
    table = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    (row,) = [line for line in table.splitlines() if re.match(r"\| \d+ \|.*cannot be reached", line)]
    assert row.startswith(f"| {EXIT_SERVER} |") and "`check-server`" in row
    assert "`check-server`" not in next(line for line in table.splitlines() if line.startswith("| 1 |"))
