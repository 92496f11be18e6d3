"""``slime-strands eval --rollout-workers 2`` as a user's shell runs it: it starts a local Ray, the episodes run on
two rollout workers (each hosting the sandbox the model's code runs in), the trajectories are the ones the
in-process eval writes, and nothing of Ray is left once the command has exited."""

from __future__ import annotations

import os

import pytest
from cli_helpers import read_rows
from ray_kit import home_with, own_ray_tmpdir, ray_lines, tree
from test_ray_eval_cli import _eval, _eval_stderr, _processes_under, _tool_results

from slime_strands.testing import SGLangTestServer

pytestmark = pytest.mark.timeout(400)


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=8192) as srv:
        yield srv


def test_eval_on_rollout_workers_matches_the_in_process_eval(server, tmp_path, monkeypatch):
    here = _eval(server, tmp_path, "here")
    home = home_with(tmp_path, monkeypatch, {})
    with own_ray_tmpdir() as ray_dir:
        there, stderr = _eval_stderr(server, tmp_path, "workers", "--rollout-workers", "2")
        assert not _processes_under(ray_dir), "Ray and its workers stop with the command"
        assert os.listdir(ray_dir) == [], "the Ray the command started leaves no session folder behind"
    assert tree(home) == {}, "the Ray the command started writes nothing in the home (no ~/.ray/auth_token)"
    [line] = ray_lines(stderr)
    assert line.startswith(f"ray: the local Ray this command started kept its session in {ray_dir}/"), line
    assert line.endswith(": removed"), line
    assert here.keys() == there.keys() == {"0:0", "1:0", "2:0"}
    for key in here:
        assert [s.token_ids for s in here[key].segments] == [s.token_ids for s in there[key].segments]
        assert _tool_results(here[key]) == _tool_results(there[key])
        assert here[key].reward == there[key].reward
    assert "{7: 1, 11: 1, 13: 1}" in _tool_results(there["1:0"])[0]
    assert len(read_rows(tmp_path / "workers.jsonl")) == 3
