"""Helpers for the command-line tests: data and config files, running ``slime-strands`` in-process, reading
the trajectory file back, and rebuilding a row's token trajectory to check it against the server's records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conftest import qwen3_tokenizer_path

from slime_strands.cli import main
from slime_strands.provider.images import ImagePlacement, TrajectoryImage
from slime_strands.provider.token_manager import TokenManager, TurnInfo
from slime_strands.testing import SGLangTestServer
from slime_strands.testing.invariants import assert_trajectory_invariants
from slime_strands.trajectories.file import SavedSegment, TrajectoryRow

CALL_ADD = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def call(name: str, **arguments: Any) -> str:
    """A tool call as Qwen3's template writes it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def write_data(path: Path, rows: Sequence[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def write_config(path: Path, **settings: Any) -> Path:
    """A plugin YAML: the test tools, quick retries, plus ``settings``."""
    strands = {
        "tools": ["rollout_tools.add", "rollout_tools.echo"],
        "retry_delay_s": 0.01,
        "max_retries": 2,
        **settings,
    }
    path.write_text(json.dumps({"strands": strands}))  # JSON is YAML
    return path


def run_cli(capsys: Any, *argv: str) -> tuple[int, str, str]:
    """``slime-strands argv...`` in-process: exit status, stdout, stderr."""
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli_env(*first: Path) -> dict[str, str]:
    """The environment of a ``slime-strands`` child process: the test tools importable (after ``first``)."""
    path = [*map(str, first), str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def as_foreground() -> None:
    """A child's ``preexec_fn``: Ctrl-C (SIGINT) back to the terminal's default. A shell's background job (a
    test run launched with ``&``) inherits SIGINT ignored, and Python then never installs its Ctrl-C handler: a
    child sent SIGINT would ignore it (the demo server's test hung so), where a user's foreground one stops."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_cli(*argv: str, path: Sequence[Path] = ()) -> subprocess.Popen[str]:
    """``python -m slime_strands.cli argv...`` as a real process (what a user's shell runs); ``path``: folders
    imported from first."""
    return subprocess.Popen(
        [sys.executable, "-m", "slime_strands.cli", *argv],
        env=cli_env(*path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_foreground,
    )


def run_cli_process(*argv: str, timeout: float = 90, path: Sequence[Path] = ()) -> tuple[int, str, str]:
    """``slime-strands argv...`` in a child process: exit status, stdout, stderr (the timeout is a safety net
    for a hung process, not a speed requirement)."""
    process = start_cli(*argv, path=path)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return process.returncode, stdout, stderr


def error_line(stderr: str, command: str) -> str:
    """The one line a command printed on stderr: ``slime-strands COMMAND: error: ... -- hint: ...``."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got {lines}"
    assert lines[0].startswith(f"slime-strands {command}: error: ") and " -- hint: " in lines[0], lines[0]
    return lines[0]


def eval_argv(base_url: str, data: Path, *extra: str) -> list[str]:
    return [
        "eval",
        "--base-url",
        base_url,
        "--tokenizer",
        qwen3_tokenizer_path(),
        "--data",
        str(data),
        *extra,
    ]


def read_rows(path: Path) -> list[TrajectoryRow]:
    return [
        TrajectoryRow.from_json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()
    ]


def latest(rows: Sequence[TrajectoryRow]) -> dict[str, TrajectoryRow]:
    """The last row of every key (a retried key has several)."""
    return {row.key: row for row in rows}


def token_manager(segment: SavedSegment) -> TokenManager:
    """The segment rebuilt as the TokenManager that recorded it (every span appended as the episode did)."""
    tm = TokenManager()
    for span in segment.spans:
        ids = segment.token_ids[span.start : span.end]
        images = [
            ImagePlacement(i.start - span.start, TrajectoryImage(i.data_uri, i.tokens, (0, 0)))
            for i in segment.images
            if span.start <= i.start < span.end
        ]
        if span.kind == "prompt":
            tm.add_prompt(ids, images)
        elif span.kind == "generated":
            tm.add_generation(
                ids, segment.logprobs[span.start : span.end], TurnInfo(span.finish_reason or "")
            )
        else:
            tm.add_observation(ids, images)
    assert tm.token_ids == segment.token_ids and tm.loss_mask == segment.loss_mask
    assert tm.logprobs == segment.logprobs
    return tm


def check_row(row: TrajectoryRow, server: SGLangTestServer, since: int = 0) -> None:
    """The row's tokens are exactly what the server saw and answered for its episode (routing key = row key),
    among the /generate requests from number ``since`` on."""
    requests = [r for r in server.generate_requests[since:] if r.headers.get("x-smg-routing-key") == row.key]
    for segment in row.segments:
        assert_trajectory_invariants(token_manager(segment), server, requests=requests)


def low_confidence(segment: SavedSegment, threshold: float) -> list[int]:
    return [
        i
        for i, (m, lp) in enumerate(zip(segment.loss_mask, segment.logprobs, strict=True))
        if m and lp < threshold
    ]
