"""Where a local Ray that a command starts keeps its files (``slime_strands/_ray_session.py``), without starting
one: the folder is the run's own, short enough for Ray's Unix sockets; Ray writes no token in the home unless the
user's own is there (then it is used); a start that fails leaves no folder and the environment as it was. The
runs with a real Ray: tests/ray/test_ray_eval_cli.py and test_rollout_workers_eval.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slime_strands import _ray_session
from slime_strands.errors import ConfigurationError


class _RayThatFails:
    """Ray as far as ``join_ray`` calls it, whose start fails the way a broken install does."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def is_initialized(self) -> bool:
        return False

    def init(self, **kwargs: Any) -> None:
        self.calls.append({**kwargs, "token_path": os.environ.get("RAY_AUTH_TOKEN_PATH")})
        os.environ["RAY_AUTH_MODE"] = "token"  # what Ray's start sets before it fails
        raise RuntimeError("the raylet did not start")


@pytest.fixture
def temp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """RAY_TMPDIR: a short folder of the test's own (pytest's tmp_path is too long for Ray's sockets)."""
    path = Path(tempfile.mkdtemp(prefix="srs-", dir="/tmp"))
    monkeypatch.setenv("RAY_TMPDIR", str(path))
    yield path
    shutil.rmtree(path)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, temp: Path) -> Path:
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def test_a_start_that_fails_leaves_no_folder_and_the_environment_as_it_was(home: Path, temp: Path) -> None:
    ray = _RayThatFails()
    with pytest.raises(
        ConfigurationError, match=r"^cannot start or join a local Ray: RuntimeError: the raylet"
    ):
        _ray_session.join_ray(ray, ConfigurationError)
    [call] = ray.calls
    folder = Path(call["_temp_dir"])
    assert call["address"] == "local" and folder.parent == temp
    assert call["token_path"] == str(folder / "auth_token"), "Ray is given the run's own token, not ~/.ray's"
    assert not folder.exists() and list(temp.iterdir()) == []
    assert "RAY_AUTH_MODE" not in os.environ and "RAY_AUTH_TOKEN_PATH" not in os.environ
    assert list(home.iterdir()) == []


def test_the_users_own_token_is_used_and_left_alone(home: Path) -> None:
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text("the user's")
    ray = _RayThatFails()
    with pytest.raises(ConfigurationError):
        _ray_session.join_ray(ray, ConfigurationError)
    assert ray.calls[0]["token_path"] is None
    assert (home / ".ray" / "auth_token").read_text() == "the user's"


def test_a_cluster_at_ray_address_is_joined_in_no_folder_of_the_runs(
    home: Path, temp: Path, monkeypatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    ray = _RayThatFails()
    with pytest.raises(
        ConfigurationError, match=r"the Ray cluster at RAY_ADDRESS=10\.0\.0\.1:6379: .*unset RAY_ADDRESS"
    ):
        _ray_session.join_ray(ray, ConfigurationError)
    assert ray.calls[0]["address"] == "10.0.0.1:6379" and "_temp_dir" not in ray.calls[0]
    assert ray.calls[0]["token_path"] is None and list(temp.iterdir()) == []


def test_a_temp_dir_too_long_for_rays_sockets_gives_way_to_tmp(
    home: Path, tmp_path: Path, monkeypatch
) -> None:
    deep = tmp_path.joinpath(*["a-long-folder-name"] * 4)
    deep.mkdir(parents=True)
    monkeypatch.setenv("RAY_TMPDIR", str(deep))
    folder = Path(_ray_session._own_folder(ConfigurationError))
    try:
        assert folder.parent == Path("/tmp")
        socket = f"{folder}/session_2026-12-03_07-32-04_621262_4194304/sockets/plasma_store.99"
        assert len(socket.encode()) <= 107
    finally:
        folder.rmdir()
    assert list(deep.iterdir()) == []
