"""Joining Ray for a command run outside slime (``slime-strands eval`` with a Ray sandbox pool or rollout workers).

``RAY_ADDRESS``'s cluster is joined, else a new local Ray is started (never another cluster found on this
machine). A Ray this process starts keeps everything it writes in a folder of the run's own, made under the
system temp dir (``RAY_TMPDIR``, else ``TMPDIR``, else ``/tmp``): its session (logs, sockets) and, unless the
user has a token already, the auth token Ray would otherwise write in ``~/.ray/auth_token``. At the end that
folder is removed and the environment Ray's start changed is put back; nothing outside the folder is touched.
One line on stderr says where the session was and that it was removed, or, for a cluster joined, that it keeps
running with its session. Inside slime Ray is already initialised and nothing here runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["join_ray"]

logger = logging.getLogger(__name__)

_SOCKET_TAIL = len("/session_2026-12-03_07-32-04_621262_4194304/sockets/plasma_store.99")
"""The longest path Ray adds below its temp dir for a Unix socket (the session's name has the date and pid)."""
_SOCKET_LIMIT = 107
"""Linux's limit on a Unix socket's path (``sun_path`` less its terminating zero), which Ray checks."""
_TOKEN_ENV = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
_MODE_ENV = "RAY_AUTH_MODE"
_REMOVE_TRIES = 3


def join_ray(ray: Any, fail: Callable[[str], Exception]) -> Callable[[], None] | None:
    """Connect this process to Ray: ``RAY_ADDRESS``'s cluster, else a new local one in a folder of its own;
    None when it already is (inside slime). Returns what disconnects it: stops a Ray it started and removes
    that Ray's folder, or leaves the cluster it joined running. ``fail`` makes the error raised (with the
    message) when Ray does not start or the cluster cannot be joined."""
    if ray.is_initialized():
        return None
    address = os.environ.get("RAY_ADDRESS") or None
    if address:
        _init(ray, fail, address=address)
        logger.info("slime-strands: joined the Ray cluster at %s", address)
        return lambda: _leave_cluster(ray, address)
    folder = _own_folder(fail)
    saved = {name: os.environ.get(name) for name in (*_TOKEN_ENV, _MODE_ENV)}
    try:
        if _needs_token(saved):  # Ray would write one in ~/.ray: give it the run's own instead
            token = Path(folder, "auth_token")
            token.write_text(secrets.token_hex(32))
            token.chmod(0o600)
            os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
        _init(ray, fail, address="local", _temp_dir=folder)
    except BaseException:
        _restore(saved)
        shutil.rmtree(folder, ignore_errors=True)
        raise
    logger.info("slime-strands: started a local Ray in %s", folder)
    return lambda: _stop_local(ray, folder, saved)


def _init(ray: Any, fail: Callable[[str], Exception], **where: Any) -> None:
    address = where["address"]
    try:
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False, **where)
    except Exception as exc:
        if address == "local":
            what, fix = "a local Ray", "see Ray's log"
        else:
            what = f"the Ray cluster at RAY_ADDRESS={address}"
            fix = "check the address, or unset RAY_ADDRESS to start a local Ray"
        raise fail(f"cannot start or join {what}: {type(exc).__name__}: {exc}: {fix}") from None


def _own_folder(fail: Callable[[str], Exception]) -> str:
    """A new folder for a local Ray's files, short enough for its Unix sockets (else one under ``/tmp``)."""
    base = os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()
    error = ""
    for parent in dict.fromkeys((base, "/tmp")):
        if len(os.path.join(parent, "ss-ray-XXXXXXXX").encode()) + _SOCKET_TAIL <= _SOCKET_LIMIT:
            try:
                return tempfile.mkdtemp(prefix="ss-ray-", dir=parent)
            except OSError as exc:
                error = f"{type(exc).__name__}: {exc}"
        else:
            error = "its path is too long for Ray's Unix sockets (107 bytes)"
    raise fail(
        f"cannot start a local Ray: no folder for its session under {base}: {error}: set RAY_TMPDIR to a "
        "short writable folder"
    )


def _needs_token(env: dict[str, str | None]) -> bool:
    """Whether Ray's start would write a new token in ``~/.ray/auth_token``: token auth not disabled, and no
    token given, neither in the environment nor in that file."""
    if (env[_MODE_ENV] or "").lower() == "disabled" or any(env[name] for name in _TOKEN_ENV):
        return False
    return not (Path.home() / ".ray" / "auth_token").exists()


def _restore(saved: dict[str, str | None]) -> None:
    """The environment as it was before Ray's start (which sets ``RAY_AUTH_MODE``), and Ray's cached token
    forgotten, so a later start in this process reads the token it is given then."""
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    with contextlib.suppress(Exception):  # Ray's private API (2.5x): nothing to forget where it is not
        from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]

        AuthenticationTokenLoader.instance().reset_cache()


def _stop_local(ray: Any, folder: str, saved: dict[str, str | None]) -> None:
    sessions = sorted(p.name for p in Path(folder).glob("session_2*"))
    try:
        ray.shutdown()
    finally:
        _restore(saved)
        error = ""
        for attempt in range(_REMOVE_TRIES):  # a Ray process still exiting may write a last log line
            try:
                shutil.rmtree(folder)
            except FileNotFoundError:
                pass
            except OSError as exc:
                error = f"{type(exc).__name__}: {exc}"
            if not os.path.exists(folder):
                break
            time.sleep(0.2 * (attempt + 1))
        session = os.path.join(folder, sessions[-1]) if sessions else folder
        if os.path.exists(folder):
            _say(f"the local Ray this command started left its session in {session}: not removed ({error})")
        else:
            _say(f"the local Ray this command started kept its session in {session}: removed")


def _leave_cluster(ray: Any, address: str) -> None:
    session = ""
    with contextlib.suppress(Exception):  # Ray names it only in its private API
        session = f", with its session in {ray._private.worker._global_node.get_session_dir_path()}"
    ray.shutdown()
    _say(f"the Ray cluster at {address} was joined and is left running{session}")


def _say(line: str) -> None:
    print(f"ray: {line}", file=sys.stderr, flush=True)
