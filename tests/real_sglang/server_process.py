"""Start and stop the REAL SGLang server (``python -m sglang.launch_server``) on a CPU, for the tier and the
prefix-cache benchmark.

The launcher runs directly under the server venv's python (no shell in between) in a session of its own, so
its pid is the process group of everything it starts (tokenizer manager, scheduler, detokenizer): stopping it
signals that group, waits with a bound, then kills whatever is left. Readiness is ``GET /health`` answering
200, polled with a bound; a launcher that exits early or never gets ready raises :class:`ServerStartError`
with the end of its log.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

__all__ = ["CPU_FLAGS", "IMPORT_STUB", "SGLangServerProcess", "ServerStartError"]

REPO = Path(__file__).resolve().parents[2]
IMPORT_STUB = REPO / "scripts" / "real_sglang" / "import_stub"
"""Put on the server's PYTHONPATH: ``vllm._custom_ops``, an import SGLang 0.5.23 makes on a CPU but never calls."""
CPU_FLAGS = (
    "--device", "cpu",
    "--load-format", "dummy",
    "--attention-backend", "torch_native",
    "--sampling-backend", "pytorch",
    "--grammar-backend", "xgrammar",
    "--dtype", "bfloat16",
    "--context-length", "1024",
    "--max-total-tokens", "4096",
    "--disable-overlap-schedule",
    "--skip-server-warmup",
)  # fmt: skip
"""The flags that serve a tiny random-weight model on a CPU (docs: real-sglang-on-cpu.md): a 1,024-token window
and a 4,096-token KV pool, small enough that a few long requests fill it and the next one queues."""
READY_TIMEOUT_S = 600.0
"""Bound on the wait for /health: ~30 s on an idle 2-core machine, several times that under load."""
STOP_TIMEOUT_S = 30.0
_PR_SET_PDEATHSIG = 1


class ServerStartError(RuntimeError):
    """The server did not become ready; the message ends with its log."""


class SGLangServerProcess:
    """One ``sglang.launch_server`` process serving ``model_dir`` on a free port of 127.0.0.1."""

    def __init__(
        self,
        python: str,
        model_dir: str | os.PathLike[str],
        log_path: str | os.PathLike[str],
        *,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.python = python
        self.model_dir = Path(model_dir)
        self.log_path = Path(log_path)
        self.extra_args = tuple(extra_args)
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self._process is not None, "not started"
        return self._process.pid

    def exit_status(self) -> int | None:
        """The launcher's exit status once it has exited (on its own, or stopped); None while it runs."""
        assert self._process is not None, "not started"
        return self._process.poll()

    def command(self) -> list[str]:
        return [
            self.python, "-m", "sglang.launch_server", "--model-path", str(self.model_dir), *CPU_FLAGS,
            *self.extra_args, "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip

    def start(self, ready_timeout_s: float = READY_TIMEOUT_S) -> SGLangServerProcess:
        """Launch and wait until /health answers 200; raises ServerStartError (after stopping it) otherwise."""
        if self._process is not None:
            raise RuntimeError("already started")
        self.port = _free_port()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the project's path never leaks in
        env.update(PYTHONPATH=str(IMPORT_STUB), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its pid is the process group of the tokenizer, scheduler, detokenizer
                preexec_fn=_die_with_parent,
            )
        try:
            self._wait_ready(ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        assert self._process is not None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ServerStartError(
                    f"sglang.launch_server exited with status {self._process.returncode} before it was ready\n"
                    f"{self.log_tail()}"
                )
            if _health(self.base_url):
                return
            time.sleep(0.5)  # polling a condition, with the deadline above
        raise ServerStartError(f"/health did not answer 200 within {timeout_s:.0f} s\n{self.log_tail()}")

    def stop(self) -> int | None:
        """Stop the launcher and every process of its group; returns the launcher's exit status."""
        process, self._process = self._process, None
        if process is None:
            return None
        group = process.pid
        _signal_group(group, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _signal_group(group, signal.SIGKILL)
            process.wait(timeout=STOP_TIMEOUT_S)
        # Children may outlive the launcher for a moment (the scheduler frees its pool): never leave one behind.
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _group_alive(group) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(group):
            _signal_group(group, signal.SIGKILL)
        return process.returncode

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> SGLangServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _health(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _die_with_parent() -> None:
    """In the launcher, before exec: SIGTERM when the test process dies, so no server outlives a killed run."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _signal_group(group: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def _group_alive(group: int) -> bool:
    """Whether a process of ``group`` is still running (zombies excluded)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        if fields[0] != "Z" and int(fields[2]) == group:
            return True
    return False
