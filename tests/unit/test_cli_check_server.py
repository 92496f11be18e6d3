"""``slime-strands check-server --wait``: a server started in the background (SGLang loading its weights, the demo
server loading its tokenizer) is waited for, within a bound, instead of being reported down at once."""

from __future__ import annotations

from slime_strands.cli import main
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
        assert main(["check-server", server.base_url]) == 1
        assert _health_answers(server) == 1
    assert "/health: NOT healthy" in capsys.readouterr().out


def test_wait_gives_up_at_its_bound_and_says_so(capsys):
    assert main(["check-server", "http://127.0.0.1:9", "--wait", "0.5"]) == 1
    captured = capsys.readouterr()
    assert "/health: NOT healthy" in captured.out
    assert "cannot reach a healthy SGLang server at http://127.0.0.1:9 within 0.5 s" in captured.err
