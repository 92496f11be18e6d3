"""How the warm interpreter is started for each isolation backend.

``bwrap``: bubblewrap with its own pid / net / ipc / uts namespaces, the system and Python read-only, a
private tmpfs ``/tmp``, no host home or project files, dying with its parent. ``unshare``: util-linux
``unshare`` with its own pid / net / ipc / uts / mount namespaces, in which the interpreter builds the same
minimal read-only root and chroots into it (as root). ``limits``: no namespaces at all (rlimits, run
uid, scrubbed environment, ``-I`` and a private temp dir only). Every backend runs each snippet as an
unprivileged uid when we are root.
"""

from __future__ import annotations

import functools
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

__all__ = ["BACKENDS", "command", "python_roots", "sandbox_env"]

BACKENDS = ("bwrap", "unshare", "limits")
_ZYGOTE_SOURCE = (Path(__file__).with_name("_zygote.py")).read_text()
# Only what the zygote needs from root: switching the run's uid, owning and cleaning its files.
_BWRAP_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER")


def sandbox_env() -> dict[str, str]:
    """The whole environment the sandbox gets: nothing from the host (no tokens, no keys)."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def python_roots() -> list[str]:
    """Directories the interpreter and its site-packages live in (bound read-only into bwrap)."""
    candidates = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
    }
    candidates.update(site.getsitepackages())
    roots: list[str] = []
    for path in sorted({os.path.realpath(p) for p in candidates if p and os.path.isdir(p)}):
        if path.startswith(("/usr/", "/bin", "/lib")) or any(path.startswith(r + "/") for r in roots):
            continue
        roots.append(path)
    return roots


@functools.cache
def _bwrap_has_size(bwrap: str) -> bool:
    """``--size`` for tmpfs arrived in bubblewrap 0.7; older ones get an unbounded /tmp rather than none."""
    try:
        help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "--size" in help_text


def _bwrap_args(bwrap: str, root: bool, tmp_bytes: int) -> list[str]:
    args = [bwrap, "--die-with-parent", "--new-session"]
    if root:
        args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        for cap in _BWRAP_CAPS:
            args += ["--cap-add", cap]
    else:
        args += ["--unshare-all"]
    args += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for etc in ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives"):
        args += ["--ro-bind-try", etc, etc]
    roots = python_roots()
    for parent in sorted({str(p) for r in roots for p in Path(r).parents if str(p) != "/"}):
        args += ["--perms", "0755", "--dir", parent]  # traversable by the run uid (e.g. /root for pyenv)
    for path in roots:
        args += ["--ro-bind", path, path]
    size = ["--size", str(tmp_bytes)] if _bwrap_has_size(bwrap) else []
    args += ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", "/tmp"]
    args += ["--perms", "1777", *size, "--tmpfs", "/dev/shm"]  # POSIX semaphores (multiprocessing)
    args += ["--chdir", "/tmp", "--"]
    return args


def command(backend: str, *, root: bool, tmp_mb: int = 1024) -> list[str] | None:
    """argv that starts the zygote under ``backend``; None if the tool it needs is not installed."""
    python = [sys.executable, "-I", "-c", _ZYGOTE_SOURCE]
    if backend == "bwrap":
        bwrap = shutil.which("bwrap")
        return _bwrap_args(bwrap, root, tmp_mb << 20) + python if bwrap else None
    if backend == "unshare":
        unshare = shutil.which("unshare")
        if not unshare:
            return None
        user = [] if root else ["--user", "--map-root-user"]
        flags = ["--net", "--pid", "--fork", "--mount-proc", "--ipc", "--uts", "--kill-child"]
        return [unshare, *user, *flags, "--", *python]
    if backend == "limits":
        return python
    raise ValueError(f"unknown sandbox backend {backend!r}")
