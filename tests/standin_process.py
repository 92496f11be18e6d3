"""The SGLang-protocol test server in a process of its own, so that a test can kill it as a real server dies.

    python tests/standin_process.py --tokenizer DIR --answer "Answer: \\boxed{5}" --hold 1:0 --hold 1:1

prints its base URL on the first line of stdout, then ``held KEY`` each time a request of a held routing key
arrives (that request is answered only after 600 s: it is in flight until the process is killed); every other
request is answered at once with ``--answer``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from transformers import AutoTokenizer

from slime_strands.testing import SGLangTestServer, Turn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--answer", required=True)
    parser.add_argument("--hold", action="append", default=[])
    parser.add_argument("--context-length", type=int, default=8192)
    args = parser.parse_args()
    held = set(args.hold)
    lock = threading.Lock()

    def respond(body, headers):
        key = headers.get("x-smg-routing-key")
        if key in held:
            with lock:
                print(f"held {key}", flush=True)
            return Turn(args.answer, delay_s=600)
        return Turn(args.answer)

    server = SGLangTestServer(
        AutoTokenizer.from_pretrained(args.tokenizer), context_length=args.context_length
    )
    server.responder = respond
    server.start()
    print(server.base_url, flush=True)
    signal.pause()


if __name__ == "__main__":
    sys.exit(main())
