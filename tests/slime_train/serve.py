"""The smoke's server side, as one process the script starts and stops by pid: the REAL SGLang 0.5.23 server
on the tiny random-weight Qwen3 (the real-SGLang tier's venv, model and flags: ``real_sglang.server_process``,
``real_sglang.tiny_model``), and the tier's recording proxy in front of it, which slime's router is pointed at.

    python tests/slime_train/serve.py --sglang-python PY --model-dir DIR --log LOG --record REQUESTS.jsonl \
        --address-file ADDR

Once both answer it writes ``127.0.0.1:PORT`` (the proxy) to ``--address-file`` and waits. SIGTERM or SIGINT
stops the proxy, writes every exchange it saw to ``--record`` (one JSON object a line: method, path,
headers, body, status, answer) and stops the server's whole process group; exit status 0. A server that dies on its own ends
this process with status 1 and the end of its log. The record lets the tests check each trained token against
what the server really answered (``test_slime_train.py``).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the real-SGLang tier's helpers

from real_sglang.recording_proxy import RecordingProxy
from real_sglang.server_process import ServerStartError, SGLangServerProcess
from real_sglang.tiny_model import make_tiny_model

_POLL_S = 1.0


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sglang-python", required=True, help="the server venv's python")
    parser.add_argument("--model-dir", required=True, type=Path, help="where the tiny model is written")
    parser.add_argument("--log", required=True, type=Path, help="the server's log")
    parser.add_argument("--record", required=True, type=Path, help="JSONL of every request and answer")
    parser.add_argument("--address-file", required=True, type=Path, help="gets HOST:PORT once ready")
    return parser.parse_args()


def _write_record(proxy: RecordingProxy, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as out:
        for exchange in proxy.exchanges:
            row: dict[str, Any] = {
                "method": exchange.method,
                "path": exchange.path,
                "headers": exchange.headers,
                "body": exchange.body,
                "status": exchange.status,
                "answer": exchange.answer,
                "disconnected": exchange.disconnected,
            }
            out.write(json.dumps(row) + "\n")
    tmp.replace(path)


def main() -> int:
    ns = _parse()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    model = make_tiny_model(ns.model_dir)
    server = SGLangServerProcess(ns.sglang_python, model, ns.log)
    try:
        server.start()
    except ServerStartError as exc:
        print(f"serve: the SGLang server did not start: {exc}", file=sys.stderr)
        return 1
    proxy = RecordingProxy(server.base_url).start()
    status = 0
    try:
        ns.address_file.write_text(f"127.0.0.1:{proxy.port}\n")
        while not stop.wait(_POLL_S):
            if server.exit_status() is not None:
                print(f"serve: the SGLang server exited on its own\n{server.log_tail()}", file=sys.stderr)
                status = 1
                break
    finally:
        proxy.stop()
        _write_record(proxy, ns.record)
        server.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
