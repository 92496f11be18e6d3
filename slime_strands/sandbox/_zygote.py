"""The warm interpreter that runs INSIDE the sandbox (its source is passed to ``python -I -c``).

It imports the preload modules once, then serves JSON-line requests on stdin (JSON never contains a raw
newline, so a line is a frame): each run is a fresh ``fork`` (so no run sees another's state) that drops
to its own unprivileged uid (when the zygote is root), applies the rlimits, moves into a private temp dir
and executes the code with stdout / stderr on its own pipes. When the run ends or overruns, a process
with the run's uid sends SIGKILL to every process of that uid (``kill(-1)``), which catches setsid /
double-fork escapes and background children, and removes its System V IPC objects; then the output is
read (head + tail only), the temp dir and the uid's files in shared dirs removed. The control pipe is
closed in every child: a run cannot forge another run's result, and with its own uid it cannot signal
the zygote or other runs.

A run is the program of a freshly started interpreter, not a piece of the zygote: it starts with Python's
own signal state (the zygote's handlers would reach every process the run forks: a pool worker that
caught its pool's SIGTERM while starting lost it and hung the pool), runs as its own ``__main__`` module
(pickle finds its functions there; the processes multiprocessing's spawn and forkserver start import its
program file), and ends as Python ends a program: non-daemon threads joined, then the atexit functions
(which finish pools left open). The zygote itself stays single-threaded: a fork copies only the forking
thread, and a lock another thread held would stay locked in every run.

Only the standard library may be used here: this file is executed, not imported, in the sandbox.
"""

import atexit
import base64
import contextlib
import ctypes
import gc
import json
import linecache
import os
import resource
import select
import shutil
import signal
import stat
import sys
import tempfile
import time
import traceback
import types

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "ppc64le": 271, "s390x": 280}.get(
    os.uname().machine
)
_KEYCTL_JOIN_SESSION_KEYRING, _KEYCTL_CLEAR = 1, 7
_KEY_SPEC_USER_KEYRING, _KEY_SPEC_USER_SESSION_KEYRING = -4, -5
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_NOATIME, _MS_NODIRATIME, _MS_BIND, _MS_REC, _MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 21
_IPC_RMID = 0
# A run's directory holds its program (what spawn / forkserver children import) and its working directory.
_PROGRAM_FILE, _WORK_DIR = "main.py", "work"
_FIGURE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp")
_MAX_FIGURES, _MAX_FIGURE_BYTES = 4, 4 << 20
# The run's program as the processes multiprocessing's spawn and forkserver start import it (named
# __mp_main__, for the functions and classes their tasks name). As for a script, ``if __name__ ==
# "__main__":`` keeps what only the run should do from running there again; a program without that guard
# starts its pool there too, which multiprocessing refuses: the error ends that import (not the process,
# which CPython would end, and a Pool would replace forever) and what the program defined so far is kept.
_IMPORTED_PROGRAM = """\
__slime_strands_source__ = {source!r}
__import__("linecache").cache["<code>"] = (
    len(__slime_strands_source__), None, __slime_strands_source__.splitlines(True), "<code>"
)
try:
    exec(compile(__slime_strands_source__, "<code>", "exec"))
except BaseException:
    pass
del __slime_strands_source__
"""
# (signal, handler) as a freshly started interpreter has them: Python's own three, every other signal
# (but SIGKILL and SIGSTOP, which cannot be caught) at its default action.
_PYTHON_SIGNALS = {
    signal.SIGINT: signal.default_int_handler,
    signal.SIGPIPE: signal.SIG_IGN,
    signal.SIGXFSZ: signal.SIG_IGN,
}
_RUN_SIGNALS = [
    (int(number), _PYTHON_SIGNALS.get(number, signal.SIG_DFL))
    for number in sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP})
]
# Shared, writable places a run could leave state in for the next one: what its uid owns there is removed.
_SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
# System V IPC objects outlive their creator: (listing, owner uid columns, remover) removed per run uid.
_SYSV_IPC = (("shm", (7, 9), "shmctl"), ("msg", (7, 9), "msgctl"), ("sem", (4, 6), "semctl"))


def _prctl(option, value):
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


class _Capture:
    """One output pipe of a run: keeps the first and last ``limit / 2`` bytes, counts the rest."""

    def __init__(self, fd, limit):
        self.fd, self.half, self.total = fd, max(limit // 2, 1), 0
        self.head, self.tail = bytearray(), bytearray()
        os.set_blocking(fd, False)

    def pump(self):
        """Read what is available, at most 1 MiB (a run printing nonstop must not starve the others):
        "eof", "empty" (nothing more for now) or "more"."""
        for _ in range(16):
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return "empty"
            if not data:
                return "eof"
            self.total += len(data)
            room = self.half - len(self.head)
            if room > 0:
                self.head += data[:room]
                data = data[room:]
            self.tail += data
            if len(self.tail) > self.half:
                del self.tail[: len(self.tail) - self.half]
        return "more"

    def text(self):
        omitted = self.total - len(self.head) - len(self.tail)
        marker = f"\n... [{omitted} bytes of output omitted] ...\n".encode() if omitted else b""
        return (bytes(self.head) + marker + bytes(self.tail)).decode("utf-8", "replace")

    @property
    def truncated(self):
        return self.total > len(self.head) + len(self.tail)


def _keyctl(operation, argument):
    """The keyctl system call (glibc has no wrapper); nothing on an unknown architecture or under a
    seccomp policy that forbids it (then runs cannot use keyrings either)."""
    if _SYS_KEYCTL is None:
        return -1
    return ctypes.CDLL(None, use_errno=True).syscall(
        _SYS_KEYCTL, ctypes.c_long(operation), ctypes.c_long(argument), ctypes.c_long(0)
    )


def _has_user_keyrings(uid):
    """Whether ``uid``'s user keyrings exist: a run used them (looking them up would create them)."""
    names = {f"_uid.{uid}:", f"_uid_ses.{uid}:"}
    try:
        with open("/proc/keys") as listing:
            return any(names.intersection(line.split()) for line in listing)
    except OSError:
        return True


def _children():
    """Pids of this (single-threaded) process's children."""
    try:
        with open(f"/proc/self/task/{os.getpid()}/children") as listing:
            return {int(pid) for pid in listing.read().split()}
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: scan /proc
        found = set()
        for entry in os.scandir("/proc"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                if entry.name.isdigit():
                    with open(f"/proc/{entry.name}/stat") as stat:
                        if int(stat.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                            found.add(int(entry.name))
        return found


def _drop_capabilities():
    """Empty the bounding, effective, permitted and inheritable capability sets of this process."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    if libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _kill_uid(uid):
    """As ``uid`` (in a forked child), SIGKILL all its processes and remove its System V IPC objects."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            # kill(-1) signals every process we may signal under the tasklist lock; a fork racing it
            # fails once SIGKILL is pending, so two passes leave nothing of this uid alive.
            for _ in range(2):
                with contextlib.suppress(OSError):
                    os.kill(-1, signal.SIGKILL)
            _remove_ipc_of(uid)  # as the owner: no IPC capability needed
            if _has_user_keyrings(uid):  # keys persist per uid, for the next run of this uid
                for keyring in (_KEY_SPEC_USER_KEYRING, _KEY_SPEC_USER_SESSION_KEYRING):
                    _keyctl(_KEYCTL_CLEAR, keyring)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


class _Reaper:
    """A small process, forked before the preload imports, that runs ``_kill_uid`` on request: forking it
    costs a fifth of forking the server, whose page tables hold numpy and sympy."""

    def __init__(self):
        request_r, self.request_w = os.pipe()
        self.done_r, done_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.close(self.request_w)
                os.close(self.done_r)
                _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
                while len(data := os.read(request_r, 4)) == 4:
                    _kill_uid(int.from_bytes(data, "little"))
                    os.write(done_w, b".")
            finally:
                os._exit(0)
        os.close(request_r)
        os.close(done_w)

    def reap(self, uid):
        os.write(self.request_w, uid.to_bytes(4, "little"))
        if os.read(self.done_r, 1) != b".":
            raise OSError("the reaper exited")


def _remove_files_of(uid):
    """Delete the entries of the shared writable dirs that ``uid`` owns (its processes are all dead)."""
    for parent in _SHARED_DIRS:
        try:
            entries = list(os.scandir(parent))
        except OSError:
            continue
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)


def _remove_ipc_of(uid):
    """IPC_RMID the System V shared memory, message queues and semaphores ``uid`` owns or created."""
    libc = ctypes.CDLL(None, use_errno=True)
    for kind, columns, remover in _SYSV_IPC:
        try:
            with open(f"/proc/sysvipc/{kind}") as listing:
                rows = [line.split() for line in listing.readlines()[1:]]
        except OSError:
            continue
        for row in rows:
            if any(int(row[c]) == uid for c in columns if c < len(row)):
                if kind == "sem":
                    getattr(libc, remover)(int(row[1]), 0, _IPC_RMID)
                else:
                    getattr(libc, remover)(int(row[1]), _IPC_RMID, None)


def _mount(source, target, fstype, flags, data=None):
    libc = ctypes.CDLL(None, use_errno=True)
    encode = lambda value: value.encode() if value else None  # noqa: E731
    if libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        raise OSError(ctypes.get_errno(), f"mount {target!r} failed")


_SYSTEM_FILES = (
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/dev/null",
    "/dev/zero",
    "/dev/random",
    "/dev/urandom",
)
# Flags a bind mount's read-only remount must keep: in a user namespace the kernel refuses to clear the
# ones the host mount has (they are locked).
_KEPT_FLAGS = (
    (os.ST_NOSUID, _MS_NOSUID),
    (os.ST_NODEV, _MS_NODEV),
    (os.ST_NOEXEC, _MS_NOEXEC),
    (os.ST_NOATIME, _MS_NOATIME),
    (os.ST_NODIRATIME, _MS_NODIRATIME),
    (os.ST_RELATIME, _MS_RELATIME),
)


def _bind_readonly(fd, target):
    """Bind what ``fd`` (an O_PATH descriptor opened before the host path was hidden) refers to on
    ``target``, then make that mount read-only, nosuid and (for directories) nodev."""
    is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
    _mount(f"/proc/self/fd/{fd}", target, None, _MS_BIND | _MS_REC)
    flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | (_MS_NODEV if is_dir else 0)
    host_flags = os.statvfs(target).f_flag
    for host_flag, mount_flag in _KEPT_FLAGS:
        if host_flag & host_flags:
            flags |= mount_flag
    _mount(None, target, None, flags)


def _make_dirs(path):
    """``path`` and its missing parents, each traversable by every uid (whatever the umask)."""
    for directory in [*_ancestors(path), path]:
        if not os.path.isdir(directory):
            os.mkdir(directory)
            os.chmod(directory, 0o755)


def _enter_minimal_root(system_dirs, python_paths, tmp_mb):
    """bwrap's view for the unshare backend (we are root in our own mount namespace, of the host or of
    our own user namespace): a read-only tmpfs root with the system directories and the interpreter's own
    files bound read-only, a fresh /proc, a few devices, a private size-limited /tmp and /dev/shm; then
    chroot into it. Runs have no capability to leave a chroot.

    Every source is opened before anything is mounted over it: the root is assembled under a tmpfs on
    /tmp, and the interpreter itself may live under /tmp. The interpreter's files are bound after the
    private mounts, which would otherwise hide them (a virtualenv under /tmp or /dev/shm)."""
    sources = {}
    for path in [*system_dirs, *_SYSTEM_FILES, *python_paths]:
        if os.path.exists(path) and not (path in system_dirs and os.path.islink(path)):
            sources[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
    flags = _MS_NOSUID | _MS_NODEV
    _mount("tmpfs", "/tmp", "tmpfs", flags, "mode=0711,size=1m")  # a private mount point, nothing on the host
    new = "/tmp/root"
    os.mkdir(new)
    _mount("tmpfs", new, "tmpfs", flags, "mode=0755")

    def bind(path):
        target = new + path
        if stat.S_ISDIR(os.fstat(sources[path]).st_mode):
            _make_dirs(target)
        else:
            _make_dirs(os.path.dirname(target))
            open(target, "a").close()
        fd = sources.pop(path)
        _bind_readonly(fd, target)
        os.close(fd)

    for path in system_dirs:
        if os.path.islink(path):
            os.symlink(os.readlink(path), new + path)
        elif path in sources:
            bind(path)
    for path in _SYSTEM_FILES:
        if path in sources:
            bind(path)
    os.mkdir(new + "/proc")
    _mount("proc", new + "/proc", "proc", flags | _MS_NOEXEC)
    for path, mode in (("/tmp", "0711"), ("/dev/shm", "1777")):
        _make_dirs(new + path)
        _mount("tmpfs", new + path, "tmpfs", flags, f"mode={mode},size={tmp_mb}m")
    for path in python_paths:
        if path in sources:
            bind(path)
    for fd in sources.values():
        os.close(fd)
    _mount(None, new, None, _MS_REMOUNT | _MS_RDONLY | flags)  # the root tmpfs: nothing to write there
    os.chroot(new)
    os.chdir("/")


def _ancestors(path):
    """``/a``, ``/a/b``, ... up to ``path``'s parent (outermost first)."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


class Zygote:
    def __init__(self, config, reaper):
        self.reaper = reaper
        self.own_base = config["base_dir"] is None  # no private /tmp: a temp dir of ours, removed at exit
        self.base = tempfile.mkdtemp(prefix="slime-strands-sandbox-") if self.own_base else config["base_dir"]
        os.makedirs(self.base, 0o711, exist_ok=True)
        os.chmod(self.base, 0o711)
        self.uids = list(config["uids"])  # free per-run uids (none when not root)
        self.use_uids = bool(self.uids)
        self.waiting = []  # requests waiting for a free uid: never run as root instead
        self.runs = {}  # pid -> run info
        self.captures = {}  # pipe fd -> _Capture of a running run
        self.counter = 0
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.out = os.fdopen(os.dup(1), "w", buffering=1)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 1)  # stray prints can never reach the control channel
        os.close(devnull)
        for uid in self.uids + list(config.get("reap_uids", [])):  # leftovers of a dead predecessor
            self._reap_uid(uid)

    # -- requests ----------------------------------------------------------------------------

    def serve(self):
        try:
            self._serve()
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.waiting.clear()
            for pid in list(self.runs):
                self._finish(pid, killed=True)
            if self.own_base:
                shutil.rmtree(self.base, ignore_errors=True)

    def _serve(self):
        buffer = b""
        stdin = 0
        while True:
            timeout = None
            if self.runs:
                timeout = max(0.0, min(r["deadline"] for r in self.runs.values()) - time.monotonic())
            try:
                ready, _, _ = select.select([stdin, self.wake_r, *self.captures], [], [], timeout)
            except InterruptedError:
                ready = []
            for fd in ready:
                if fd in self.captures and self.captures[fd].pump() == "eof":
                    del self.captures[fd]  # the run's side is closed
            if self.wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 4096)
            if stdin in ready:
                chunk = os.read(stdin, 1 << 20)
                if not chunk:
                    break
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    request = json.loads(line)
                    if "cancel" in request:
                        self._cancel(request["cancel"])
                        continue
                    try:
                        self._start(request)
                    except OSError as exc:  # fork / mkdir refused (e.g. out of memory): this run fails
                        self.out.write(
                            json.dumps({"id": request["id"], "error": f"cannot start: {exc}"}) + "\n"
                        )
            self._collect()

    def _start(self, request):
        if self.use_uids and not self.uids:
            self.waiting.append(request)
            return
        self.counter += 1
        uid = self.uids.pop() if self.use_uids else None
        run_dir = os.path.join(self.base, f"run-{self.counter}")
        os.mkdir(run_dir, 0o700)  # the run's program file and its working directory (empty)
        os.mkdir(os.path.join(run_dir, _WORK_DIR), 0o700)
        if uid is not None:
            os.chown(run_dir, uid, uid)
            os.chown(os.path.join(run_dir, _WORK_DIR), uid, uid)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        sys.stderr.flush()
        self.out.flush()
        pid = os.fork()
        if pid == 0:
            self._child(request, run_dir, uid, out_w, err_w)
        os.close(out_w)
        os.close(err_w)
        limit = int(request["max_output_bytes"])
        captures = [_Capture(out_r, limit), _Capture(err_r, limit)]
        self.captures.update({c.fd: c for c in captures})
        self.runs[pid] = {
            "id": request["id"],
            "uid": uid,
            "dir": run_dir,
            "start": time.monotonic(),
            "deadline": time.monotonic() + float(request["timeout_s"]),
            "limits": request,
            "captures": captures,
        }

    def _cancel(self, request_id):
        """The host no longer waits for this request: kill its run (or drop it from the queue)."""
        self.waiting = [r for r in self.waiting if r["id"] != request_id]
        for pid, run in list(self.runs.items()):
            if run["id"] == request_id:
                self._finish(pid, killed=True)

    def _collect(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid in self.runs:
                self._finish(pid, status=status)
        now = time.monotonic()
        for pid, run in list(self.runs.items()):
            if now >= run["deadline"]:
                self._finish(pid, killed=True)

    def _finish(self, pid, status=None, killed=False):
        run = self.runs.pop(pid)
        duration = time.monotonic() - run["start"]
        if killed:  # a run stopped just after its fork may not have its uid or process group yet: kill(-1)
            with contextlib.suppress(ProcessLookupError):  # as that uid or killpg would miss it, waitpid hang
                os.kill(pid, signal.SIGKILL)
        if run["uid"] is not None:
            self._reap_uid(run["uid"])
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        if status is None:
            with contextlib.suppress(ChildProcessError):
                _, status = os.waitpid(pid, 0)
        if run["uid"] is None:
            self._kill_strays()
        for capture in run["captures"]:  # every writer is dead now: read to the end, then close
            while capture.pump() == "more":
                pass
            self.captures.pop(capture.fd, None)
            os.close(capture.fd)
        stdout, stderr = (c.text() for c in run["captures"])
        figures = _figures(os.path.join(run["dir"], _WORK_DIR)) if run["limits"].get("figures") else []
        shutil.rmtree(run["dir"], ignore_errors=True)
        if run["uid"] is not None:
            self.uids.append(run["uid"])
            if self.waiting:
                self._start(self.waiting.pop(0))
        result = {
            "id": run["id"],
            "stdout": stdout,
            "stderr": stderr,
            "truncated": any(c.truncated for c in run["captures"]),
            "timed_out": killed,
            "duration_s": duration,
            "exit_code": None,
            "signal": None,
        }
        if figures:
            result["figures"] = figures
        if status is not None and not killed:
            if os.WIFEXITED(status):
                result["exit_code"] = os.WEXITSTATUS(status)
            elif os.WIFSIGNALED(status):
                result["signal"] = os.WTERMSIG(status)
        self.out.write(json.dumps(result) + "\n")

    def _kill_strays(self):
        """Runs sharing our uid: what they left running outside their process group (setsid and
        double-fork daemons) is reparented to us, the subreaper, once its parent dies. Kill every child
        that is not a running run, then the children those leave behind, until none is left."""
        keep = set(self.runs) | ({self.reaper.pid} if self.reaper else set())
        for _ in range(64):
            strays = _children() - keep
            if not strays:
                return
            for pid in strays:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for pid in strays:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)

    def _reap_uid(self, uid):
        """SIGKILL every process of ``uid`` (the run and anything it spawned, detached or not), then remove
        what it left where the next run could find it (shared dirs, System V IPC objects)."""
        try:
            if self.reaper is None:
                raise OSError("no reaper")
            self.reaper.reap(uid)
        except OSError:
            self.reaper = None
            _kill_uid(uid)
        _remove_files_of(uid)

    # -- the run ---------------------------------------------------------------------------

    def _child(self, request, run_dir, uid, out, err):
        code = 1
        try:
            _reset_signals()  # first: the zygote's SIGTERM handler must never run in the run
            # Drop the zygote's references to other runs (their code and captured output) so this run
            # cannot reach them through Python objects.
            self.runs.clear()
            self.captures.clear()
            self.waiting.clear()
            os.setsid()
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(err, 2)
            os.closerange(3, 65536)  # the control pipe and everything else of the zygote's
            _limit(request)
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            else:  # root of a user namespace mapping no other uid: stay uid 0, but without capabilities
                _drop_capabilities()
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # after setuid, which clears it
            _prctl(_PR_SET_NO_NEW_PRIVS, 1)  # setuid binaries (mount, passwd, su...) run without privileges
            _keyctl(_KEYCTL_JOIN_SESSION_KEYRING, 0)  # not the interpreter's, which every run would share
            work = os.path.join(run_dir, _WORK_DIR)
            os.chdir(work)
            os.environ["HOME"] = os.environ["TMPDIR"] = work
            _open_standard_streams()
            sys.argv = ["<code>"]
            _reset_module_state(work)
            code = _run_as_main(request["code"], os.path.join(run_dir, _PROGRAM_FILE))
            _end_like_python()
        finally:
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)


def _figures(work):
    """The image files a finished run saved in its working directory (its figures), each as a name and base64
    bytes: regular files only (never through a symlink), at most _MAX_FIGURES of _MAX_FIGURE_BYTES each, by
    name. Every process of the run is dead: the files no longer change."""
    found = []
    try:
        names = sorted(n for n in os.listdir(work) if n.lower().endswith(_FIGURE_SUFFIXES))
    except OSError:
        return found
    for name in names[:_MAX_FIGURES]:
        try:
            fd = os.open(os.path.join(work, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_FIGURE_BYTES:
                continue
            data = os.read(fd, _MAX_FIGURE_BYTES + 1)
        except OSError:
            continue
        finally:
            os.close(fd)
        if data and len(data) <= _MAX_FIGURE_BYTES:
            found.append({"name": name, "data": base64.b64encode(data).decode("ascii")})
    return found


def _limit(request):
    """The run's rlimits (inherited by every process it starts)."""
    mb, cpu = 1 << 20, int(request["cpu_seconds"])
    # CPU: SIGXCPU at the limit (reported as such), SIGKILL a second later if the code catches it.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    for name, value in (
        ("RLIMIT_AS", int(request["memory_mb"]) * mb),
        ("RLIMIT_FSIZE", int(request["file_size_mb"]) * mb),
        ("RLIMIT_NPROC", int(request["max_processes"])),
        ("RLIMIT_CORE", 0),
        ("RLIMIT_MSGQUEUE", 0),  # POSIX message queues would outlive the run
        ("RLIMIT_NOFILE", 1024),  # open files cost kernel memory no other limit counts
    ):
        resource.setrlimit(getattr(resource, name), (value, value))


def _reset_signals():
    """The signal state a freshly started interpreter has: every signal at its default action but the
    three Python sets, nothing blocked, no wakeup fd. The zygote's handlers must reach neither the run nor
    what it forks: a pool worker whose inherited SIGTERM handler caught ``terminate()``'s SIGTERM while
    it was still starting lost it (Python discards what its handlers caught before the child's fork
    bookkeeping ends, and only prints an exception raised in an at-fork hook), and the pool joined that
    worker forever. Nor the dispositions and the mask the zygote got from whatever started it."""
    signal.set_wakeup_fd(-1)
    for number, handler in _RUN_SIGNALS:  # each: Python may not know a disposition C code set
        with contextlib.suppress(OSError):
            signal.signal(number, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _open_standard_streams():
    """The run's own ``sys.stdin`` / ``stdout`` / ``stderr`` on fds 0-2, which ``sys.__stdin__`` & co. are
    too (as in a freshly started interpreter): the zygote's would keep what the run writes to them in
    buffers no one flushes."""
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        stream = open(fd, "w" if fd else "r", closefd=False)  # noqa: SIM115
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _reset_module_state(work):
    """What preloaded modules computed for the zygote and would hand every run alike."""
    tempfile.tempdir = None  # cached from the zygote's environment; the run's TMPDIR is its own directory
    process = sys.modules.get("multiprocessing.process")
    if process is not None:  # its own key for Manager / Listener authentication, its own start directory
        process.current_process().authkey = os.urandom(32)
        process.ORIGINAL_DIR = work
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:  # the global generator, seeded once in the zygote: the same in every run
        numpy_random.seed()


def _run_as_main(source, program_file):
    """Execute ``source`` as a program's ``__main__`` module (a module of its own, not the zygote's) and
    return the exit code. Pickle finds the program's functions and classes there by name (pool tasks);
    the processes multiprocessing's ``spawn`` and ``forkserver`` start import ``__file__`` to find them
    too. Tracebacks name the code ``<code>`` and show its lines."""
    module = types.ModuleType("__main__")
    module.__builtins__ = __builtins__
    try:
        with open(program_file, "x", encoding="utf-8") as program:
            program.write(_IMPORTED_PROGRAM.format(source=source))
        module.__file__ = program_file
    except (OSError, ValueError):  # no room, or text UTF-8 cannot encode: only spawn children miss it
        pass
    sys.modules["__main__"] = module
    linecache.cache["<code>"] = (len(source), None, source.splitlines(True), "<code>")
    try:
        exec(compile(source, "<code>", "exec"), module.__dict__)
        return 0
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # without this file's frame; the last 50 of a deep recursion
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next, limit=-50)
        return 137 if isinstance(exc, MemoryError) else 1


def _end_like_python():
    """What the interpreter does when a program ends, before the process exits: wait for the threads that
    are not daemons (threading's exit hooks first: concurrent.futures finishes its pools' work there),
    then call the atexit functions (multiprocessing terminates the pools left open and joins its
    children there). Errors are printed and ignored, as the interpreter does."""
    shutdown = getattr(sys.modules.get("threading"), "_shutdown", None)  # no threading: none to wait for
    if shutdown is not None:
        try:
            shutdown()
        except BaseException:
            traceback.print_exc()
    atexit._run_exitfuncs()


def _read_line(fd):
    """One line from ``fd`` without buffering past it (the rest belongs to select())."""
    data = b""
    while not data.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            raise SystemExit(0)
        data += byte
    return data


def _keep():
    """Without namespaces nothing kills the runs if the serving process is SIGKILLed (as asyncio does to a
    subprocess it garbage-collects): the process the host sees is this keeper, which only waits, and the
    server it forks gets SIGTERM when the keeper dies, so it can still kill its runs and remove their files.
    Returns in the server."""
    keeper = os.getpid()
    pid = os.fork()
    if pid == 0:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != keeper:  # died before the prctl
            os._exit(0)
        return
    os.close(0)
    os.close(1)  # the server alone holds the channel: the host sees EOF when the server is gone

    def stop(*_):  # the host closing us: let the server clean up, but kill it if it is hung or stopped
        os.kill(pid, signal.SIGTERM)
        signal.signal(signal.SIGALRM, lambda *_: os.kill(pid, signal.SIGKILL))
        signal.alarm(1)

    signal.signal(signal.SIGTERM, stop)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def main():
    config = json.loads(_read_line(0))
    os.environ.update({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    # Host gone or closing us: SIGTERM unwinds serve(), which kills the runs and removes their files.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if config.get("keeper"):
        _keep()
    _keyctl(_KEYCTL_JOIN_SESSION_KEYRING, 0)  # drop the host's session keyring (and any keys in it)
    # Not dumpable: a run of the same uid (no root) cannot ptrace us or open our fds via /proc (the control
    # pipe); runs inherit it (with root they are non-dumpable anyway after setuid).
    _prctl(_PR_SET_DUMPABLE, 0)
    # Under bwrap / unshare the launcher's death kills the whole pid namespace (``--kill-child`` is a
    # SIGKILL parent-death signal, which must not be weakened to SIGTERM: a hung server would survive).
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    private_tmp = config.get("private_tmp")
    if private_tmp == "chroot":  # unshare: build bwrap's view ourselves, before importing anything more
        _enter_minimal_root(config["system_dirs"], config["python_paths"], int(config["tmp_size_mb"]))
    elif private_tmp == "chmod":  # bwrap's tmpfs: runs write only in their own directory
        os.chmod("/tmp", 0o711)
    reaper = _Reaper() if config["uids"] else None
    loaded = []
    for name in config.get("preload", []):
        try:
            __import__(name)
            loaded.append(name)
        except Exception:
            pass
    gc.freeze()  # runs' garbage collections skip (and so do not copy) the preloaded modules' objects
    zygote = Zygote(config, reaper)
    stdlib = os.path.dirname(os.__file__)
    private = any(not os.stat(p).st_mode & 0o001 for p in _ancestors(stdlib + "/os.py"))
    ready = {"ready": True, "preloaded": loaded, "base_dir": zygote.base, "stdlib_private": private}
    zygote.out.write(json.dumps(ready) + "\n")
    zygote.serve()


if __name__ == "__main__":
    main()
