"""The demo server: the SGLang stand-in (:class:`~slime_strands.testing.SGLangTestServer`) on a real port, every
request answered by the demo math policy (:class:`~slime_strands.testing.math_policy.MathPolicy`), code problems
(HumanEval's) by the scripted code policy (:class:`~slime_strands.testing.code_policy.CodePolicy`), until Ctrl-C
or SIGTERM. It lets a machine without a GPU run the whole package as it runs against SGLang: ``slime-strands
eval``, the sandbox, ``inspect``, ``drift``, slime's rollout.

    python -m slime_strands.testing --port 30000 [--tokenizer qwen3-demo] [--seed 0] [--wrong-rate 0.25]

It answers token-in/token-out exactly as the stand-in does for tests (SGLang 0.5.23's answers, checks and stop
rules; realistic logprobs), so the trajectories it yields are what slime would train on; only what the model
writes is scripted.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass
from typing import Any, TextIO

from ..cli.errors import EXIT_FAILURES, EXIT_OK, CommandError
from ..template.render import ChatRenderer
from ..template.tokenizer_loading import DEMO_TOKENIZER, load_tokenizer
from .code_policy import CodePolicy
from .server import SGLangTestServer, SGLangTestServerError

__all__ = ["DEMO_MODEL", "DemoServerOptions", "build_demo_server", "serve"]

DEMO_MODEL = "slime-strands/demo-math-policy"
"""The model id the demo server reports (``/model_info``, ``/v1/models``)."""


@dataclass(frozen=True)
class DemoServerOptions:
    """The demo server's command-line options (``python -m slime_strands.testing --help``)."""

    host: str = "127.0.0.1"
    port: int = 30000
    """0: any free port (the ready line names it)."""
    tokenizer: str = DEMO_TOKENIZER
    seed: int = 0
    wrong_rate: float = 0.25
    context_length: int = 32768


def build_demo_server(tokenizer: Any, options: DemoServerOptions) -> SGLangTestServer:
    """The stand-in answering every request with the math policy (not started): a turn ends on the template's
    own end token, as the served model's would."""
    stop_tokens = ChatRenderer(tokenizer, probe=False).stop_tokens
    server = SGLangTestServer(
        tokenizer,
        host=options.host,
        port=options.port,
        context_length=options.context_length,
        model_path=DEMO_MODEL,
        end_of_turn=stop_tokens,
    )
    server.responder = CodePolicy(tokenizer, seed=options.seed, wrong_rate=options.wrong_rate)
    return server


def serve(options: DemoServerOptions, out: TextIO = sys.stdout) -> int:
    """Serve until Ctrl-C or SIGTERM, then stop cleanly: exit status 0, or 1 when the stand-in met a request
    the real server would not have answered as scripted (printed). A line saying ``ready at URL`` is printed
    once requests are answered."""
    tokenizer = load_tokenizer(options.tokenizer)
    try:
        server = build_demo_server(tokenizer, options)
    except ValueError as exc:  # a template that renders no tool call
        raise CommandError(str(exc), hint="pass a tokenizer whose chat template renders tool calls") from exc
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` stops it like Ctrl-C
    try:
        _listen(server, options)
        print(
            f"demo server ready at {server.base_url}: SGLang protocol, math policy (seed {options.seed}, "
            f"{options.wrong_rate:.0%} slips; it calls only execute_python_code, and answers a request that does "
            "not offer it at once: test your own tools with SGLangTestServer.script, see docs/testing.md; a code "
            "problem gets a scripted program, HumanEval's canonical one or on a slip a wrong one), "
            f"tokenizer {options.tokenizer}; Ctrl-C stops it",
            file=out,
            flush=True,
        )
        _until_interrupted()
    finally:  # also on an interrupt before the ready line: no thread is left serving
        signal.signal(signal.SIGTERM, previous)
        answered = len(server.generate_requests)
        failure = _stop(server)
    if failure is not None:
        print(
            f"demo server stopped; it met requests the real server would not answer so: {failure}", file=out
        )
        return EXIT_FAILURES
    print(f"demo server stopped after {answered} /generate requests", file=out, flush=True)
    return EXIT_OK


def _listen(server: SGLangTestServer, options: DemoServerOptions) -> None:
    try:
        server.start()
    except OSError as exc:
        raise CommandError(
            f"cannot listen on {options.host}:{options.port}: {exc.strerror or exc}",
            hint="stop what uses that port or pass another --port (0: any free one)",
        ) from exc


def _until_interrupted() -> None:
    """Sleep until Ctrl-C (or SIGTERM, turned into the same KeyboardInterrupt)."""
    try:
        while True:
            signal.pause()
    except KeyboardInterrupt:
        return


def _stop(server: SGLangTestServer) -> str | None:
    """Stop serving (open requests are aborted, every thread joined); what the stand-in failed on, if anything."""
    try:
        server.stop()
    except SGLangTestServerError as exc:
        return str(exc)
    return None
