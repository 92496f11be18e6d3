"""``slime-strands eval --sandbox-placement ray`` as a user's shell runs it: it starts a local Ray (or joins the
cluster at ``RAY_ADDRESS``), the model's code runs on the pool, the trajectories are the ones a local sandbox
gives, and nothing of Ray or the pool is left once the command has exited."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from cli_helpers import check_row, eval_argv, latest, read_rows, run_cli_process, write_data
from ray_kit import home_with, own_ray_tmpdir, python_call, ray_lines, tree, wait_until

from slime_strands.testing import SGLangTestServer

pytestmark = pytest.mark.timeout(400)

PROGRAMS = ["print(6 * 7)", "import sympy\nprint(sympy.factorint(1001))", "raise ValueError('no')"]


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=8192) as srv:
        yield srv


def _script(server: SGLangTestServer) -> None:
    for p, code in enumerate(PROGRAMS):
        server.script(python_call(code), "Answer: \\boxed{42}", key=f"{p}:0")


def _config(path: Path) -> Path:
    strands = {"tools": ["slime_strands.sandbox.execute_python_code"], "sandbox": {"timeout_s": 30.0}}
    path.write_text(json.dumps({"strands": strands}))
    return path


def _eval(server, tmp_path: Path, name: str, *extra: str) -> dict:
    return _eval_stderr(server, tmp_path, name, *extra)[0]


def _eval_stderr(server, tmp_path: Path, name: str, *extra: str) -> tuple[dict, str]:
    """The rows of an eval run in a child process, and what it printed on stderr."""
    data = write_data(tmp_path / "data.jsonl", [{"prompt": f"Problem {p}", "label": "42"} for p in range(3)])
    out = tmp_path / f"{name}.jsonl"
    _script(server)
    code, _, stderr = run_cli_process(
        *eval_argv(server.base_url, data, "--n", "1", "--config", str(_config(tmp_path / "plugin.yaml"))),
        "--out",
        str(out),
        *extra,
        timeout=300,
    )
    assert code == 0, stderr
    pool_lines = [line for line in stderr.splitlines() if line.startswith("sandbox: ")]
    if "--sandbox-placement" in extra:  # the user asked for a pool: one line says it was used, and which
        assert len(pool_lines) == 1, stderr
        assert pool_lines[0].startswith(
            "sandbox: the model's code runs on a Ray pool of 2 worker(s) x 4 slot(s) on 1 node(s) (isolated by "
        ), pool_lines
    else:
        assert pool_lines == [], stderr
    rows = latest(read_rows(out))
    for row in rows.values():
        check_row(row, server)
    return rows, stderr


def _processes_under(directory: str) -> list[str]:
    """Command lines of the live processes that name ``directory`` (Ray's own: gcs, raylet, workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if directory in cmdline:
                found.append(cmdline)
    return found


def test_eval_on_a_ray_pool_it_starts_matches_a_local_sandbox(server, tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    local = _eval(server, tmp_path, "local")
    home = home_with(tmp_path, monkeypatch, {".ray/notes.txt": "the user's own"})
    with own_ray_tmpdir() as ray_dir:
        on_ray, stderr = _eval_stderr(server, tmp_path, "ray", "--sandbox-placement", "ray")
        assert not _processes_under(ray_dir), "Ray and its workers stop with the command"
        assert os.listdir(ray_dir) == [], "the Ray the command started leaves no session folder behind"
    # No auth token (nor anything else) left in the home; what was there before is untouched.
    assert tree(home) == {".ray": "", ".ray/notes.txt": "the user's own"}
    [line] = ray_lines(stderr)
    assert re.fullmatch(
        f"ray: the local Ray this command started kept its session in {re.escape(ray_dir)}/ss-ray-[^/]+/"
        "session_[^/]+: removed",
        line,
    ), line
    assert local.keys() == on_ray.keys() == {"0:0", "1:0", "2:0"}
    for key in local:
        assert [s.token_ids for s in local[key].segments] == [s.token_ids for s in on_ray[key].segments]
        assert _tool_results(local[key]) == _tool_results(on_ray[key])
    assert "{7: 1, 11: 1, 13: 1}" in _tool_results(on_ray["1:0"])[0]
    assert "ValueError: no" in _tool_results(on_ray["2:0"])[0]


def _tool_results(row) -> list[str]:
    return [json.dumps(m["content"]) for m in row.messages if m["role"] == "tool"]


async def test_eval_joins_the_cluster_at_ray_address_and_leaves_it_running(server, tmp_path, monkeypatch):
    import ray
    from ray.cluster_utils import Cluster

    with own_ray_tmpdir():
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
        try:
            monkeypatch.setenv("RAY_ADDRESS", cluster.address)
            rows, stderr = _eval_stderr(server, tmp_path, "joined", "--sandbox-placement", "ray")
            assert set(rows) == {"0:0", "1:0", "2:0"}
            [line] = ray_lines(stderr)
            assert line.startswith(
                f"ray: the Ray cluster at {cluster.address} was joined and is left running, "
            ), line
            assert "42" in _tool_results(rows["0:0"])[0]
            ray.init(address=cluster.address, log_to_driver=False)
            try:  # the cluster outlived the command; the pool's workers (a CPU each) did not
                await wait_until(lambda: ray.available_resources().get("CPU") == 2.0, "the pool's CPUs freed")
            finally:
                ray.shutdown()
        finally:
            cluster.shutdown()
