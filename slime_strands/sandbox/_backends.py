"""How the warm interpreter is started for each isolation backend.

``bwrap``: bubblewrap with its own pid / net / ipc / uts (and, without root, user) namespaces and a
read-only tmpfs root holding only the system directories, the Python interpreter's own files (read-only) and
a private tmpfs ``/tmp`` and ``/dev/shm``: no host home, no project, no host ``/tmp``; it dies with its
parent. ``unshare``: util-linux ``unshare`` with its own pid / net / ipc / uts / mount (and, without root,
user) namespaces, in which the interpreter builds the same view itself and chroots into it. ``limits``: no
namespaces at all (rlimits, run uid, scrubbed environment, ``-I`` and a private temp dir only): chosen only
when the settings say so. Every backend runs each snippet as an unprivileged uid when we are root.

The interpreter's files are bound AFTER the private mounts, at the paths the host sees them: a virtualenv
under ``/tmp`` or ``/dev/shm`` would otherwise be hidden by the private tmpfs mounted over it.
"""

from __future__ import annotations

import functools
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigurationError

__all__ = [
    "BACKENDS",
    "CHOICES",
    "ISOLATING",
    "SYSTEM_DIRS",
    "IsolationBackend",
    "command",
    "python_paths",
    "sandbox_env",
]
_ZYGOTE_SOURCE = (Path(__file__).with_name("_zygote.py")).read_text()
# Only what the zygote needs from root: switching the run's uid, owning and cleaning its files.
_BWRAP_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER")
# Bound whole (read-only) by every isolating backend, at the same place: what any program needs to run.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")


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


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _in_system_dirs(path: str) -> bool:
    """Whether ``path`` is already visible through a bound system directory (at the same place). Not its
    target: a virtualenv's ``bin/python`` links to ``/usr/bin/python3`` but must exist where it is."""
    return any(_within(path, d) for d in SYSTEM_DIRS)


def python_paths() -> list[str]:
    """Host files and directories the interpreter needs, to be bound read-only at the same paths.

    Only the interpreter's own files: the executable as it is started (a virtualenv's ``bin/python`` is a
    symlink: the bind shows the real binary there), the virtualenv's ``pyvenv.cfg`` (how Python knows it is
    one) and its site-packages, the base installation's standard library, extension modules and library
    directory (``libpython``; a conda environment's shared libraries). Never a whole prefix: a Python
    installed in a home directory must not expose it. Paths are not resolved: inside, Python computes its
    paths from the same strings the host's did."""
    paths = {sys.executable}
    if sys.prefix != sys.base_prefix:
        paths.add(os.path.join(sys.prefix, "pyvenv.cfg"))
    paths.add(sysconfig.get_paths()["stdlib"])
    paths.add(sysconfig.get_config_var("DESTSHARED") or "")  # lib-dynload
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    if _within(os.path.realpath(libdir), os.path.realpath(sys.base_prefix)):
        paths.add(libdir)
    paths.update(site.getsitepackages())
    found = sorted({os.path.abspath(p) for p in paths if p and os.path.exists(p)})
    kept: list[str] = []
    for path in found:  # sorted: a directory comes before what it contains
        if not _in_system_dirs(path) and not any(_within(path, k) for k in kept):
            kept.append(path)
    return kept


def _ancestors(paths: list[str]) -> list[str]:
    """The directories above ``paths`` (outermost first, ``/`` excluded): made traversable (0755) in the
    sandbox's own root, whatever their mode on the host (``/root`` is 0700)."""
    found = {str(parent) for path in paths for parent in Path(path).parents if str(parent) != "/"}
    return sorted(found, key=lambda p: (p.count("/"), p))


@functools.cache
def _bwrap_help(bwrap: str) -> str:
    try:
        return subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _bwrap_has_size(bwrap: str) -> bool:
    """``--size`` for tmpfs arrived in bubblewrap 0.7; older ones get an unbounded /tmp rather than none."""
    return "--size" in _bwrap_help(bwrap)


def _bwrap_args(bwrap: str, root: bool, tmp_bytes: int) -> list[str]:
    args = [bwrap, "--die-with-parent", "--new-session"]
    # The interpreter is the pid namespace's init, as under unshare: without --as-pid-1, bwrap's own init is
    # pid 1, holding the host's control pipes on fds 0-2, and dumpable. Without root every run has that init's
    # uid, so a run could open /proc/1/fd/0 and /proc/1/fd/1 and write into the channel between the host and
    # the interpreter (another run's request, a forged reply, garbage that ends the interpreter).
    if "--as-pid-1" in _bwrap_help(bwrap):
        args.append("--as-pid-1")
    if root:
        args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        for cap in _BWRAP_CAPS:
            args += ["--cap-add", cap]
    else:
        args += ["--unshare-all"]
    args += ["--ro-bind", "/usr", "/usr"]
    for top in SYSTEM_DIRS[1:]:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for etc in ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives"):
        args += ["--ro-bind-try", etc, etc]
    # The private mounts first: what is bound later on top of them stays visible.
    size = ["--size", str(tmp_bytes)] if _bwrap_has_size(bwrap) else []
    args += ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", "/tmp"]
    args += ["--perms", "1777", *size, "--tmpfs", "/dev/shm"]  # POSIX semaphores (multiprocessing)
    paths = python_paths()
    for parent in _ancestors(paths):  # an existing directory (/tmp, /dev/shm) keeps its mode
        args += ["--perms", "0755", "--dir", parent]
    for path in paths:
        args += ["--ro-bind", path, path]
    args += ["--remount-ro", "/", "--chdir", "/tmp", "--"]  # the root tmpfs: nothing to write there
    return args


def _unshare_args(root: bool) -> list[str] | None:
    unshare = shutil.which("unshare")
    if not unshare:
        return None
    user = [] if root else ["--user", "--map-root-user"]
    flags = ["--mount", "--net", "--pid", "--fork", "--mount-proc", "--ipc", "--uts", "--kill-child"]
    return [unshare, *user, *flags, "--"]


def _bwrap_launcher(root: bool, tmp_bytes: int) -> list[str] | None:
    bwrap = shutil.which("bwrap")
    return _bwrap_args(bwrap, root, tmp_bytes) if bwrap else None


@dataclass(frozen=True)
class IsolationBackend:
    """One way to start the warm interpreter, and what that way leaves the interpreter to do itself.

    The sandbox reads these attributes, never the name: ``isolating`` (namespaces: without them the
    interpreter runs under a keeper that kills what it forked, reaps the uids of dead interpreters, and every
    start warns), ``private_tmp`` (how the interpreter gets its private ``/tmp``)."""

    name: str
    isolating: bool
    private_tmp: str | None
    """``chmod``: bwrap mounted it, the interpreter sets its mode; ``chroot``: the interpreter builds its view
    and chroots into it; None: no namespace, a host temp dir the interpreter makes and removes."""
    _launcher: Callable[[bool, int], list[str] | None] = field(repr=False)

    def command(self, *, root: bool, tmp_mb: int = 1024) -> list[str] | None:
        """argv that starts the zygote under this backend; None if the tool it needs is not installed."""
        launcher = self._launcher(root, tmp_mb << 20)
        if launcher is None:
            return None
        return [*launcher, sys.executable, "-I", "-c", _ZYGOTE_SOURCE]


BWRAP = IsolationBackend("bwrap", isolating=True, private_tmp="chmod", _launcher=_bwrap_launcher)
UNSHARE = IsolationBackend(
    "unshare", isolating=True, private_tmp="chroot", _launcher=lambda root, _: _unshare_args(root)
)
LIMITS = IsolationBackend("limits", isolating=False, private_tmp=None, _launcher=lambda _root, _tmp: [])

BACKENDS = {backend.name: backend for backend in (BWRAP, UNSHARE, LIMITS)}
"""The isolation backends, by the name the settings give them."""
ISOLATING = tuple(name for name, backend in BACKENDS.items() if backend.isolating)
"""The backends ``auto`` chooses from: running without namespaces must be asked for (``limits``)."""
CHOICES: dict[str, tuple[IsolationBackend, ...]] = {
    "auto": tuple(BACKENDS[name] for name in ISOLATING),
    **{name: (backend,) for name, backend in BACKENDS.items()},
}
"""``sandbox.backend`` values a warm interpreter serves -> the backends tried, in order."""


def command(backend: str, *, root: bool, tmp_mb: int = 1024) -> list[str] | None:
    """argv that starts the zygote under the backend named ``backend``; None if its tool is not installed."""
    found = BACKENDS.get(backend)
    if found is None:
        raise ConfigurationError(f"unknown sandbox backend {backend!r} ({', '.join(BACKENDS)})")
    return found.command(root=root, tmp_mb=tmp_mb)
